"""Causal attention at long lengths (issue 68): PyTorch's SDPA backends (cuDNN, flash, memory-efficient) and
lit-liger's Triton attention kernel (``lit_liger.kernels.attention``), forward and forward + backward, per length.

usage: python -m benchmarks diag long-attn [OUT.json]   (env: TOKENS=65536,131072,262144,524288 HEADS=32:8:128
                                                         (query heads : key/value groups : head size, Llama-3.1-8B's),
                                                         REPS=2, BACKENDS=name,... (default: all))

The SDPA backends run twice: with the key / value heads repeated to the query heads (LitGPT's layout for them), and
with the groups as they are and ``enable_gqa=True`` (``*-gqa``: the call lit-liger's GQA layers make; ``torch-gqa``
with every backend on, and the aten op PyTorch's choice runs there, from the profiler). ``rerun-gqa`` and
``rerun-sliced-gqa``: a recomputed Block's attention in lit-liger (``swap.attend.kept_sdpa``, the kernel PyTorch picks
called apart), its backward in one call and over slices of key/value groups (``sliced_sdpa_backward``, as the
product runs it): what the slices save in memory and cost in time. Per backend and length: the median time of the forward and of the forward + backward (CUDA events, B = 1, bf16), their
TFLOP/s counting the causal half (forward 2 GEMMs, backward 5: ``2 * 2 * T^2 / 2 * nh * hs`` per GEMM pair's share),
and the backward's extra memory. A backend that cannot take the shape prints its error and is skipped.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F


def _backends() -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lit_liger.kernels.attention import softcap_attention

    def sdpa(*backends, gqa=False):
        def run(q, k, v):
            with sdpa_kernel(list(backends)):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return run

    B = SDPBackend
    return {"cudnn": sdpa(B.CUDNN_ATTENTION), "flash": sdpa(B.FLASH_ATTENTION),
            "efficient": sdpa(B.EFFICIENT_ATTENTION),
            # the call lit-liger's GQA layers make (attention._flash_gqa_ok): the key / value groups as they are,
            # enable_gqa=True, per backend and with every backend on (PyTorch's choice, as at these lengths)
            "cudnn-gqa": sdpa(B.CUDNN_ATTENTION, gqa=True), "flash-gqa": sdpa(B.FLASH_ATTENTION, gqa=True),
            "torch-gqa": sdpa(B.CUDNN_ATTENTION, B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH, gqa=True),
            "lit-liger": lambda q, k, v: softcap_attention(q, k, v, q.size(-1) ** -0.5, None),
            # a recomputed Block's attention (the kernel PyTorch picks, called apart), its backward in one call / over
            # slices (SLICED below sets kernels._launch.ATTN_BWD_SLICE_BYTES around the measurement)
            "rerun-gqa": _rerun, "rerun-sliced-gqa": _rerun}


#: the backends whose backward runs over slices of key/value groups (the others' in one call)
SLICED = ("rerun-sliced-gqa",)


def _rerun(q, k, v):
    from lit_liger.swap import attend

    return attend.kept_sdpa(attend.KeptAttention(keep=False), q, k, v, q.size(-1) ** -0.5)


def _chosen_gqa(T: int, nh: int, ng: int, hs: int) -> str:
    """The backend PyTorch's own choice takes for the GQA call at ``T`` tokens (its profiler's kernel names)."""
    q = torch.randn(1, nh, T, hs, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, ng, T, hs, device="cuda", dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    names = [e.name for e in prof.events() if "attention" in e.name and e.name.startswith("aten::_")]
    return ",".join(dict.fromkeys(names)) or "?"


def _timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times[1:])


def _measure(name: str, fn, T: int, nh: int, ng: int, hs: int, reps: int) -> tuple[float, float, float]:
    """(forward s, forward + backward s, the backward's extra GiB) of ``fn`` at ``T`` tokens. The SDPA backends get
    key / value heads repeated to the query heads (LitGPT's layout for them), the ``*-gqa`` ones and lit-liger's
    kernel the groups."""
    torch.manual_seed(0)
    kv = ng if name == "lit-liger" or name.endswith("-gqa") else nh
    q = torch.randn(1, nh, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, kv, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, kv, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, nh, T, hs, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fwd = _timed(lambda: fn(q, k, v), reps)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()

    def step():
        fn(q, k, v).backward(g)
        q.grad = k.grad = v.grad = None

    both = _timed(step, reps)
    return fwd, both, (torch.cuda.max_memory_allocated() - base) / 2**30


def main(argv: list[str]) -> None:
    tokens = [int(t) for t in os.environ.get("TOKENS", "65536,131072,262144,524288").split(",")]
    nh, ng, hs = (int(v) for v in os.environ.get("HEADS", "32:8:128").split(":"))
    reps = int(os.environ.get("REPS", "2"))
    only = [b for b in os.environ.get("BACKENDS", "").split(",") if b]
    from lit_liger.kernels import _launch

    slice_cap = _launch.ATTN_BWD_SLICE_BYTES
    rows = []
    print(f"{'backend':<10} {'tokens':>8} {'fwd s':>8} {'fwd TF/s':>9} {'f+b s':>8} {'f+b TF/s':>9} {'bwd extra GiB':>13}")
    for T in tokens:
        flops_fwd = 2 * 2 * T * T / 2 * nh * hs  # QK^T and PV over the causal half
        try:
            chosen = _chosen_gqa(T, nh, ng, hs)
        except Exception as e:  # noqa: BLE001
            chosen = f"error: {type(e).__name__}"
        print(f"PyTorch's choice for the GQA call at {T} tokens: {chosen}", flush=True)
        rows.append({"backend": "torch-gqa-choice", "tokens": T, "ops": chosen})
        torch.cuda.empty_cache()
        for name, fn in _backends().items():
            if only and name not in only:
                continue
            # (one call unless the backend is a sliced one: the cap past any query's bytes)
            _launch.ATTN_BWD_SLICE_BYTES = slice_cap if name in SLICED else 1 << 62
            try:
                fwd, both, extra = _measure(name, fn, T, nh, ng, hs, reps)
            except Exception as e:  # noqa: BLE001 - a backend that cannot take the shape
                print(f"{name:<10} {T:>8} skipped: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
                rows.append({"backend": name, "tokens": T, "error": str(e).splitlines()[0][:300]})
                continue
            finally:
                _launch.ATTN_BWD_SLICE_BYTES = slice_cap
                torch.cuda.empty_cache()
            row = {"backend": name, "tokens": T, "fwd_s": fwd, "fwd_tflops": flops_fwd / fwd / 1e12, "fwd_bwd_s": both,
                   "fwd_bwd_tflops": 3.5 * flops_fwd / both / 1e12, "bwd_extra_gib": extra}
            rows.append(row)
            print(f"{name:<10} {T:>8} {fwd:>8.3f} {row['fwd_tflops']:>9.0f} {both:>8.3f} {row['fwd_bwd_tflops']:>9.0f} "
                  f"{extra:>13.2f}", flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": [nh, ng, hs], "rows": rows}
    if argv:
        with open(argv[0], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
