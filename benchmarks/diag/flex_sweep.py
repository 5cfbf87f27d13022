"""FlexAttention launch settings for the families of issue 15, measured (GPU only).

For each shape (B, heads, groups, T, head size, softcap, window) this times forward+backward of the
FlexAttention lit-liger runs (lit_liger.swap.attend.flex_attend: torch's default launch settings, or the ones
lit-liger's launch heuristics pick: kernels/_launch.flex_kernel_options), then a few explicit settings
(CANDIDATES), then lets inductor autotune the same call
(``mode="max-autotune-no-cudagraphs"``) and times that; inductor prints the configs it tried to stderr
("AUTOTUNE flex_attention..."), which the run's log keeps. Writes ``flex_sweep.json``.

    python -m benchmarks diag flex-sweep --out DIR [--shapes gemma2,gemma3,mistral] [--no_autotune]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ._common import cuda_median_ms
from lit_liger.swap import attend as A

SHAPES = {  # name: (B, n_head, n_query_groups, T, head_size, softcap, window, scale)
    "gemma2": (4, 8, 4, 2048, 256, 50.0, None, 256 ** -0.5),
    "gemma3": (4, 4, 1, 2048, 256, None, 512, 256 ** -0.5),
    "mistral": (4, 32, 8, 2048, 128, None, 1024, 128 ** -0.5),
}


def _bwd(m1: int, n1: int, m2: int, n2: int, stages: int, warps: int, **flags) -> dict:
    """Backward launch settings: the dK/dV kernel's M1 x N1 tiles, the dQ kernel's M2 x N2, plus kernel flags."""
    return dict(bwd_BLOCK_M1=m1, bwd_BLOCK_N1=n1, bwd_BLOCK_M2=m2, bwd_BLOCK_N2=n2, bwd_num_stages=stages,
                bwd_num_warps=warps, **flags)


#: explicit launch settings tried on every shape (kernel_options of flex_attention; fwd_/bwd_ prefixes)
CANDIDATES = {
    "bwd 32x64 s3 w4": _bwd(32, 64, 64, 32, 3, 4),
    "bwd 64x64 s2 w8": _bwd(64, 64, 64, 64, 2, 8),
    "bwd 32x128 s2 w8": _bwd(32, 128, 128, 32, 2, 8),
    # second sweep (h100-2026-11-24c): around the chosen 64x64 s2 w8, inductor's autotune pick (32x32 s4 w4; its
    # candidates were all 4-warp), and the kernel's guarantees a causal block mask allows (a window's does not:
    # its "contiguous" rows here time a setting lit-liger never uses with a window)
    "bwd 32x32 s4 w4": _bwd(32, 32, 32, 32, 4, 4),
    "bwd 32x32 s4 w8": _bwd(32, 32, 32, 32, 4, 8),
    "bwd 32x32 s2 w8": _bwd(32, 32, 32, 32, 2, 8),
    "bwd 64x64 s1 w8": _bwd(64, 64, 64, 64, 1, 8),
    "bwd 64x64 s2 w8 rows-safe": _bwd(64, 64, 64, 64, 2, 8, ROWS_GUARANTEED_SAFE=True),
    "bwd 64x64 s2 w8 contiguous": _bwd(64, 64, 64, 64, 2, 8, BLOCKS_ARE_CONTIGUOUS=True),
    "bwd 64x64 s2 w8 safe+contiguous": _bwd(64, 64, 64, 64, 2, 8, ROWS_GUARANTEED_SAFE=True,
                                            BLOCKS_ARE_CONTIGUOUS=True),
    "bwd 32x64/64x32 s2 w8": _bwd(32, 64, 64, 32, 2, 8),
    "bwd 64x128/128x64 s1 w8": _bwd(64, 128, 128, 64, 1, 8),
    "fwd 64x64 s3 w4": dict(fwd_BLOCK_M=64, fwd_BLOCK_N=64, fwd_num_stages=3, fwd_num_warps=4),
    "fwd 128x64 s2 w8": dict(fwd_BLOCK_M=128, fwd_BLOCK_N=64, fwd_num_stages=2, fwd_num_warps=8),
}


def _time(fn, q, k, v, n=20, warmup=3) -> float:
    g = torch.randn_like(q)

    def step():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(g)

    return cuda_median_ms(step, n, warmup)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--no_autotune", action="store_true")
    p.add_argument("--no_candidates", action="store_true")
    p.add_argument("--candidates", default="", help="comma-separated labels of CANDIDATES to try (default: all)")
    opts = p.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in opts.shapes.split(","):
        B, nh, ng, T, hs, cap, window, scale = SHAPES[name]
        torch.manual_seed(0)
        mk = lambda h: torch.randn(B, h, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
        q, k, v = mk(nh), mk(ng), mk(ng)
        row = {"shape": name, "B": B, "n_head": nh, "n_query_groups": ng, "T": T, "head_size": hs,
               "softcap": cap, "window": window}
        row["lit_liger_ms"] = _time(lambda q, k, v: A.flex_attend(q, k, v, scale=scale, softcap=cap, window=window),
                                    q, k, v)
        print(f"{name}: lit-liger flex fwd+bwd {row['lit_liger_ms']:.3f} ms", flush=True)
        kw = dict(score_mod=A.softcap_score_mod(cap) if cap is not None else None,
                  block_mask=A.block_mask(T, A.effective_window(T, window), q.device), scale=scale,
                  enable_gqa=ng != nh)
        row["candidates_ms"] = {}
        chosen = [c for c in opts.candidates.split(",") if c] or list(CANDIDATES)
        for label, ko in ({} if opts.no_candidates else {c: CANDIDATES[c] for c in chosen}).items():
            try:
                fn = torch.compile(A.flex_attention, fullgraph=True, dynamic=False)
                ms = _time(lambda q, k, v: fn(q, k, v, kernel_options=dict(ko), **kw), q, k, v, n=10)
            except Exception as exc:  # noqa: BLE001 - a setting the kernel refuses (shared memory): a row
                ms = f"{type(exc).__name__}: {str(exc)[:160]}"
            row["candidates_ms"][label] = ms
            print(f"{name}: {label}: {ms if isinstance(ms, str) else f'{ms:.3f} ms'}", flush=True)
            torch._dynamo.reset()
        if not opts.no_autotune:
            tuned = torch.compile(A.flex_attention, mode="max-autotune-no-cudagraphs", fullgraph=True, dynamic=False)
            print(f"# autotuning {name}", file=sys.stderr, flush=True)
            row["autotuned_ms"] = _time(lambda q, k, v: tuned(q, k, v, **kw), q, k, v)
            print(f"{name}: autotuned fwd+bwd {row['autotuned_ms']:.3f} ms", flush=True)
        rows.append(row)
        (opts.out / "flex_sweep.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
