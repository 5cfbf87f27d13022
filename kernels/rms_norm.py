"""RMSNorm with LitGPT's semantics, and a fused ``residual add + RMSNorm`` for LitGPT's Block.

``rms_norm(x, weight, eps, offset)`` equals ``litgpt.model.RMSNorm``: the math runs in fp32,
``weight`` is cast to fp32 and ``offset`` (``add_unit_offset`` -> 1.0, Gemma) is added to it, and
the result is cast back to ``x.dtype``.

``rms_norm_residual(x, residual, weight, eps, offset)`` returns ``(s, rms_norm(s))`` with
``s = x + residual`` rounded to ``x.dtype`` (exactly what ``x = attn_out + x; norm_2(x)`` does),
in one pass over memory.

``rms_norm_linear(x, weight, linears, eps, offset, residual=None)`` is the norm followed by the
Linear layers that read its output (LitGPT's ``norm_1 -> attn.qkv``, ``norm_2 -> mlp.fc_1, fc_2``):
the normalized tensor is not kept for their weight gradients but recomputed in backward from the
norm's own saved input by the same kernel (bit for bit): one ``(B, T, C)`` tensor per norm less in a
model's activation memory, for one extra norm pass in backward. It is used only when some Linear
weight needs a gradient (a frozen Linear keeps nothing of its input anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._checks import as_rows, check_float, check_last_dim, check_same_device, check_same_dtype
from ._grad_into import target_for, weight_grad
from ._launch import fast_launch, partial_rows, row_plan, use_triton

__all__ = ["rms_norm", "rms_norm_add", "rms_norm_again", "rms_norm_residual", "rms_norm_linear", "rms_norm_reference"]


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and tests' second opinion; the tests' primary reference is litgpt's RMSNorm)
# ----------------------------------------------------------------------------------------------
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xn = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + eps)
    w = weight.float() + offset if offset else weight.float()
    return (xn * w).to(dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@fast_launch
@triton.jit
def _rms_fwd_kernel(
    X, R, S, Y, W, RSTD,
    stride_x, stride_r, stride_s, stride_y,
    n_cols, eps, offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, Y_AMAX: tl.constexpr = False,
):
    """One program per row. Reads x[row] (and residual[row]) and w; writes y[row], rstd[row]
    (fp32) and, with a residual, s[row] = x + residual rounded to the input dtype. With Y_AMAX it writes
    not y[row] but max |y[row]| (y rounded to the input dtype) to Y[row], fp32 (``kernels.float8``)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(S.dtype.element_ty)
        tl.store(S + row * stride_s + cols, s, mask=mask)
        x = s
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    y = x * rstd * w
    if Y_AMAX:
        tl.store(Y + row, tl.max(tl.abs(y.to(X.dtype.element_ty).to(tl.float32)), axis=0))
    else:
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_row_grad(x_hat, dy, w, rstd, n_cols):
    """One row's RMSNorm input gradient (fp32) from its normalized input ``x_hat``, ``dy``, the weight (offset
    added) and ``rstd``; every backward kernel here forms it with this function."""
    g = dy * w
    return rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))


