"""Shared test helpers: relative error per DESIGN.md and the tolerances."""

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN/inf anywhere gives inf (never passes)."""
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    denom = ref.norm().item()
    return (out - ref).norm().item() / max(denom, 1e-30)


TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
