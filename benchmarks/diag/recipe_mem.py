"""Memory and time of one LoRA fine-tuning loop on Alpaca-shaped lengths, one variant per process.

usage: python -m benchmarks diag recipe-mem VARIANT B [ITERS] [OUT.json]

Full-depth Llama-3.2-1B (random init), LoRA r=8 on query+value, dropout 0.05, bf16 weights, max_seq_length 512,
AdamW every 16/B micro-batches; each micro-batch's length is its longest sample's, samples lognormal as in
``benchmarks/recipe.py`` (median ~210 tokens). Not litgpt's script (no data loader, no logging): a harness for
comparing the graphs' memory settings and torch.compile on the same lengths.

Variants: ``stock`` (LitGPT, its chunked_cross_entropy), ``nog`` (lit-liger, cuda_graphs off), ``g0`` (graphs,
neither memory setting), ``gpool`` (WARMUP_IN_POOL: the default), ``ggrow`` (RECAPTURE_ON_GROWTH, off by default),
``gboth`` (both), ``compile`` (stock under torch.compile), ``liger+compile``.
"""
import json
import random
import statistics
import sys
import time

import torch

v, B = sys.argv[1], int(sys.argv[2])
iters = int(sys.argv[3]) if len(sys.argv) > 3 else 64
out = sys.argv[4] if len(sys.argv) > 4 else None

from litgpt.utils import chunked_cross_entropy as stock_ce  # noqa: E402

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy  # noqa: E402
from lit_liger.runtime import graphs as G  # noqa: E402

from ._common import alpaca_length, lora_llama_1b  # noqa: E402

G.WARMUP_IN_POOL = v in ("gpool", "gboth")
G.RECAPTURE_ON_GROWTH = v in ("ggrow", "gboth")
cfg, m = lora_llama_1b()
liger = v not in ("stock", "compile")
if liger:
    lc = LigerConfig(cuda_graphs=v.startswith("g"))
    apply_liger(m, lc)
fwd = torch.compile(m) if "compile" in v else m
ce = chunked_cross_entropy if liger else stock_ce
params = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=2e-4)
rng = random.Random(0)


def length() -> int:
    return alpaca_length(rng, 512)


accum = max(1, 16 // B)
times, lens = [], []
torch.cuda.empty_cache()  # the fp32 model built before the cast to bf16 is not part of the loop's memory
torch.cuda.reset_peak_memory_stats()
t_all = time.perf_counter()
for i in range(iters):
    T = max(length() for _ in range(B))
    lens.append(T)
    x = torch.randint(0, cfg.padded_vocab_size, (B, T), device="cuda")
    y = torch.randint(0, cfg.padded_vocab_size, (B, T), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = fwd(x)
    loss = ce(logits[..., :-1, :], y[..., 1:])
    (loss / accum).backward()
    if (i + 1) % accum == 0:
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    if times[-1] > 1.0:  # a compile / capture: shown as it happens (a run cut short by a timeout still tells)
        print(f"iteration {i} (T {T}): {times[-1]:.1f} s, {time.perf_counter() - t_all:.0f} s since the start",
              file=sys.stderr, flush=True)
t_all = time.perf_counter() - t_all
pools: dict[str, list[int]] = {}
for seg in torch.cuda.memory_snapshot():
    key = f"pool{tuple(seg.get('segment_pool_id', (0, 0)))} stream{seg.get('stream', 0)}"
    acc = pools.setdefault(key, [0, 0])
    acc[0] += seg["total_size"]
    acc[1] += seg["allocated_size"]
r = G.runner_for(m) if liger else None
warm = times[8:]
res = {"variant": v, "B": B, "iters": iters, "tokens": sum(lens) * B,
       "ms_p50": 1e3 * statistics.median(warm), "ms_mean": 1e3 * statistics.fmean(warm), "s_total": t_all,
       "ms_first8": [round(1e3 * t, 1) for t in times[:8]],
       # compiles / captures: the iterations over 3x the median, (index, length, ms)
       "slow_iters": [(i, lens[i], round(1e3 * t, 1)) for i, t in enumerate(times) if t > 3 * statistics.median(times)],
       "max_alloc_gb": torch.cuda.max_memory_allocated() / 1e9, "max_reserved_gb": torch.cuda.max_memory_reserved() / 1e9,
       "end_reserved_gb": torch.cuda.memory_reserved() / 1e9,
       "segments_gb": {k: [round(total / 1e9, 3), round(used / 1e9, 3)] for k, (total, used) in pools.items()},
       "captures": r.captures if r else None, "replays": r.replays if r else None,
       "regrown": getattr(r, "regrown", None) if r else None, "graphs": len(r.graphs) if r else None,
       "disabled": r.disabled if r else None}
print(json.dumps(res))
if out:
    with open(out, "a") as f:
        f.write(json.dumps(res) + "\n")
