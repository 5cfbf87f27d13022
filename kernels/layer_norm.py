"""LayerNorm as LitGPT uses it: ``torch.nn.LayerNorm`` (Pythia, phi, Falcon, ...) and, for OLMo-1,
``torch.nn.LayerNorm(elementwise_affine=False)`` (no weight, no bias).

``layer_norm(x, weight, bias, eps)`` equals ``F.layer_norm(x, (H,), weight, bias, eps)``: the
statistics and the affine transform run in fp32 and the result is written in ``x.dtype``. ``weight``
and ``bias`` are each optional; their gradients are computed only when they require grad.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import as_rows, check_float, check_last_dim, check_same_device
from ._launch import fast_launch, partial_rows, row_plan, use_triton

__all__ = ["layer_norm", "layer_norm_reference"]


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and tests' second opinion; the tests' primary reference is torch.nn.LayerNorm)
# ----------------------------------------------------------------------------------------------
def layer_norm_reference(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w, b, eps).to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@fast_launch
@triton.jit
def _ln_fwd_kernel(
    X, Y, W, B, MEAN, RSTD,
    stride_x, stride_y,
    n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row. Reads x[row] (and w, b); writes y[row] = (x - mean) * rstd * w + b in
    the output dtype, and mean[row], rstd[row] in fp32. The variance is taken around the mean held in
    registers (two passes over the row in registers, no E[x^2] - mean^2 cancellation)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    y = xc * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@fast_launch
@triton.jit
def _ln_bwd_kernel(
    DY, X, W, MEAN, RSTD, DX, DW_PARTIAL, DB_PARTIAL,
    stride_dy, stride_x, stride_dx,
    n_rows, n_cols,
    HAS_WEIGHT: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr, BLOCK: tl.constexpr,
):
    """Persistent: program p handles rows p, p+P, ...; per row reads dy[row], x[row], mean[row],
    rstd[row] and writes dx[row] = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * w.
    With NEED_DW / NEED_DB it accumulates its rows' dy * x_hat / dy in fp32 registers and writes one
    partial row each to DW_PARTIAL[p] / DB_PARTIAL[p]; the partials are summed on the device."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for row in range(pid, n_rows, n_prog):
        row64 = tl.cast(row, tl.int64)
        x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row64)
        rstd = tl.load(RSTD + row64)
        x_hat = tl.where(mask, (x - mean) * rstd, 0.0)
        if HAS_WEIGHT:
            g = dy * w
        else:
            g = dy
        c1 = tl.sum(g * x_hat, axis=0) / n_cols
        c2 = tl.sum(g, axis=0) / n_cols
        dx = rstd * (g - c2 - x_hat * c1)
        tl.store(DX + row64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if NEED_DW:
            dw_acc += dy * x_hat
        if NEED_DB:
            db_acc += dy
    if NEED_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw_acc, mask=mask)
    if NEED_DB:
        tl.store(DB_PARTIAL + pid * n_cols + cols, db_acc, mask=mask)


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
def _layer_norm_fwd_impl(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x2 = as_rows(x)  # (N, H)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows > 0 and n_cols > 0:
        # one row in registers: BLOCK = next_power_of_2(H), warps so each thread holds 8-16 elements
        plan = row_plan(n_cols, x.element_size(), x.device)
        _ln_fwd_kernel[(n_rows,)](
            x2, y, weight if weight is not None else y, bias if bias is not None else y, mean, rstd,
            x2.stride(0), y.stride(0),
            n_cols, eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            BLOCK=plan.block, num_warps=plan.num_warps,
        )
    return y.view(x.shape), mean, rstd


_layer_norm_fwd = torch.library.custom_op("lit_liger::layer_norm_fwd", _layer_norm_fwd_impl, mutates_args=())


@_layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    n_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty(x.shape), x.new_empty(n_rows, dtype=torch.float32), x.new_empty(n_rows, dtype=torch.float32)


def _layer_norm_bwd_impl(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor,
    need_dw: bool, need_db: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x2, dy2 = as_rows(x), as_rows(dy)  # (N, H)
    n_rows, n_cols = x2.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    n_prog = partial_rows(n_rows, x.device)
    dw_partial = torch.empty((n_prog, n_cols) if need_dw else (0,), dtype=torch.float32, device=x.device)
    db_partial = torch.empty((n_prog, n_cols) if need_db else (0,), dtype=torch.float32, device=x.device)
    if n_rows > 0 and n_cols > 0:
        plan = row_plan(n_cols, x.element_size(), x.device)
        _ln_bwd_kernel[(n_prog,)](
            dy2, x2, weight if weight is not None else x2, mean, rstd, dx, dw_partial, db_partial,
            dy2.stride(0), x2.stride(0), dx.stride(0),
            n_rows, n_cols,
            HAS_WEIGHT=weight is not None, NEED_DW=need_dw, NEED_DB=need_db,
            BLOCK=plan.block, num_warps=plan.num_warps,
        )
    # (P, H) fp32 partials -> (H,) in the parameter's dtype, on the device (no host sync)
    pdtype = weight.dtype if weight is not None else x.dtype
    if need_dw:
        dw = dw_partial.sum(0).to(pdtype) if n_rows > 0 else torch.zeros(n_cols, dtype=pdtype, device=x.device)
    else:
        dw = x.new_empty(0)
    if need_db:
        db = db_partial.sum(0) if n_rows > 0 else torch.zeros(n_cols, dtype=torch.float32, device=x.device)
    else:
        db = x.new_empty(0)
    return dx.view(x.shape), dw, db


_layer_norm_bwd = torch.library.custom_op("lit_liger::layer_norm_bwd", _layer_norm_bwd_impl, mutates_args=())


@_layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd, need_dw, need_db):
    n_cols = x.shape[-1]
    pdtype = weight.dtype if weight is not None else x.dtype
    dw = x.new_empty(n_cols, dtype=pdtype) if need_dw else x.new_empty(0)
    db = x.new_empty(n_cols, dtype=torch.float32) if need_db else x.new_empty(0)
    return x.new_empty(x.shape), dw, db


def _setup_context(ctx, inputs, output):
    x, weight, bias, eps = inputs
    y, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, dy, dmean, drstd, bwd=_layer_norm_bwd):
    x, weight, mean, rstd = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
    dx, dw, db = bwd(dy, x, weight, mean, rstd, need_dw, need_db)
    return dx, (dw if need_dw else None), (db.to(ctx.bias_dtype) if need_db else None), None


_layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


class _LayerNormFn(torch.autograd.Function):
    """Eager fast path: the same kernels and autograd as the custom op, without the custom-op
    dispatcher's per-call host overhead (tens of microseconds, comparable to the kernels
    themselves at LitGPT sizes). ``torch.compile`` traces the custom op instead (see ``_fwd``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        out = _layer_norm_fwd_impl(x, weight, bias, eps)
        _setup_context(ctx, (x, weight, bias, eps), out)
        ctx.mark_non_differentiable(out[1], out[2])  # mean, rstd
        ctx.set_materialize_grads(False)  # no zero gradients built for mean/rstd
        return out

    @staticmethod
    def backward(ctx, dy, dmean, drstd):
        return _backward(ctx, dy, dmean, drstd, bwd=_layer_norm_bwd_impl)


def _fwd(x, weight, bias, eps):
    if torch.compiler.is_compiling():
        return _layer_norm_fwd(x, weight, bias, eps)
    return _LayerNormFn.apply(x, weight, bias, eps)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _check(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    check_float("x", x)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., H)")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        check_float(name, p)
        if p.dim() != 1:
            raise ValueError(f"{name} must be 1-D (H,), got shape {tuple(p.shape)}")
        check_last_dim("x", x, p.shape[0], f"the normalized size, {name}.shape[0]")
    check_same_device(x=x, weight=weight, bias=bias)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """``F.layer_norm(x, (H,), weight, bias, eps)``: fp32 math, output in ``x.dtype``. ``weight`` and
    ``bias`` are ``(H,)`` or ``None`` (``torch.nn.LayerNorm(elementwise_affine=False)``, OLMo-1)."""
    _check(x, weight, bias)
    if not use_triton(x):
        return layer_norm_reference(x, weight, bias, eps)
    y, _, _ = _fwd(x, weight, bias, float(eps))
    return y
