"""GELU, the activation of LitGPT's ``GptNeoxMLP`` (Pythia, Falcon, phi, StableLM-alpha, RedPajama-INCITE).

``gelu(a, approximate)`` equals ``F.gelu(a, approximate=approximate)`` (``"none"``: exact, erf; ``"tanh"``:
phi-1.5 / phi-2's ``gelu_approximate``). The math runs in fp32 and the result is rounded once to the input
dtype. The forward saves only ``a`` (the pre-activation); the backward recomputes ``act'(a)`` from it. The
activation and its derivative are ``kernels.swiglu``'s device function (one formula for GeGLU and GELU).

``gelu_linear(a, weight, bias, approximate)`` is ``F.linear(gelu(a), weight, bias)`` (the MLP's ``proj``)
saving only ``a`` for backward: a plain ``proj(gelu(fc(x)))`` keeps both ``fc``'s ``(N, I)`` output (for the
GELU backward) and the GELU's ``(N, I)`` output (for ``proj``'s weight gradient). Here the backward gets the
GELU output back from ``a`` in the same elementwise pass that computes ``d a``: one ``(N, I)`` tensor per layer
fewer, no extra pass over memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import as_rows, check_float, check_same_device
from ._grad_into import target_for, weight_grad
from ._launch import fast_launch, use_triton
from .swiglu import ACTIVATIONS, _act_and_grad, _launch_shape, _plan, _tile

__all__ = ["gelu", "gelu_linear", "gelu_reference"]

_APPROXIMATE = {"tanh": "gelu_tanh", "none": "gelu"}


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and tests' second opinion; the tests' primary reference is fp64 PyTorch)
# ----------------------------------------------------------------------------------------------
def gelu_reference(a: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``F.gelu(a, approximate)`` in fp32, rounded once to ``a.dtype``."""
    return torch.nn.functional.gelu(a.float(), approximate=approximate).to(a.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels (the tiling of kernels.swiglu: flat 1-D launch for contiguous tensors)
# ----------------------------------------------------------------------------------------------
@fast_launch
@triton.jit
def _gelu_fwd_kernel(A, Y, stride_a, n_cols, n_col_blocks, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    """One program per tile of BLOCK columns of one row. Reads a (last dim contiguous, any row stride);
    writes y = gelu(a) to the contiguous output."""
    row, col0, offs, mask = _tile(tl.program_id(0), n_cols, n_col_blocks, BLOCK)
    a = tl.load(A + (row * stride_a + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    act, _ = _act_and_grad(a, ACTIVATION, False)
    tl.store(Y + (row * n_cols + col0) + offs, act.to(Y.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _gelu_bwd_kernel(
    DY, A, DA, stride_dy, stride_a, n_cols, n_col_blocks,
    ACTIVATION: tl.constexpr, WRITE_H: tl.constexpr, BLOCK: tl.constexpr,
):
    """Same tiling as the forward. Reads dy and a; writes da = dy * gelu'(a) (contiguous) and, with WRITE_H, the
    forward's gelu(a) over dy (every load comes before the program's first store)."""
    row, col0, offs, mask = _tile(tl.program_id(0), n_cols, n_col_blocks, BLOCK)
    dy = tl.load(DY + (row * stride_dy + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + (row * stride_a + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    act, dact = _act_and_grad(a, ACTIVATION, True)
    tl.store(DA + (row * n_cols + col0) + offs, (dy * dact).to(DA.dtype.element_ty), mask=mask)
    if WRITE_H:
        tl.store(DY + (row * stride_dy + col0) + offs, act.to(DY.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
def _gelu_fwd_impl(a: torch.Tensor, activation: str) -> torch.Tensor:
    y = torch.empty(a.shape, dtype=a.dtype, device=a.device)  # contiguous
    if a.numel() > 0:
        a2 = as_rows(a)  # (N, I)
        n_rows, n_cols, (s_a,) = _launch_shape([a2])
        plan, n_col_blocks, grid = _plan(n_rows, n_cols, a.device)
        _gelu_fwd_kernel[grid](a2, y, s_a, n_cols, n_col_blocks,
                               ACTIVATION=ACTIVATIONS[activation], BLOCK=plan.block, num_warps=plan.num_warps)
    return y


_gelu_fwd = torch.library.custom_op("lit_liger::gelu_fwd", _gelu_fwd_impl, mutates_args=())


@_gelu_fwd.register_fake
def _(a, activation):
    return a.new_empty(a.shape)


def _gelu_bwd_launch(dy: torch.Tensor, a: torch.Tensor, activation: str, write_h: bool) -> torch.Tensor:
    """New contiguous ``da``; with ``write_h`` (``dy`` fresh and contiguous, owned by the caller) ``gelu(a)`` over
    ``dy``."""
    da = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    if a.numel() > 0:
        dy2, a2 = as_rows(dy), as_rows(a)  # (N, I)
        if write_h and dy2.data_ptr() != dy.data_ptr():
            raise AssertionError("write_h needs dy's own rows (a view), not a copy")
        n_rows, n_cols, (s_dy, s_a) = _launch_shape([dy2, a2])
        plan, n_col_blocks, grid = _plan(n_rows, n_cols, a.device)
        _gelu_bwd_kernel[grid](dy2, a2, da, s_dy, s_a, n_cols, n_col_blocks,
                               ACTIVATION=ACTIVATIONS[activation], WRITE_H=write_h, BLOCK=plan.block,
                               num_warps=plan.num_warps)
    return da


def _gelu_bwd_impl(dy: torch.Tensor, a: torch.Tensor, activation: str) -> torch.Tensor:
    return _gelu_bwd_launch(dy, a, activation, False)


_gelu_bwd = torch.library.custom_op("lit_liger::gelu_bwd", _gelu_bwd_impl, mutates_args=())


@_gelu_bwd.register_fake
def _(dy, a, activation):
    return a.new_empty(a.shape)


def _setup_context(ctx, inputs, output):
    a, activation = inputs
    ctx.save_for_backward(a)  # only the pre-activation: gelu'(a) is recomputed in the backward
    ctx.activation = activation


def _backward(ctx, dy, bwd=_gelu_bwd):
    (a,) = ctx.saved_tensors
    return bwd(dy, a, ctx.activation), None


_gelu_fwd.register_autograd(_backward, setup_context=_setup_context)


class _GeluFn(torch.autograd.Function):
    """Eager fast path: the same kernels and autograd as the custom op, without the custom-op dispatcher's
    per-call host overhead. ``torch.compile`` traces the custom op instead."""

    @staticmethod
    def forward(ctx, a, activation):
        y = _gelu_fwd_impl(a, activation)
        _setup_context(ctx, (a, activation), y)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _backward(ctx, dy, bwd=_gelu_bwd_impl)


# ----------------------------------------------------------------------------------------------
# GELU + down projection: ``proj(gelu(a))`` without saving the GELU's output
# ----------------------------------------------------------------------------------------------
def _gelu_linear_impl(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
                      ) -> torch.Tensor:
    return torch.nn.functional.linear(_gelu_fwd_impl(a, activation), weight, bias)  # (..., C)


_gelu_linear_op = torch.library.custom_op("lit_liger::gelu_linear", _gelu_linear_impl, mutates_args=())


@_gelu_linear_op.register_fake
def _(a, weight, bias, activation):
    return a.new_empty((*a.shape[:-1], weight.shape[0]))


def _gelu_bwd_h_impl(dh: torch.Tensor, a: torch.Tensor, activation: str) -> torch.Tensor:
    """``gelu_linear``'s backward with the input's and the weight's gradients: new ``da``, and ``gelu(a)`` written
    over ``dh`` (fresh, contiguous), which the weight gradient then reads."""
    return _gelu_bwd_launch(dh, a, activation, True)


# mutates ``dh`` (declared: functionalized under torch.compile, which keeps it in place where dh has no other reader)
_gelu_bwd_h = torch.library.custom_op("lit_liger::gelu_bwd_h", _gelu_bwd_h_impl, mutates_args=("dh",))


@_gelu_bwd_h.register_fake
def _(dh, a, activation):
    return a.new_empty(a.shape)


def _gl_setup_context(ctx, inputs, output):
    a, weight, bias, activation = inputs
    ctx.save_for_backward(a, weight)  # not gelu(a): recomputed for the weight gradient
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.into = target_for(weight)  # (lit_liger.graphs: the weight gradient added into .grad)


def _gl_backward(ctx, dy, gelu_fwd=_gelu_fwd, gelu_bwd=_gelu_bwd, gelu_bwd_h=_gelu_bwd_h):
    """With the weight's gradient and the input's: one elementwise pass writes ``d a`` and, over ``d h`` (which it
    has just read), ``gelu(a)`` for the weight gradient. Only the weight's: ``gelu(a)`` recomputed. Only the
    input's: the GELU backward."""
    a, weight = ctx.saved_tensors
    need_da, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_dbias = ctx.has_bias and ctx.needs_input_grad[2]
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, C)
    da = dw = None
    if need_dw and need_da:
        dh = dy.matmul(weight)  # (..., I): new, contiguous
        da = gelu_bwd_h(dh, a, ctx.activation)
        dw = weight_grad(ctx.into, dy2.t(), dh.reshape(-1, dh.shape[-1]))  # (C, I), from gelu(a) now in dh
        del dh
    elif need_dw:
        h = gelu_fwd(a, ctx.activation)  # recomputed (..., I)
        dw = weight_grad(ctx.into, dy2.t(), h.reshape(-1, h.shape[-1]))  # (C, I)
        del h
    elif need_da:
        da = gelu_bwd(dy.matmul(weight), a, ctx.activation)  # (..., I)
    dbias = dy2.sum(0) if need_dbias else None
    return da, dw, dbias, None


_gelu_linear_op.register_autograd(_gl_backward, setup_context=_gl_setup_context)


class _GeluLinearFn(torch.autograd.Function):
    """Eager form of ``lit_liger::gelu_linear`` (the same forward and autograd, without the dispatcher)."""

    @staticmethod
    def forward(ctx, a, weight, bias, activation):
        y = _gelu_linear_impl(a, weight, bias, activation)
        _gl_setup_context(ctx, (a, weight, bias, activation), y)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _gl_backward(ctx, dy, gelu_fwd=_gelu_fwd_impl, gelu_bwd=_gelu_bwd_impl, gelu_bwd_h=_gelu_bwd_h_impl)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _activation(approximate: str) -> str:
    if not isinstance(approximate, str) or approximate not in _APPROXIMATE:
        raise ValueError(f"approximate must be 'none' or 'tanh' (as in F.gelu), got {approximate!r}")
    return _APPROXIMATE[approximate]


def _check(a: torch.Tensor) -> None:
    check_float("a", a)
    if a.dim() == 0:
        raise ValueError("a must have at least one dimension (..., I)")


def gelu(a: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``F.gelu(a, approximate=approximate)`` (``litgpt.model.GptNeoxMLP``); ``approximate`` is ``"none"`` (exact,
    erf) or ``"tanh"``. fp32 math, output in ``a.dtype``; only ``a`` is kept for backward."""
    activation = _activation(approximate)
    _check(a)
    if not use_triton(a):
        return gelu_reference(a, approximate)
    if torch.compiler.is_compiling():
        return _gelu_fwd(a, activation)
    return _GeluFn.apply(a, activation)


def gelu_linear(
    a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, approximate: str = "none"
) -> torch.Tensor:
    """``F.linear(gelu(a, approximate), weight, bias)`` (``GptNeoxMLP``'s ``proj(gelu(fc(x)))`` after ``fc``),
    saving only ``a`` for backward, in eager mode and under ``torch.compile`` (a custom op). On the reference path
    the plain composition."""
    activation = _activation(approximate)
    _check(a)
    check_float("weight", weight)
    check_same_device(a=a, weight=weight, bias=bias)
    if weight.dim() != 2 or weight.shape[1] != a.shape[-1]:
        raise ValueError(f"weight shape {tuple(weight.shape)} must be (C, {a.shape[-1]}) for a of shape "
                         f"{tuple(a.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias shape {tuple(bias.shape)} must be ({weight.shape[0]},)")
    if not use_triton(a):
        return torch.nn.functional.linear(gelu_reference(a, approximate), weight, bias)
    if torch.compiler.is_compiling():
        return _gelu_linear_op(a, weight, bias, activation)
    return _GeluLinearFn.apply(a, weight, bias, activation)