@fast_launch
@triton.jit
def _rms_bwd_kernel(
    DY, DS, X, W, RSTD, DX, DW_PARTIAL,
    stride_dy, stride_ds, stride_x, stride_dx,
    n_rows, n_cols, offset,
    HAS_DS: tl.constexpr, NEED_DW: tl.constexpr, BLOCK: tl.constexpr,
):
    """Persistent: program p handles rows p, p+P, ...; writes dx[row] and, if NEED_DW, one fp32
    partial dW row (its rows' sum of dy * x_hat) to DW_PARTIAL[p]; the partials are summed on the
    device afterwards. With HAS_DS the gradient of the residual-sum output is added to dx."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for row in range(pid, n_rows, n_prog):
        row64 = tl.cast(row, tl.int64)
        x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row64)
        x_hat = x * rstd
        dx = _rms_row_grad(x_hat, dy, w, rstd, n_cols)
        if HAS_DS:
            dx += tl.load(DS + row64 * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if NEED_DW:
            dw_acc += dy * x_hat
    if NEED_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw_acc, mask=mask)


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
def _rms_norm_fwd_launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float, y_amax: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, s, rstd)``; with ``y_amax`` y is not written: the first output is each row's max |y| (fp32, ``(N,)``)."""
    x2 = as_rows(x)  # (N, H)
    n_rows, n_cols = x2.shape
    # y and s are allocated in x's shape and returned as they are, not as views of 2-D tensors: a model's output
    # that is a view makes FSDP2 warn about in-place ops on it (the swapped GPT's final norm output)
    y = torch.empty((n_rows,) if y_amax else x.shape, dtype=torch.float32 if y_amax else x.dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if residual is not None:
        r2 = as_rows(residual)
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        r2 = x2
        s = torch.empty(0, dtype=x.dtype, device=x.device)
    if n_rows > 0:
        plan = row_plan(n_cols, x.element_size(), x.device)
        _rms_fwd_kernel[(n_rows,)](
            x2, r2, s if residual is not None else y, y, weight, rstd,
            x2.stride(0), r2.stride(0), n_cols, 1 if y_amax else n_cols,
            n_cols, eps, offset,
            HAS_RESIDUAL=residual is not None, BLOCK=plan.block, Y_AMAX=y_amax, num_warps=plan.num_warps,
        )
    return y, s, rstd


def _rms_norm_fwd_impl(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _rms_norm_fwd_launch(x, residual, weight, eps, offset, False)


_rms_norm_fwd = torch.library.custom_op("lit_liger::rms_norm_fwd", _rms_norm_fwd_impl, mutates_args=())


def _fwd_fake(x, residual, y_amax: bool):
    n_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    s = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    y = x.new_empty(n_rows, dtype=torch.float32) if y_amax else x.new_empty(x.shape)
    return y, s, x.new_empty(n_rows, dtype=torch.float32)


@_rms_norm_fwd.register_fake
def _(x, residual, weight, eps, offset):
    return _fwd_fake(x, residual, False)


def _rms_norm_amax_impl(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(max |y| of each row, s, rstd)`` (``kernels.float8.norm_fp8``: y itself is not written)."""
    return _rms_norm_fwd_launch(x, residual, weight, eps, offset, True)


_rms_norm_amax = torch.library.custom_op("lit_liger::rms_norm_amax", _rms_norm_amax_impl, mutates_args=())


@_rms_norm_amax.register_fake
def _(x, residual, weight, eps, offset):
    return _fwd_fake(x, residual, True)


def _rms_norm_bwd_impl(
    dy: torch.Tensor, ds: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
    offset: float, need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    x2, dy2 = as_rows(x), as_rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    ds2 = as_rows(ds) if ds is not None else dy2
    n_prog = partial_rows(n_rows, x.device)
    dw_partial = torch.empty((n_prog, n_cols) if need_dw else (0,), dtype=torch.float32, device=x.device)
    if n_rows > 0:
        plan = row_plan(n_cols, x.element_size(), x.device)
        _rms_bwd_kernel[(n_prog,)](
            dy2, ds2, x2, weight, rstd, dx, dw_partial,
            dy2.stride(0), ds2.stride(0), x2.stride(0), dx.stride(0),
            n_rows, n_cols, offset,
            HAS_DS=ds is not None, NEED_DW=need_dw, BLOCK=plan.block, num_warps=plan.num_warps,
        )
    if need_dw:
        dw = dw_partial.sum(0).to(weight.dtype) if n_rows > 0 else torch.zeros_like(weight)
    else:
        dw = weight.new_empty(0)
    return dx.view(x.shape), dw


_rms_norm_bwd = torch.library.custom_op("lit_liger::rms_norm_bwd", _rms_norm_bwd_impl, mutates_args=())


@_rms_norm_bwd.register_fake
def _(dy, ds, x, weight, rstd, offset, need_dw):
    return x.new_empty(x.shape), (weight.new_empty(weight.shape) if need_dw else weight.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, residual, weight, eps, offset = inputs
    y, s, rstd = output
    ctx.save_for_backward(s if residual is not None else x, weight, rstd)
    ctx.offset = offset
    ctx.has_residual = residual is not None


def _backward(ctx, dy, ds, drstd, bwd=_rms_norm_bwd):
    saved, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[2]
    if dy is None:  # only the residual sum was used downstream
        dy = torch.zeros_like(saved)
    dx, dw = bwd(dy, ds if ctx.has_residual else None, saved, weight, rstd, ctx.offset, need_dw)
    return dx, (dx if ctx.has_residual else None), (dw if need_dw else None), None, None


_rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


class _RMSNormFn(torch.autograd.Function):
    """Eager fast path: the same kernels and autograd as the custom op, without the custom-op
    dispatcher's per-call host overhead (tens of microseconds, comparable to the kernels
    themselves at LitGPT sizes). ``torch.compile`` traces the custom op instead (see ``_fwd``)."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset):
        out = _rms_norm_fwd_impl(x, residual, weight, eps, offset)
        ctx.set_materialize_grads(False)  # no zero-filled grads for rstd / an unused residual sum
        _setup_context(ctx, (x, residual, weight, eps, offset), out)
        ctx.mark_non_differentiable(out[2])
        return out

    @staticmethod
    def backward(ctx, dy, ds, drstd):
        return _backward(ctx, dy, ds, drstd, bwd=_rms_norm_bwd_impl)


def _fwd(x, residual, weight, eps, offset):
    if torch.compiler.is_compiling():
        return _rms_norm_fwd(x, residual, weight, eps, offset)
    return _RMSNormFn.apply(x, residual, weight, eps, offset)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
           names: tuple[str, str, str] = ("x", "residual", "weight")) -> None:
    """The inputs' checks, the errors naming them as the caller's arguments (``names``: x's, residual's, weight's)."""
    nx, nr, nw = names
    check_float(nx, x)
    check_float(nw, weight)
    if weight.dim() != 1:
        raise ValueError(f"{nw} must be 1-D (H,), got shape {tuple(weight.shape)}")
    check_last_dim(nx, x, weight.shape[0], f"the normalized size, {nw}.shape[0]")
    check_same_device(**{nx: x, nw: weight, nr: residual})
    if residual is not None:
        check_float(nr, residual)
        check_same_dtype(**{nx: x, nr: residual})
        if residual.shape != x.shape:
            raise ValueError(f"{nr} shape {tuple(residual.shape)} must equal {nx} shape {tuple(x.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0) -> torch.Tensor:
    """``litgpt.model.RMSNorm`` semantics: fp32 math, ``weight + offset``, output in ``x.dtype``."""
    _check(x, weight)
    if not use_triton(x):
        return rms_norm_reference(x, weight, eps, offset)
    y, _, _ = _fwd(x, None, weight, float(eps), float(offset))
    return y


def rms_norm_residual(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(s, rms_norm(s))`` with ``s = x + residual`` (in ``x.dtype``), in one kernel."""
    _check(x, weight, residual)
    if not use_triton(x):
        s = x + residual
        return s, rms_norm_reference(s, weight, eps, offset)
    y, s, _ = _fwd(x, residual, weight, float(eps), float(offset))
    return s, y


def rms_norm_again(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0) -> torch.Tensor:
    """:func:`rms_norm`'s output formed again, without autograd, from the input its backward keeps: for a reader of
    the normalized tensor that keeps ``x`` (which the norm keeps anyway) instead of its own copy. Bit for bit the
    forward's output: the same kernel on the same input (``x`` the residual sum ``s`` for :func:`rms_norm_residual`,
    whose kernel normalizes ``s`` rounded to its dtype), or the same reference on the reference path."""
    with torch.no_grad():
        if not use_triton(x):
            return rms_norm_reference(x, weight, eps, offset)
        return _rms_norm_fwd_impl(x, None, weight, float(eps), float(offset))[0]


# ----------------------------------------------------------------------------------------------
# A post-norm's output added to the residual stream, and the next norm of the sum (Gemma-2/3, OLMo-2)
# ----------------------------------------------------------------------------------------------
def rms_norm_add_reference(a: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
                           next_norm: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``s = rms_norm(a) + x`` (both rounded to ``x.dtype``, as LitGPT's ``post_norm(a) + x``) and, with
    ``next_norm = (weight, eps, offset)``, ``rms_norm(s)``; else None."""
    s = rms_norm_reference(a, weight, eps, offset) + x
    return s, (rms_norm_reference(s, *next_norm) if next_norm is not None else None)


@fast_launch
@triton.jit
def _rms_add_fwd_kernel(
    A, X, S, Y, WA, W, RSTD_A, RSTD,
    stride_a, stride_x, stride_s, stride_y,
    n_cols, eps_a, offset_a, eps, offset,
    HAS_NORM: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row: ``p = a * rstd_a * (wa + offset_a)`` rounded to the dtype, ``s = p + x`` rounded, and
    with HAS_NORM ``y = s * rstd * (w + offset)``: the same operations, in the same order, as
    :func:`_rms_fwd_kernel` for the post-norm and then with a residual for the next norm (bit for bit)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    a = tl.load(A + row * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    rstd_a = 1.0 / tl.sqrt(tl.sum(a * a, axis=0) / n_cols + eps_a)
    wa = tl.load(WA + cols, mask=mask, other=0.0).to(tl.float32) + offset_a
    p = (a * rstd_a * wa).to(S.dtype.element_ty)
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    s = (p.to(tl.float32) + x.to(tl.float32)).to(S.dtype.element_ty)
    tl.store(S + row * stride_s + cols, s, mask=mask)
    tl.store(RSTD_A + row, rstd_a)
    if HAS_NORM:
        sf = s.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
        tl.store(Y + row * stride_y + cols, (sf * rstd * w).to(Y.dtype.element_ty), mask=mask)
        tl.store(RSTD + row, rstd)


@fast_launch
@triton.jit
def _rms_add_bwd_kernel(
    DY, DS, S, A, W, WA, RSTD, RSTD_A, DX, DA, DW_PARTIAL,
    stride_dy, stride_ds, stride_s, stride_a, stride_dx, stride_da,
    n_rows, n_cols, offset, offset_a,
    HAS_DY: tl.constexpr, HAS_DS: tl.constexpr, NEED_DW: tl.constexpr, BLOCK: tl.constexpr,
):
    """Persistent over rows (as :func:`_rms_bwd_kernel`). The sum's gradient ``g = ds`` plus, with HAS_DY, the next
    norm's backward of ``dy``, rounded to the dtype: ``dx`` (the residual's gradient, and the post-norm output's);
    then the post-norm's backward of it, ``da``. With NEED_DW, fp32 partial rows of both weights' gradients:
    ``DW_PARTIAL[0, p]`` the post-norm's, ``DW_PARTIAL[1, p]`` the next norm's. Each norm's gradient is
    :func:`_rms_row_grad`'s, as in :func:`_rms_bwd_kernel`, so ``dx`` and ``da`` are bit for bit the two kernels'."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    wa = tl.load(WA + cols, mask=mask, other=0.0).to(tl.float32) + offset_a
    dwa_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if HAS_DY:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
        dw_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for row in range(pid, n_rows, n_prog):
        row64 = tl.cast(row, tl.int64)
        if HAS_DY:
            s = tl.load(S + row64 * stride_s + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row64)
            s_hat = s * rstd
            g = _rms_row_grad(s_hat, dy, w, rstd, n_cols)
            if HAS_DS:
                g += tl.load(DS + row64 * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
            if NEED_DW:
                dw_acc += dy * s_hat
        else:
            g = tl.load(DS + row64 * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
        g = g.to(DX.dtype.element_ty)
        tl.store(DX + row64 * stride_dx + cols, g, mask=mask)
        gf = g.to(tl.float32)
        a = tl.load(A + row64 * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
        rstd_a = tl.load(RSTD_A + row64)
        a_hat = a * rstd_a
        da = _rms_row_grad(a_hat, gf, wa, rstd_a, n_cols)
        tl.store(DA + row64 * stride_da + cols, da.to(DA.dtype.element_ty), mask=mask)
        if NEED_DW:
            dwa_acc += gf * a_hat
    if NEED_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dwa_acc, mask=mask)
        if HAS_DY:
            tl.store(DW_PARTIAL + (n_prog + pid) * n_cols + cols, dw_acc, mask=mask)


class _RMSNormAddFn(torch.autograd.Function):
    """``(s, y)`` of :func:`rms_norm_add` (``y`` an empty placeholder without a next norm) in one kernel each way;
    keeps ``a``, ``s`` (for the next norm) and the two ``rstd``."""

    @staticmethod
    def forward(ctx, a, x, weight, eps, offset, next_weight, next_eps, next_offset):
        a2, x2 = as_rows(a), as_rows(x)
        n_rows, n_cols = a2.shape
        has_norm = next_weight is not None
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        y = torch.empty(x.shape if has_norm else (0,), dtype=x.dtype, device=x.device)
        rstd_a = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(n_rows if has_norm else 0, dtype=torch.float32, device=x.device)
        if n_rows > 0:
            plan = row_plan(n_cols, x.element_size(), x.device)
            _rms_add_fwd_kernel[(n_rows,)](
                a2, x2, s, y, weight, next_weight if has_norm else weight, rstd_a, rstd,
                a2.stride(0), x2.stride(0), n_cols, n_cols,
                n_cols, eps, offset, next_eps, next_offset,
                HAS_NORM=has_norm, BLOCK=plan.block, num_warps=plan.num_warps,
            )
        ctx.set_materialize_grads(False)
        ctx.offsets = (offset, next_offset)
        ctx.save_for_backward(a, s if has_norm else None, weight, next_weight, rstd_a, rstd if has_norm else None)
        if not has_norm:
            ctx.mark_non_differentiable(y)
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):
        a, s, weight, next_weight, rstd_a, rstd = ctx.saved_tensors
        offset, next_offset = ctx.offsets
        need_dwa = ctx.needs_input_grad[2]
        need_dw = next_weight is not None and ctx.needs_input_grad[5]
        if ds is None and dy is None:
            return (None,) * 8
        has_dy = dy is not None and next_weight is not None
        a2 = as_rows(a)
        n_rows, n_cols = a2.shape
        dx = torch.empty((n_rows, n_cols), dtype=a.dtype, device=a.device)
        da = torch.empty((n_rows, n_cols), dtype=a.dtype, device=a.device)
        n_prog = partial_rows(n_rows, a.device)
        need_partials = need_dwa or (need_dw and has_dy)
        partial = torch.empty((2 if has_dy else 1, n_prog, n_cols) if need_partials else (0,), dtype=torch.float32,
                              device=a.device)
        dy2 = as_rows(dy) if has_dy else a2
        ds2 = as_rows(ds) if ds is not None else a2
        s2 = as_rows(s) if has_dy else a2
        if n_rows > 0:
            plan = row_plan(n_cols, a.element_size(), a.device)
            _rms_add_bwd_kernel[(n_prog,)](
                dy2, ds2, s2, a2, next_weight if has_dy else weight, weight, rstd if has_dy else rstd_a, rstd_a,
                dx, da, partial,
                dy2.stride(0), ds2.stride(0), s2.stride(0), a2.stride(0), dx.stride(0), da.stride(0),
                n_rows, n_cols, next_offset if has_dy else 0.0, offset,
                HAS_DY=has_dy, HAS_DS=ds is not None, NEED_DW=need_partials, BLOCK=plan.block,
                num_warps=plan.num_warps,
            )
        dwa = dw = None
        if need_partials:
            sums = partial.sum(1) if n_rows > 0 else partial.new_zeros(partial.shape[0], n_cols)  # (1 | 2, C)
            dwa = sums[0].to(weight.dtype) if need_dwa else None
            if need_dw:
                dw = sums[1].to(next_weight.dtype) if has_dy else torch.zeros_like(next_weight)
        elif need_dw:  # (only the sum was used downstream: the next norm's weight gets a zero gradient)
            dw = torch.zeros_like(next_weight)
        return da.view(a.shape), dx.view(a.shape), dwa, None, None, dw, None, None


def rms_norm_add(
    a: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0,
    next_norm: tuple[torch.Tensor, float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``s = rms_norm(a, weight) + x`` and, with ``next_norm = (weight, eps, offset)``, ``rms_norm(s, *next_norm)``
    (else None): LitGPT's ``x = post_attention_norm(attn) + x; norm_2(x)`` (Gemma-2/3) or ``post_mlp_norm(mlp) +
    x`` (Gemma-2/3, OLMo-2) in one kernel each way, each intermediate rounded to ``x.dtype`` where LitGPT rounds it,
    so ``s``, the next norm's output and the gradients of ``a`` and ``x`` are bit for bit those of :func:`rms_norm`
    followed by :func:`rms_norm_residual` (or, on a GPU, by PyTorch's add: Triton's interpreter truncates to 16 bits
    where PyTorch rounds to nearest). ``torch.compile`` traces that composition."""
    _check(a, weight, x, names=("a", "x", "weight"))
    if next_norm is not None:
        _check(x, next_norm[0], names=("x", "", "next_norm's weight"))
    if not use_triton(x):
        return rms_norm_add_reference(a, x, weight, eps, offset, next_norm)
    if torch.compiler.is_compiling():
        p = rms_norm(a, weight, eps, offset)
        if next_norm is None:
            return p + x, None
        return rms_norm_residual(p, x, *next_norm)
    nw, ne, no = next_norm if next_norm is not None else (None, 0.0, 0.0)
    s, y = _RMSNormAddFn.apply(a, x, weight, float(eps), float(offset), nw, float(ne), float(no))
    return s, (y if next_norm is not None else None)


# ----------------------------------------------------------------------------------------------
# Norm followed by the Linear layers reading it: the normalized tensor is recomputed in backward
# ----------------------------------------------------------------------------------------------
def _rms_norm_linear_impl(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float,
    w0: torch.Tensor, b0: torch.Tensor | None, w1: torch.Tensor | None, b1: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(s | empty, rstd, F.linear(n, w0, b0), F.linear(n, w1, b1) | empty)`` with ``n = rms_norm(s)``,
    ``s = x (+ residual)``: one or two Linears (LitGPT's ``attn.qkv``; ``mlp.fc_1`` and ``fc_2``)."""
    n, s, rstd = _rms_norm_fwd_impl(x, residual, weight, eps, offset)  # n: (..., C)
    out0 = F.linear(n, w0, b0)  # (..., out_0)
    out1 = F.linear(n, w1, b1) if w1 is not None else x.new_empty(0)  # (..., out_1)
    return s, rstd, out0, out1


_rms_norm_linear_op = torch.library.custom_op("lit_liger::rms_norm_linear", _rms_norm_linear_impl, mutates_args=())


@_rms_norm_linear_op.register_fake
def _(x, residual, weight, eps, offset, w0, b0, w1, b1):
    n_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    s = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    out1 = x.new_empty((*x.shape[:-1], w1.shape[0])) if w1 is not None else x.new_empty(0)
    return s, x.new_empty(n_rows, dtype=torch.float32), x.new_empty((*x.shape[:-1], w0.shape[0])), out1


def _rnl_setup_context(ctx, inputs, output):
    """Saves s (or x), the norm weight, rstd and the Linears' weights and biases: not the normalized n."""
    x, residual, weight, eps, offset, w0, b0, w1, b1 = inputs
    ctx.has_residual = residual is not None
    ctx.norm = (eps, offset)
    ctx.into = (target_for(w0), target_for(w1))  # (lit_liger.graphs: weight gradients added into .grad)
    ctx.save_for_backward(output[0] if residual is not None else x, weight, output[1], w0, b0, w1, b1)


def _rnl_backward(ctx, ds, drstd, dout0, dout1, norm_fwd=_rms_norm_fwd, norm_bwd=_rms_norm_bwd):
    """Reruns the forward kernel on the saved s (the same input and kernel, so the same n bit for bit)
    when a Linear weight needs its gradient, then the Linear gradients, then the norm backward."""
    saved, weight, rstd, *wb = ctx.saved_tensors
    eps, offset = ctx.norm
    needs = ctx.needs_input_grad  # x, residual, weight, eps, offset, w0, b0, w1, b1
    need_dw, need_in = needs[2], needs[0] or needs[1] or needs[2]
    douts = (dout0, dout1) if wb[2] is not None else (dout0,)
    n2 = None  # (N, C): the normalized input, recomputed only if a Linear weight needs its gradient
    if any(needs[5 + 2 * i] for i, d in enumerate(douts) if d is not None):
        n = norm_fwd(saved, None, weight, eps, offset)[0]  # (..., C)
        n2 = n.reshape(-1, n.shape[-1])
    dn = None  # (N, C): sum over the Linears of dout_i @ W_i (only if the norm's inputs need it)
    grads_wb = [None] * 4
    for i, dout in enumerate(douts):
        w_lin, b_lin = wb[2 * i], wb[2 * i + 1]
        if dout is None:
            continue
        d2 = dout.reshape(-1, dout.shape[-1])  # (N, out_i)
        grads_wb[2 * i] = weight_grad(ctx.into[i], d2.t(), n2) if needs[5 + 2 * i] else None  # (out_i, C)
        grads_wb[2 * i + 1] = d2.sum(0) if b_lin is not None and needs[6 + 2 * i] else None  # (out_i,)
        if need_in:
            dn = d2.mm(w_lin) if dn is None else dn.addmm_(d2, w_lin)  # (N, C)
    del n2
    if not need_in:
        return (None, None, None, None, None, *grads_wb)
    if dn is None:
        dn = torch.zeros_like(saved)
    dx, dw = norm_bwd(dn.view(saved.shape), ds if ctx.has_residual else None, saved, weight, rstd, offset, need_dw)
    return (dx, dx if ctx.has_residual else None, dw if need_dw else None, None, None, *grads_wb)


_rms_norm_linear_op.register_autograd(_rnl_backward, setup_context=_rnl_setup_context)


class _RMSNormLinearFn(torch.autograd.Function):
    """Eager form of ``lit_liger::rms_norm_linear`` (the same forward and autograd, without the custom
    op dispatcher's host overhead; no zero-filled gradients for unused outputs); ``torch.compile``
    traces the custom op, which its partitioner cannot look into, so the normalized tensor is not
    kept there either."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, w0, b0, w1, b1):
        out = _rms_norm_linear_impl(x, residual, weight, eps, offset, w0, b0, w1, b1)
        ctx.set_materialize_grads(False)
        _rnl_setup_context(ctx, (x, residual, weight, eps, offset, w0, b0, w1, b1), out)
        # rstd; the empty placeholders of an absent residual sum / second output (one call: each replaces the last)
        ctx.mark_non_differentiable(out[1], *([out[0]] if residual is None else []), *([out[3]] if w1 is None else []))
        return out

    @staticmethod
    def backward(ctx, ds, drstd, dout0, dout1):
        return _rnl_backward(ctx, ds, drstd, dout0, dout1, norm_fwd=_rms_norm_fwd_impl, norm_bwd=_rms_norm_bwd_impl)


def rms_norm_linear(
    x: torch.Tensor, weight: torch.Tensor, linears: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
    eps: float = 1e-6, offset: float = 0.0, residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``(s, [F.linear(rms_norm(s), W, b) for W, b in linears])`` with ``s = x + residual`` (``None``
    without a residual, where the norm reads ``x``). In training the normalized tensor is not kept
    for the Linears' backward (see the module docstring), in eager mode and under ``torch.compile``
    (a custom op, opaque to its partitioner). Without grad or with every Linear weight frozen, with
    more than two Linears, under autocast, with weights of another dtype and on the reference path it
    is the plain composition."""
    _check(x, weight, residual)
    if not linears:
        raise ValueError("rms_norm_linear needs at least one (weight, bias) pair")
    for i, (w_lin, b_lin) in enumerate(linears):
        check_float(f"linears[{i}] weight", w_lin)
        check_same_device(x=x, **{f"linears[{i}] weight": w_lin, f"linears[{i}] bias": b_lin})
        if w_lin.dim() != 2 or w_lin.shape[1] != x.shape[-1]:
            raise ValueError(f"linears[{i}] weight shape {tuple(w_lin.shape)} must be (out, {x.shape[-1]})")
        if b_lin is not None and b_lin.shape != (w_lin.shape[0],):
            raise ValueError(f"linears[{i}] bias shape {tuple(b_lin.shape)} must be ({w_lin.shape[0]},)")
    fused = (
        use_triton(x) and len(linears) <= 2 and torch.is_grad_enabled() and any(w.requires_grad for w, _ in linears)
        and not torch.is_autocast_enabled(x.device.type)
        and all(w.dtype == x.dtype and (b is None or b.dtype == x.dtype) for w, b in linears)
    )
    if not fused:
        if residual is None:
            s, n = None, rms_norm(x, weight, eps, offset)
        else:
            s, n = rms_norm_residual(x, residual, weight, eps, offset)
        return s, [F.linear(n, w, b) for w, b in linears]
    (w0, b0), (w1, b1) = linears[0], (linears[1] if len(linears) > 1 else (None, None))
    fn = _rms_norm_linear_op if torch.compiler.is_compiling() else _RMSNormLinearFn.apply
    s, _, out0, out1 = fn(x, residual, weight, float(eps), float(offset), w0, b0, w1, b1)
    return (s if residual is not None else None), ([out0, out1] if w1 is not None else [out0])
