"""Where the peak of a sliding-window training step goes: Mistral-7B-v0.1's shape at reduced depth (issue 15's
memory target, <= 0.75x stock torch.compile's peak).

usage: python -m benchmarks diag window-mem OUT.jsonl [N_LAYER] [VARIANT ...]

The step is ``benchmarks step``'s (random init, bf16 weights, fused AdamW, B 4, T 2048, window 1024, grads set to
None between steps). Per variant: the median step time of 10 steps, max_memory_allocated over them (the benchmark's
"peak GiB"), the peak's phase (forward or backward), and the biggest blocks alive at the peak with the frames that
allocated them (memory-history replay of one more step). Stock torch.compile is not run here (its warm-up at 2
layers takes ~260 s): its peak comes from ``benchmarks step`` (h100-2026-11-24g/step-mistral-2L-compile: 7.51 GiB).

Variants: ``eager`` (stock LitGPT, anchors this script to the benchmark's 8.90 GiB), ``liger`` (defaults),
``lean`` (flce_mode lean), ``ckpt`` (activation_checkpointing), ``ckpt-lean``, ``recompute`` (recompute_mlp),
``recompute-lean``; a ``-compile`` suffix runs the variant's model under ``torch.compile`` (``liger-compile``,
``recompute-compile``: where compile on top adds to lit-liger's peak; inductor's generated code shows as
``torchinductor`` frames).
"""
import json
import statistics
import sys

import torch

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy

from ..step import _optimizer, build_model, make_batch, model_config
from ._common import group_at_peak, live_at_peak

out = sys.argv[1]
n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 2
variants = sys.argv[3:] or ["eager", "liger", "lean", "ckpt", "ckpt-lean"]
GiB, MiB = 1 << 30, 1 << 20
B, T = 4, 2048


def run(v):
    from litgpt.utils import chunked_cross_entropy as stock_ce

    config, _ = model_config("Mistral-7B-v0.1", tiny=False, seq_len=T, stock=False, n_layer=n_layer,
                             sliding_window_size=1024)
    model = build_model(config, seq_len=T, dtype=torch.bfloat16, seed=1234)
    compiled = v.endswith("-compile")
    v_base = v.removesuffix("-compile")
    if v_base != "eager":
        apply_liger(model, LigerConfig(flce_mode="lean" if v_base.endswith("lean") else "fast",
                                       activation_checkpointing=v_base.startswith("ckpt"),
                                       recompute_mlp=v_base.startswith("recompute")))
    ce = stock_ce if v_base == "eager" else chunked_cross_entropy
    fwd = torch.compile(model) if compiled else model
    opt = _optimizer(model)
    x, y = make_batch(config, B, T, 1234)
    marks = {}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = ce(fwd(x), y)
        marks["fwd"] = torch.cuda.max_memory_allocated()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
    for s, e in ev:
        s.record()
        step()
        e.record()
    torch.cuda.synchronize()
    res = {"variant": v, "n_layer": n_layer, "step_ms": round(statistics.median(s.elapsed_time(e) for s, e in ev), 2),
           "peak_GiB": round(torch.cuda.max_memory_allocated() / GiB, 3)}
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    res["fwd_peak_GiB"] = round(marks["fwd"] / GiB, 3)
    res["step_peak_GiB"] = round(torch.cuda.max_memory_allocated() / GiB, 3)
    res["held_between_steps_GiB"] = round(torch.cuda.memory_allocated() / GiB, 3)
    torch.cuda.memory._record_memory_history(max_entries=400000, stacks="python")
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    best, at_peak = live_at_peak(snap["device_traces"][0])
    res["trace_peak_over_start_MiB"] = round(best / MiB, 1)
    res["live_at_peak"] = group_at_peak(at_peak, ("lit_liger", "kernels/", "litgpt", "checkpoint", "optim",
                                                  "torchinductor", "gpu_window_mem"), depth=3, top=60)
    return res


for v in variants:
    try:
        r = run(v)
    except Exception as exc:  # noqa: BLE001 - report and go on
        r = {"variant": v, "error": f"{type(exc).__name__}: {exc}"}
    torch.cuda.empty_cache()
    print(json.dumps({k: r[k] for k in r if k != "live_at_peak"}))
    for g in r.get("live_at_peak", [])[:8]:
        print(f"   {g['MiB']:8.1f} MiB x{g['n']:<4d} {g['where'][:150]}")
    with open(out, "a") as f:
        f.write(json.dumps(r) + "\n")
