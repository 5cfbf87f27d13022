"""Fused-loss diagnostics (one device call): where the "lean" mode's extra memory comes from (a
CUDA memory-history replay of one fwd+bwd, measured like the kernel benchmark), and a chunk-size
sweep of both modes (time, extra memory, GPU-kernel time by kind) at the issue's shapes.

    python scripts/gpu_flce_diag.py OUT.json [--quick]
"""
import json
import sys
from collections import defaultdict

import torch
import triton.testing
from _diag_common import live_at_peak

from lit_liger.kernels import fused_linear_cross_entropy

dev = "cuda"
out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
quick = "--quick" in sys.argv
V = 128256
MiB = 2**20


def inputs(N, H, frozen=False):
    torch.manual_seed(0)
    x = torch.randn(N, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_(not frozen)
    y = torch.randint(0, V, (N,), device=dev)
    return x, w, y


def measured_peak(fn, leaves):
    """As benchmarks/kernels.py: warm-up keeps the grads, base includes them, clear, peak of one run."""
    fn().backward()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for t in leaves:
        t.grad = None
    torch.cuda.reset_peak_memory_stats()
    fn().backward()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MiB


def replay_peak(trace):
    """Live blocks at the peak of a memory-history trace: [(MiB, top frames)]."""
    best, at_peak = live_at_peak(trace)
    rows = []
    for ev in sorted(at_peak, key=lambda e: -e["size"])[:12]:
        frames = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in ev.get("frames", [])
                  if any(k in f["filename"] for k in ("lit_liger", "kernels", "scripts", "torch/autograd",
                                                       "torch/_library"))][:6]
        rows.append({"MiB": round(ev["size"] / MiB, 1), "frames": frames})
    return best / MiB, rows


# --- 1. lean memory: peak as the benchmark measures it, then the live blocks at the peak
N, H = 8192, 2048
for frozen in (False, True):
    x, w, y = inputs(N, H, frozen)
    leaves = [x] if frozen else [x, w]

    def fn():
        return fused_linear_cross_entropy(x, w, y, mode="lean")

    key = f"lean_N{N}_H{H}{'_frozenW' if frozen else ''}"
    out[key + "_extra_MiB"] = measured_peak(fn, leaves)
    fn().backward()
    torch.cuda.synchronize()
    for t in leaves:
        t.grad = None
    ptrs = {}
    if not frozen:
        w.register_post_accumulate_grad_hook(
            lambda p: ptrs.update(w_grad_hook_alloc_MiB=torch.cuda.memory_allocated() / MiB))
    torch.cuda.memory._record_memory_history(max_entries=200000)
    before = torch.cuda.memory_allocated() / MiB
    loss = fn()
    after_fwd = torch.cuda.memory_allocated() / MiB
    loss.backward()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, rows = replay_peak(snap["device_traces"][0])
    out[key + "_memory"] = {"alloc_before_MiB": before, "after_forward_MiB": after_fwd,
                            "after_backward_MiB": torch.cuda.memory_allocated() / MiB,
                            "trace_peak_over_start_MiB": peak, "live_at_peak": rows, **ptrs}
    del x, w, y, loss
    torch.cuda.empty_cache()
print(json.dumps({k: v for k, v in out.items() if "memory" in k}, indent=1), flush=True)


# --- 2. chunk sweep: time (do_bench), extra memory, GPU kernel time by kind
def kernel_split(fn, leaves):
    from torch.profiler import ProfilerActivity, profile
    for t in leaves:
        t.grad = None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            for t in leaves:
                t.grad = None
            fn().backward()
        torch.cuda.synchronize()
    kinds = defaultdict(float)
    for e in prof.key_averages():
        name = e.key.lower()
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        kind = ("gemm" if any(s in name for s in ("gemm", "sm90", "cutlass", "cublas", "nvjet", "xmma"))
                else "flce" if "_flce" in name else "other")
        kinds[kind] += t / 3 / 1e3
    return {k: round(v, 2) for k, v in kinds.items()}


shapes = [(8192, 2048)] if quick else [(8192, 2048), (16384, 4096)]
sweep = {"fast": [0, 1024, 2048, 4096], "lean": [0, 1024, 1792, 2048, 4096]}
rows = []
for N, H in shapes:
    for frozen in (False, True):
        x, w, y = inputs(N, H, frozen)
        leaves = [x] if frozen else [x, w]
        for mode, sizes in sweep.items():
            for cs in sizes:
                if N == 16384 and cs not in (0, 2048):
                    continue

                def fn():
                    return fused_linear_cross_entropy(x, w, y, mode=mode, chunk_size=cs or None)

                def step():
                    for t in leaves:
                        t.grad = None
                    fn().backward()

                row = {"N": N, "H": H, "frozenW": frozen, "mode": mode, "chunk": cs or "default"}
                row["extra_MiB"] = round(measured_peak(fn, leaves), 1)
                row["ms"] = round(triton.testing.do_bench(step, warmup=50, rep=400), 2)
                row["gpu_ms"] = kernel_split(fn, leaves)
                flops = (4 if frozen else 6) * N * H * V
                row["TFLOPs"] = round(flops / row["ms"] / 1e9, 1)
                rows.append(row)
                print(row, flush=True)
        del x, w, y
        torch.cuda.empty_cache()
out["sweep"] = rows
json.dump(out, open(sys.argv[1], "w"), indent=1)
