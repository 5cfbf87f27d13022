"""The AdamW step of a full fine-tuning, per implementation (``lit_liger.optim``, ``kernels/adam.py``): one GPU.

usage: python -m benchmarks diag adam-step [OUT.json]   (env: MODELS=Llama-3.2-1B,Llama-3.1-8B:8 (name[:layers]),
                                                         DTYPE=bfloat16, STEPS=10, PLANS=1024x8x4,...)

``PLANS``: more lit-liger rows, each with its launch plan (``BLOCKxITERSxWARPS``) in place of
``kernels/_launch.py``'s ``adam_plan`` (a sweep to set it).

For each model's trainable parameters (every weight, litgpt's shapes, random values and gradients): the median time
of ``optimizer.step()`` (CUDA events, after 3 untimed steps) with torch's default (``foreach``), torch's ``fused=True``
and lit-liger's kernel (``lit_liger.optim.fuse_optimizer``), the bytes a step must move (a 16-bit parameter, its
gradient and two moments: 14 bytes per element) over that time, and that rate against the device's copy rate
measured in the same run. Correctness: after the same steps from the same start, how far lit-liger's weights are
from torch's fused ones, relative to how far those moved.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from ._common import cuda_median_ms


def _shapes(spec: str) -> tuple[str, list[torch.Size]]:
    from litgpt import GPT, Config

    name, _, layers = spec.partition(":")
    cfg = Config.from_name(name, **({"n_layer": int(layers)} if layers else {}))
    with torch.device("meta"):
        model = GPT(cfg)
    return f"{name} ({cfg.n_layer} layers)", [p.shape for p in model.parameters()]


def _copy_gbps(dtype: torch.dtype) -> float:
    src = torch.empty(1 << 30, dtype=dtype, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = cuda_median_ms(lambda: dst.copy_(src), n=10)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def _run(variant: str, shapes: list[torch.Size], dtype: torch.dtype, steps: int) -> tuple[float, list, list]:
    """The median step time, and a few weights before and after the first 3 steps."""
    from lit_liger import optim

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dtype) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    start = [p.detach().clone() for p in params[:8] + params[-1:]]
    kwargs = {"fused": True} if variant == "torch fused" else {}
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **kwargs)
    if variant.startswith("lit-liger"):
        why = optim.fuse_optimizer(opt)
        assert why is None and isinstance(opt, optim.AdamW), why
    for _ in range(3):  # (the same 3 steps for every variant: the weights compared)
        opt.step()
    torch.cuda.synchronize()
    after = [p.detach().clone() for p in params[:8] + params[-1:]]
    ms = cuda_median_ms(opt.step, n=steps, warmup=0)
    del opt, params
    torch.cuda.empty_cache()
    return ms, start, after


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    dtype = getattr(torch, os.environ.get("DTYPE", "bfloat16"))
    steps = int(os.environ.get("STEPS", 10))
    copy = _copy_gbps(dtype)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": str(dtype),
              "copy_GBps": copy, "rows": []}
    print(f"{result['device']}: copy {copy:,.0f} GB/s")
    for spec in os.environ.get("MODELS", "Llama-3.2-1B,Llama-3.1-8B:8").split(","):
        name, shapes = _shapes(spec)
        numel = sum(s.numel() for s in shapes)
        moved = (2 * dtype.itemsize + dtype.itemsize + 4 * dtype.itemsize) * numel  # p r/w, g r, m and v r/w
        weights = {}
        plans = [p for p in os.environ.get("PLANS", "").split(",") if p]
        for variant in ("torch foreach", "torch fused", "lit-liger", *(f"lit-liger {p}" for p in plans)):
            from lit_liger.kernels import adam

            planned = adam.adam_plan
            if variant.startswith("lit-liger "):
                block, iters, warps = (int(x) for x in variant.split()[1].split("x"))
                adam.adam_plan = lambda device, plan=(block, iters, warps): plan
            try:
                ms, start, weights[variant] = _run(variant, shapes, dtype, steps)
            finally:
                adam.adam_plan = planned
            row = {"model": name, "params": numel, "tensors": len(shapes), "variant": variant, "step_ms": ms,
                   "GBps": moved / ms / 1e6, "x_copy_rate": moved / ms / 1e6 / copy}
            result["rows"].append(row)
            print(f"{name:28s} {variant:14s} {ms:8.2f} ms  {row['GBps']:7,.0f} GB/s  {row['x_copy_rate']:.2f} of copy")
        ref, ours = weights["torch fused"], weights["lit-liger"]
        rel = max(float((o.float() - r.float()).norm() / (r.float() - s.float()).norm())
                  for o, r, s in zip(ours, ref, start))
        next(r for r in result["rows"] if r["model"] == name and r["variant"] == "lit-liger")[
            "rel_err_vs_torch_fused_update"] = rel
        print(f"{name:28s} lit-liger vs torch fused, 3 steps: |diff| / |update| = {rel:.2e}")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
