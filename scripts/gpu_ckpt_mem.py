"""Where the memory of a micro-batch-1 LoRA step goes, with and without activation checkpointing.

usage: python scripts/gpu_ckpt_mem.py VARIANT [OUT.jsonl] [all|python]

Full-depth Llama-3.2-1B (random init), LoRA r=8 on query+value, dropout 0.05, bf16 weights, one sample of 512 tokens
(the recipe's longest micro-batch at max_seq_length 512, where its peak is), CUDA graphs off. Prints the step's peak
over the memory held before it (weights, LoRA state, optimizer state) and, for the lit-liger variants, the biggest
blocks alive at the peak with the lit-liger/litgpt frames that allocated them (memory-history replay).

Variants: ``stock`` (LitGPT, its chunked_cross_entropy), ``liger``, ``ckpt`` (activation_checkpointing),
``ckpt-lean`` (+ flce_mode lean), ``ckpt-rows256`` / ``ckpt-rows128`` (the fused loss's logits chunk capped at that
many rows: kernels.fused_linear_cross_entropy._FAST_CHUNK_BYTES shrunk).
"""
import importlib
import json
import sys

import torch

v = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else None
STACKS = sys.argv[3] if len(sys.argv) > 3 else "all"  # "python": Python frames only
MiB = 1 << 20

from _diag_common import group_at_peak, live_at_peak, lora_llama_1b  # noqa: E402
from litgpt.utils import chunked_cross_entropy as stock_ce  # noqa: E402

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy  # noqa: E402

F = importlib.import_module("lit_liger.kernels.fused_linear_cross_entropy")  # the module (`import ... as` gives the
# package's attribute of that name: the function)

cfg, m = lora_llama_1b()
liger = v != "stock"
if v.startswith("ckpt-rows"):
    F._FAST_CHUNK_BYTES = int(v.removeprefix("ckpt-rows")) * cfg.padded_vocab_size * 2
    F._FAST_MIN_ROWS = 1  # (since h100-2026-11-24h the GPU default is at least 2048 rows a chunk)
if liger:
    apply_liger(m, LigerConfig(cuda_graphs=False, activation_checkpointing=v.startswith("ckpt"),
                               flce_mode="lean" if v.endswith("lean") else "fast"))
ce = chunked_cross_entropy if liger else stock_ce
params = [p for p in m.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=2e-4)
x = torch.randint(0, cfg.padded_vocab_size, (1, 512), device="cuda")
y = torch.randint(0, cfg.padded_vocab_size, (1, 512), device="cuda")


def step_like_litgpt():
    logits = m(x)
    loss = ce(logits[..., :-1, :], y[..., 1:])
    loss.backward()


for _ in range(3):
    step_like_litgpt()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
torch.cuda.empty_cache()
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
step_like_litgpt()
torch.cuda.synchronize()
peak = torch.cuda.max_memory_allocated()
res = {"variant": v, "base_MiB": round(base / MiB, 1), "step_peak_over_base_MiB": round((peak - base) / MiB, 1),
       "peak_GB": round(peak / 1e9, 3), "grads_MiB": round(sum(p.numel() * p.element_size() for p in params) / MiB, 1)}
opt.zero_grad(set_to_none=True)

print(json.dumps(res))
if liger:
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=400000, stacks=STACKS)
    try:
        step_like_litgpt()
    except BaseException:  # (once seen: a SystemError from autograd.Function.apply under the history's stacks)
        import traceback

        traceback.print_exc()
        raise
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    best, at_peak = live_at_peak(snap["device_traces"][0])
    res["trace_peak_over_start_MiB"] = round(best / MiB, 1)
    res["live_at_peak"] = group_at_peak(at_peak)
print(json.dumps(res, indent=1))
if out:
    with open(out, "a") as f:
        f.write(json.dumps(res) + "\n")
