"""SwiGLU and GeGLU, the gated activations of LitGPT's ``LLaMAMLP`` and ``GemmaMLP``.

``swiglu(a, b)`` equals ``F.silu(a) * b`` (``LLaMAMLP``: ``a = fc_1(x)``, ``b = fc_2(x)``) and
``geglu(a, b, approximate)`` equals ``F.gelu(a, approximate=approximate) * b`` (``GemmaMLP``, whose
configs use ``gelu_approximate="tanh"``). PyTorch computes those in the input dtype; here the math
runs in fp32 and the result is rounded once to the input dtype.

One forward and one backward kernel serve the three activations through a constexpr selector. The
forward saves only ``a`` and ``b``; the backward recomputes the activation from ``a`` in fp32, so no
intermediate activation is ever stored.

Every activation is written as ``act(a) = a * sigmoid(z(a))``:

* silu:        ``z = a``;
* gelu (tanh): ``z = 2 * sqrt(2/pi) * (a + 0.044715 a^3)``, because ``0.5 * (1 + tanh(u)) = sigmoid(2u)``;

so ``act'(a) = s + a * s * (1 - s) * z'(a)`` with ``s = sigmoid(z)``, which avoids the cancellation of
``1 - tanh^2`` near saturation. The exact gelu uses ``erf``:
``act = 0.5 a (1 + erf(a / sqrt 2))``, ``act' = 0.5 (1 + erf(a / sqrt 2)) + a * exp(-a^2 / 2) / sqrt(2 pi)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import as_rows, check_float, check_same_device, check_same_dtype, owns_storage
from . import _launch
from ._grad_into import target_for, weight_grad
from ._launch import cdiv, elementwise_plan, fast_launch, use_triton
from .rms_norm import _rms_norm_bwd_impl, _rms_norm_fwd_impl, _rms_norm_linear_impl, rms_norm_linear

__all__ = ["swiglu", "geglu", "glu_linear", "glu_mlp", "glu_reference", "ACTIVATIONS"]

# activation name (as used by the custom ops) -> constexpr selector of the kernels
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "gelu": 2}
_APPROXIMATE = {"tanh": "gelu_tanh", "none": "gelu"}


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and tests' second opinion; the tests' primary reference is fp64 PyTorch)
# ----------------------------------------------------------------------------------------------
def glu_reference(a: torch.Tensor, b: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``act(a) * b`` in fp32, rounded once to ``a.dtype`` (``activation``: silu, gelu_tanh, gelu)."""
    af = a.float()
    if activation == "silu":
        act = torch.nn.functional.silu(af)
    elif activation == "gelu_tanh":
        act = torch.nn.functional.gelu(af, approximate="tanh")
    elif activation == "gelu":
        act = torch.nn.functional.gelu(af, approximate="none")
    else:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return (act * b.float()).to(a.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _act_and_grad(a, ACTIVATION: tl.constexpr, NEED_GRAD: tl.constexpr):
    """fp32 ``act(a)`` and, with NEED_GRAD, ``act'(a)`` (else 0.0). Constants: 1/sqrt(2), 1/sqrt(2 pi),
    2 sqrt(2/pi) and 3 * 0.044715."""
    if ACTIVATION == 2:  # exact gelu
        cdf = 0.5 * (1.0 + tl.math.erf(a * 0.7071067811865476))
        act = a * cdf
        if NEED_GRAD:
            dact = cdf + a * tl.exp(-0.5 * a * a) * 0.3989422804014327
        else:
            dact = 0.0
    else:
        if ACTIVATION == 1:  # gelu, tanh approximation: a * sigmoid(2 u)
            z = 1.5957691216057308 * (a + 0.044715 * a * a * a)
            dz = 1.5957691216057308 * (1.0 + 0.134145 * a * a)
        else:  # silu: a * sigmoid(a)
            z = a
            dz = 1.0
        s = tl.sigmoid(z)
        act = a * s
        if NEED_GRAD:
            dact = s + act * (1.0 - s) * dz
        else:
            dact = 0.0
    return act, dact


@triton.jit
def _tile(pid, n_cols, n_col_blocks, BLOCK: tl.constexpr):
    """Tile ``pid`` -> (row, first column, in-tile column offsets, mask). int64 row/column bases so
    that ``row * stride`` and flat indices past 2**31 are safe; the per-lane offsets stay int32."""
    pid = pid.to(tl.int64)
    row = pid // n_col_blocks
    col0 = (pid - row * n_col_blocks) * BLOCK
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols - col0
    return row, col0, offs, mask


@fast_launch
@triton.jit
def _glu_fwd_kernel(
    A, B, Y,
    stride_a, stride_b,
    n_cols, n_col_blocks,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per tile of BLOCK columns of one row (row = pid // n_col_blocks). Reads a and b
    (last dim contiguous, any row stride); writes y = act(a) * b to the contiguous output. Fully
    contiguous inputs are launched as one row of a.numel() columns (a flat 1-D grid)."""
    row, col0, offs, mask = _tile(tl.program_id(0), n_cols, n_col_blocks, BLOCK)
    a = tl.load(A + (row * stride_a + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + (row * stride_b + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    act, _ = _act_and_grad(a, ACTIVATION, False)
    tl.store(Y + (row * n_cols + col0) + offs, (act * b).to(Y.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _glu_bwd_kernel(
    DY, A, B, DA, DB, PARTIAL,
    stride_dy, stride_a, stride_b,
    n_cols, n_col_blocks,
    ACTIVATION: tl.constexpr, NEED_DA: tl.constexpr, NEED_DB: tl.constexpr, WRITE_H: tl.constexpr,
    BLOCK: tl.constexpr, AMAX: tl.constexpr = False,
):
    """Same tiling as the forward. Reads dy, a (and b only if NEED_DA or WRITE_H); recomputes act(a) in
    fp32; writes da = dy * b * act'(a) (if NEED_DA) and db = dy * act(a) (if NEED_DB) to contiguous
    outputs and, with WRITE_H, the forward's product act(a) * b over dy (every load comes before the
    program's first store, so outputs may alias the inputs they replace). With AMAX (NEED_DA and NEED_DB) the
    program also writes max |da| and max |db| of its tile (as stored) to PARTIAL[2 pid], PARTIAL[2 pid + 1]
    (``kernels.float8``'s tensorwise scales of the two gradients)."""
    row, col0, offs, mask = _tile(tl.program_id(0), n_cols, n_col_blocks, BLOCK)
    dy = tl.load(DY + (row * stride_dy + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + (row * stride_a + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    act, dact = _act_and_grad(a, ACTIVATION, NEED_DA)
    out = row * n_cols + col0
    if NEED_DA or WRITE_H:
        b = tl.load(B + (row * stride_b + col0) + offs, mask=mask, other=0.0).to(tl.float32)
    if NEED_DA:
        da = (dy * b * dact).to(DA.dtype.element_ty)
        tl.store(DA + out + offs, da, mask=mask)
    if NEED_DB:
        db = (dy * act).to(DB.dtype.element_ty)
        tl.store(DB + out + offs, db, mask=mask)
    if AMAX:  # masked lanes are 0 (dy = 0 there)
        tl.store(PARTIAL + 2 * tl.program_id(0), tl.max(tl.abs(da.to(tl.float32)), axis=0))
        tl.store(PARTIAL + 2 * tl.program_id(0) + 1, tl.max(tl.abs(db.to(tl.float32)), axis=0))
    if WRITE_H:
        tl.store(DY + (row * stride_dy + col0) + offs, (act * b).to(DY.dtype.element_ty), mask=mask)


def _launch_shape(rows: list[torch.Tensor]) -> tuple[int, int, list[int]]:
    """(n_rows, n_cols, row strides) for the kernels. All-contiguous operands become one long row
    (flat 1-D launch, no partial tile at every row end); otherwise one tile row per tensor row."""
    n_rows, n_cols = rows[0].shape
    if all(t.stride(0) == n_cols or n_rows == 1 for t in rows):
        return 1, n_rows * n_cols, [n_rows * n_cols] * len(rows)
    return n_rows, n_cols, [t.stride(0) for t in rows]


def _plan(n_rows: int, n_cols: int, device: torch.device):
    # Block: elementwise_plan's 1024 elements (2048 on warp-64 devices) with 4 warps = 8 elements per
    # thread, i.e. one 16-byte load per operand per thread for 16-bit types. The op is bandwidth bound:
    # ~16 such programs per SM keep far more bytes in flight than Little's law asks for on an H100
    # (~15 KB per SM), and small tiles leave no long tail. Narrow rows get next_power_of_2(n_cols).
    plan = elementwise_plan(n_cols, device)
    n_col_blocks = cdiv(n_cols, plan.block)
    return plan, n_col_blocks, (n_rows * n_col_blocks,)


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
def _glu_fwd_launch(a: torch.Tensor, b: torch.Tensor, y: torch.Tensor, activation: str) -> None:
    """The forward kernel: ``y = act(a) * b`` into contiguous ``y`` (which may be ``a`` itself where ``a`` is
    contiguous: each element is read before its own program writes it)."""
    if a.numel() > 0:
        a2, b2 = as_rows(a), as_rows(b)  # (N, I), last dim contiguous, any row stride
        n_rows, n_cols, (s_a, s_b) = _launch_shape([a2, b2])
        plan, n_col_blocks, grid = _plan(n_rows, n_cols, a.device)
        _glu_fwd_kernel[grid](
            a2, b2, y,
            s_a, s_b,
            n_cols, n_col_blocks,
            ACTIVATION=ACTIVATIONS[activation], BLOCK=plan.block, num_warps=plan.num_warps,
        )


def _glu_fwd_impl(a: torch.Tensor, b: torch.Tensor, activation: str) -> torch.Tensor:
    y = torch.empty(a.shape, dtype=a.dtype, device=a.device)  # contiguous
    _glu_fwd_launch(a, b, y, activation)
    return y


_glu_fwd = torch.library.custom_op("lit_liger::glu_fwd", _glu_fwd_impl, mutates_args=())


@_glu_fwd.register_fake
def _(a, b, activation):
    return a.new_empty(a.shape)  # contiguous, as the real op


def _glu_bwd_launch(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, da: torch.Tensor, db: torch.Tensor, activation: str,
    need_da: bool, need_db: bool, write_h: bool = False, amax: bool = False,
) -> torch.Tensor | None:
    """The backward kernel: ``da``/``db`` (contiguous, ``a``'s shape, or anything where not needed) written;
    ``write_h``: the forward's product ``act(a) * b`` written over ``dy`` (contiguous, owned by the caller);
    ``amax`` (both gradients needed): returns ``(max |da|, max |db|)``, fp32, ``(2,)``."""
    if amax and a.numel() == 0:
        return torch.zeros(2, dtype=torch.float32, device=a.device)
    if a.numel() > 0 and (need_da or need_db or write_h):
        dy2, a2, b2 = as_rows(dy), as_rows(a), as_rows(b)  # (N, I)
        if write_h and dy2.data_ptr() != dy.data_ptr():
            raise AssertionError("write_h needs dy's own rows (a view), not a copy")
        n_rows, n_cols, (s_dy, s_a, s_b) = _launch_shape([dy2, a2, b2])
        plan, n_col_blocks, grid = _plan(n_rows, n_cols, a.device)
        partial = torch.empty((grid[0], 2) if amax else (0,), dtype=torch.float32, device=a.device)
        _glu_bwd_kernel[grid](
            dy2, a2, b2, da if need_da else db, db if need_db else da, partial,
            s_dy, s_a, s_b,
            n_cols, n_col_blocks,
            ACTIVATION=ACTIVATIONS[activation], NEED_DA=need_da, NEED_DB=need_db, WRITE_H=write_h,
            BLOCK=plan.block, AMAX=amax, num_warps=plan.num_warps,
        )
        if amax:
            return partial.amax(0)
    return None


def _glu_bwd_impl(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str, need_da: bool, need_db: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _glu_bwd_new_outputs(dy, a, b, activation, need_da, need_db)


def _glu_bwd_new_outputs(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str, need_da: bool, need_db: bool,
    write_h: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward into new ``da``/``db`` (the custom op's implementation; ``write_h`` in eager mode only)."""
    da = torch.empty(a.shape if need_da else (0,), dtype=a.dtype, device=a.device)
    db = torch.empty(b.shape if need_db else (0,), dtype=b.dtype, device=b.device)
    _glu_bwd_launch(dy, a, b, da, db, activation, need_da, need_db, write_h)
    return da, db


def _glu_bwd_into_inputs(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str, need_da: bool, need_db: bool,
    write_h: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager only (``reuse_inputs``): the gradients are written over ``a`` and ``b`` (each element is read
    before its own program overwrites it), whose version counters are bumped, so that a second backward
    through them (``retain_graph``) raises PyTorch's in-place error instead of reading gradients."""
    da = a if need_da else a.new_empty(0)
    db = b if need_db else b.new_empty(0)
    _glu_bwd_launch(dy, a, b, da, db, activation, need_da, need_db, write_h)
    torch.autograd.graph.increment_version([t for t, n in ((a, need_da), (b, need_db)) if n])
    return da, db


def _reusable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` each own their whole storage, contiguously, and not the same one: writing each one's
    gradient over it touches no other tensor's memory."""
    return (a.is_contiguous() and b.is_contiguous() and owns_storage(a) and owns_storage(b)
            and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr())


_glu_bwd = torch.library.custom_op("lit_liger::glu_bwd", _glu_bwd_impl, mutates_args=())


def _glu_bwd_amax_impl(
    dy: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(da, db, (max |da|, max |db|))``: the backward into new tensors, and the two gradients' maxima (float8)."""
    da, db = torch.empty(a.shape, dtype=a.dtype, device=a.device), torch.empty(b.shape, dtype=b.dtype, device=b.device)
    amax = _glu_bwd_launch(dy, a, b, da, db, activation, True, True, amax=True)
    return da, db, amax


_glu_bwd_amax = torch.library.custom_op("lit_liger::glu_bwd_amax", _glu_bwd_amax_impl, mutates_args=())


@_glu_bwd_amax.register_fake
def _(dy, a, b, activation):
    return a.new_empty(a.shape), b.new_empty(b.shape), a.new_empty(2, dtype=torch.float32)


@_glu_bwd.register_fake
def _(dy, a, b, activation, need_da, need_db):
    return (a.new_empty(a.shape) if need_da else a.new_empty(0)), (b.new_empty(b.shape) if need_db else b.new_empty(0))


def _setup_context(ctx, inputs, output):
    a, b, activation = inputs
    ctx.save_for_backward(a, b)  # only the inputs: the activation is recomputed in the backward
    ctx.activation = activation


def _backward(ctx, dy, bwd=_glu_bwd):
    a, b = ctx.saved_tensors
    need_da, need_db = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if getattr(ctx, "reuse", False):
        bwd = _glu_bwd_into_inputs
    da, db = bwd(dy, a, b, ctx.activation, need_da, need_db)
    return (da if need_da else None), (db if need_db else None), None


_glu_fwd.register_autograd(_backward, setup_context=_setup_context)


class _GLUFn(torch.autograd.Function):
    """Eager fast path: the same kernels and autograd as the custom op, without the custom-op
    dispatcher's per-call host overhead (tens of microseconds, comparable to the kernels
    themselves at LitGPT sizes). ``torch.compile`` traces the custom op instead (see ``_fwd``)."""

    @staticmethod
    def forward(ctx, a, b, activation, reuse):
        y = _glu_fwd_impl(a, b, activation)
        _setup_context(ctx, (a, b, activation), y)
        ctx.reuse = reuse and _reusable(a, b)
        return y

    @staticmethod
    def backward(ctx, dy):
        return (*_backward(ctx, dy, bwd=_glu_bwd_impl), None)  # no gradient for ``reuse``


def _fwd(a, b, activation, reuse=False):
    if torch.compiler.is_compiling():
        return _glu_fwd(a, b, activation)  # the compiler plans the memory; the op mutates nothing
    return _GLUFn.apply(a, b, activation, reuse)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    check_float("a", a)
    check_float("b", b)
    check_same_device(a=a, b=b)
    check_same_dtype(a=a, b=b)
    if a.shape != b.shape:
        raise ValueError(f"a has shape {tuple(a.shape)} but b has shape {tuple(b.shape)}; they must match")
    if a.dim() == 0:
        raise ValueError("a and b must have at least one dimension (..., I)")


_REUSE_DOC = """``reuse_inputs``: the backward writes the gradients of ``a`` and ``b`` over ``a`` and ``b`` instead of
    allocating two more ``(..., I)`` tensors at its peak (eager Triton path only; ignored where ``a``/``b`` do
    not each own their whole storage, under ``torch.compile`` and on the reference path). Only for ``a`` and
    ``b`` that nothing reads after the forward (fresh outputs of the MLP's ``fc_1`` / ``fc_2``): after the
    backward they hold gradients; a second backward through them raises."""


def _glu(a: torch.Tensor, b: torch.Tensor, activation: str, reuse_inputs: bool = False) -> torch.Tensor:
    _check(a, b)
    if not use_triton(a):
        return glu_reference(a, b, activation)
    return _fwd(a, b, activation, reuse_inputs)


def swiglu(a: torch.Tensor, b: torch.Tensor, *, reuse_inputs: bool = False) -> torch.Tensor:
    """``F.silu(a) * b`` (``litgpt.model.LLaMAMLP``); ``a``, ``b``: ``(..., I)``, same shape and dtype.
    {reuse}"""
    return _glu(a, b, "silu", reuse_inputs)


def geglu(a: torch.Tensor, b: torch.Tensor, approximate: str = "tanh", *, reuse_inputs: bool = False) -> torch.Tensor:
    """``F.gelu(a, approximate=approximate) * b`` (``litgpt.model.GemmaMLP``); ``approximate`` is
    ``"tanh"`` (Gemma's ``gelu_approximate``) or ``"none"`` (exact, erf). {reuse}"""
    if not isinstance(approximate, str) or approximate not in _APPROXIMATE:
        raise ValueError(f"approximate must be 'tanh' or 'none' (as in F.gelu), got {approximate!r}")
    return _glu(a, b, _APPROXIMATE[approximate], reuse_inputs)


for _f in (swiglu, geglu):
    if _f.__doc__:  # (None under python -OO)
        _f.__doc__ = _f.__doc__.format(reuse=_REUSE_DOC)


# ----------------------------------------------------------------------------------------------
# GLU + down projection: the MLP's ``proj(glu(fc_1(x), fc_2(x)))`` without saving glu's output
# ----------------------------------------------------------------------------------------------
def _glu_linear_impl(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    return torch.nn.functional.linear(_glu_fwd_impl(a, b, activation), weight, bias)  # (..., C)


_glu_linear_op = torch.library.custom_op("lit_liger::glu_linear", _glu_linear_impl, mutates_args=())


@_glu_linear_op.register_fake
def _(a, b, weight, bias, activation):
    return a.new_empty((*a.shape[:-1], weight.shape[0]))


def _glu_bwd_h_impl(
    dh: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str, need_da: bool, need_db: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``glu_linear``'s backward with an input gradient and the weight's: new ``da``/``db``, and the forward's
    product ``act(a) * b`` written over ``dh`` (fresh, contiguous), which the weight gradient then reads."""
    return _glu_bwd_new_outputs(dh, a, b, activation, need_da, need_db, write_h=True)


# mutates ``dh`` (declared: functionalized under torch.compile, which keeps it in place where dh has no other reader)
_glu_bwd_h = torch.library.custom_op("lit_liger::glu_bwd_h", _glu_bwd_h_impl, mutates_args=("dh",))


@_glu_bwd_h.register_fake
def _(dh, a, b, activation, need_da, need_db):
    return (a.new_empty(a.shape) if need_da else a.new_empty(0)), (b.new_empty(b.shape) if need_db else b.new_empty(0))


def _gl_setup_context(ctx, inputs, output):
    a, b, weight, bias, activation = inputs
    ctx.save_for_backward(a, b, weight)  # not the GLU product: recomputed for the weight gradient
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.into = target_for(weight)  # (lit_liger.graphs: the weight gradient added into .grad)


def _gl_backward(ctx, dy, glu_fwd=_glu_fwd, glu_bwd=_glu_bwd, glu_bwd_h=_glu_bwd_h):
    """``glu_linear``'s backward (the custom op's; the eager function passes the plain implementations).

    With the weight's gradient and an input's: one elementwise kernel writes ``d a``, ``d b`` and, over ``d h``
    (which it has just read), the product the weight gradient needs: no recompute pass reading ``a`` and ``b``
    again, no more memory than the recompute's ``(N, I)`` tensor. Only the weight's: the product recomputed.
    Only inputs': the GLU backward."""
    a, b, weight = ctx.saved_tensors
    reuse = getattr(ctx, "reuse", False)  # eager only: the input gradients written over a and b
    need_da, need_db, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    need_dbias = ctx.has_bias and ctx.needs_input_grad[3]
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, C)
    dw = da = db = None
    if need_dw and (need_da or need_db):
        dh = dy.matmul(weight)  # (..., I): new, contiguous
        if reuse:
            da, db = _glu_bwd_into_inputs(dh, a, b, ctx.activation, need_da, need_db, write_h=True)
        else:
            da, db = glu_bwd_h(dh, a, b, ctx.activation, need_da, need_db)
        dw = weight_grad(ctx.into, dy2.t(), dh.reshape(-1, dh.shape[-1]))  # (C, I), from the product now in dh
        del dh
    elif need_dw:
        h = glu_fwd(a, b, ctx.activation)  # recomputed (..., I)
        dw = weight_grad(ctx.into, dy2.t(), h.reshape(-1, h.shape[-1]))  # (C, I)
        del h
    elif need_da or need_db:
        dh = dy.matmul(weight)  # (..., I)
        da, db = (_glu_bwd_into_inputs if reuse else glu_bwd)(dh, a, b, ctx.activation, need_da, need_db)
    dbias = dy2.sum(0) if need_dbias else None
    return (da if need_da else None), (db if need_db else None), dw, dbias, None


_glu_linear_op.register_autograd(_gl_backward, setup_context=_gl_setup_context)


class _GLULinearFn(torch.autograd.Function):
    """``F.linear(glu(a, b), weight, bias)`` that saves only ``a`` and ``b`` for backward; the eager
    form of ``lit_liger::glu_linear`` (same forward and autograd, without the dispatcher's overhead),
    which ``torch.compile`` traces instead (opaque to its partitioner, so the product is not kept
    there either).

    A plain ``proj(glu(a, b))`` keeps the ``(N, I)`` product alive for ``proj``'s weight gradient
    in addition to ``a`` and ``b`` (LitGPT's LLaMAMLP keeps three ``(N, I)`` tensors per layer).
    Here the backward gets the product back from ``a`` and ``b`` (see ``_gl_backward``) and frees it
    right after the weight gradient: one ``(N, I)`` tensor per layer fewer for the whole step.
    """

    @staticmethod
    def forward(ctx, a, b, weight, bias, activation, reuse):
        y = _glu_linear_impl(a, b, weight, bias, activation)
        _gl_setup_context(ctx, (a, b, weight, bias, activation), y)
        ctx.reuse = reuse and _reusable(a, b)
        return y

    @staticmethod
    def backward(ctx, dy):
        grads = _gl_backward(ctx, dy, glu_fwd=_glu_fwd_impl, glu_bwd=_glu_bwd_impl, glu_bwd_h=_glu_bwd_h_impl)
        return (*grads, None)  # none for ``reuse``


def glu_linear(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    activation: str = "silu", *, reuse_inputs: bool = False,
) -> torch.Tensor:
    """``F.linear(act(a) * b, weight, bias)`` with ``act`` one of ``silu``, ``gelu_tanh``, ``gelu``;
    saves only ``a`` and ``b`` for backward (see ``_GLULinearFn``), in eager mode and under
    ``torch.compile`` (a custom op). On the reference path it is the plain composition. {reuse}"""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    _check(a, b)
    check_float("weight", weight)
    check_same_device(a=a, weight=weight, bias=bias)
    if weight.dim() != 2 or weight.shape[1] != a.shape[-1]:
        raise ValueError(f"weight shape {tuple(weight.shape)} must be (C, {a.shape[-1]}) for a, b of shape {tuple(a.shape)}")
    if not use_triton(a):
        return torch.nn.functional.linear(_glu(a, b, activation), weight, bias)
    if torch.compiler.is_compiling():
        return _glu_linear_op(a, b, weight, bias, activation)
    return _GLULinearFn.apply(a, b, weight, bias, activation, reuse_inputs)


if glu_linear.__doc__:
    glu_linear.__doc__ = glu_linear.__doc__.format(reuse=_REUSE_DOC)


# ----------------------------------------------------------------------------------------------
# The whole frozen MLP, recomputed in its backward: ``proj(glu(fc_1(x), fc_2(x)))`` keeping only x
# ----------------------------------------------------------------------------------------------
def _glu_mlp_reference(x, w1, b1, w2, b2, w3, b3, activation):
    F = torch.nn.functional
    return F.linear(glu_reference(F.linear(x, w1, b1), F.linear(x, w2, b2), activation), w3, b3)


def _recomputed_glu_bwd(x_c, dy_c, w1, b1, w2, b2, w3, activation, write_h=False):
    """One chunk of rows of a GLU MLP's backward, ``fc_1``/``fc_2``'s outputs recomputed from the chunk's MLP input
    ``x_c``: returns ``(d a, d b, d h)``, each a new ``(rows, I)`` tensor, ``d a``/``d b`` written over the recomputed
    ``a``/``b``; with ``write_h``, the GLU product ``act(a) * b`` over ``d h`` (what ``proj``'s weight gradient reads).
    The input gradient is then ``d a @ w1 + d b @ w2``."""
    a = torch.nn.functional.linear(x_c, w1, b1)  # (rows, I)
    b = torch.nn.functional.linear(x_c, w2, b2)
    dh = dy_c.mm(w3)  # (rows, I)
    _glu_bwd_launch(dh, a, b, a, b, activation, True, True, write_h=write_h)
    return a, b, dh


class _GLUMLPFn(torch.autograd.Function):
    """``proj(act(fc_1(x)) * fc_2(x))`` for frozen weights, run over chunks of rows (``_launch.mlp_chunk_rows``).

    Saves only ``x``: the backward recomputes each chunk's ``fc_1``/``fc_2`` outputs, writes the GLU's gradients
    over them and adds their input gradients into ``dx``. So no ``(N, I)`` tensor lives beyond one chunk, in the
    forward or the backward, for two more GEMMs (the chunk's ``fc_1``/``fc_2``) in the backward."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, w3, b3, activation):
        x2 = x.reshape(-1, x.shape[-1])  # (N, C)
        n = x2.shape[0]
        y = x2.new_empty((n, w3.shape[0]))  # (N, C_out)
        rows = _launch.mlp_chunk_rows(n, w1.shape[0] * x.element_size())
        F = torch.nn.functional
        for r0 in range(0, n, rows):
            xc = x2[r0:r0 + rows]
            a, b = F.linear(xc, w1, b1), F.linear(xc, w2, b2)  # (rows, I): fresh, contiguous
            _glu_fwd_launch(a, b, a, activation)  # the product over a (contiguous)
            if b3 is None:
                torch.mm(a, w3.t(), out=y[r0:r0 + rows])
            else:
                torch.addmm(b3, a, w3.t(), out=y[r0:r0 + rows])
            del a, b
        ctx.save_for_backward(x, w1, b1, w2, b2, w3)
        ctx.activation = activation
        return y.view(*x.shape[:-1], w3.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w1, b1, w2, b2, w3 = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])  # (N, C_out)
        n = x2.shape[0]
        dx = torch.empty_like(x2)  # (N, C)
        rows = _launch.mlp_chunk_rows(n, w1.shape[0] * x.element_size())
        for r0 in range(0, n, rows):
            a, b, dg = _recomputed_glu_bwd(x2[r0:r0 + rows], dy2[r0:r0 + rows], w1, b1, w2, b2, w3, ctx.activation)
            del dg
            torch.mm(a, w1, out=dx[r0:r0 + rows]).addmm_(b, w2)  # (rows, C)
            del a, b
        return dx.view(x.shape), None, None, None, None, None, None, None


def glu_mlp(
    x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
    w3: torch.Tensor, b3: torch.Tensor | None = None, activation: str = "silu",
) -> torch.Tensor:
    """``F.linear(act(F.linear(x, w1, b1)) * F.linear(x, w2, b2), w3, b3)`` (LitGPT's ``LLaMAMLP`` /
    ``GemmaMLP`` with ``fc_1``, ``fc_2``, ``proj``) for **frozen** weights: only ``x`` is kept for backward and
    every ``(N, I)`` tensor exists one chunk of rows at a time, in the forward and in the backward, which
    recomputes the chunk's ``fc_1``/``fc_2`` (see ``_GLUMLPFn``). Meant for activation-checkpointed Blocks, where
    the MLP's ``(N, I)`` tensors set the step's peak. Eager Triton path only; on the reference path and under
    ``torch.compile`` the plain composition. Raises where a weight or bias requires grad."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    check_float("x", x)
    named = {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "b3": b3}
    check_same_device(x=x, **named)
    check_same_dtype(x=x, **named)
    C, I = x.shape[-1], w1.shape[0] if w1.dim() == 2 else -1
    shapes = {"w1": (I, C), "w2": (I, C), "w3": (w3.shape[0] if w3.dim() == 2 else -1, I),
              "b1": (I,), "b2": (I,), "b3": (w3.shape[0],)}
    for name, t in named.items():
        if t is not None and tuple(t.shape) != shapes[name]:
            raise ValueError(f"glu_mlp: {name} has shape {tuple(t.shape)}, expected {shapes[name]} for x of "
                             f"shape {tuple(x.shape)} and w1 of shape {tuple(w1.shape)}")
    trained = [name for name, t in named.items() if t is not None and t.requires_grad]
    if trained and torch.is_grad_enabled():
        raise ValueError(f"glu_mlp is for frozen weights (it computes no weight gradient); {', '.join(trained)} "
                         "require grad: use glu_linear")
    if not use_triton(x) or torch.compiler.is_compiling() or x.numel() == 0:
        return _glu_mlp_reference(x, w1, b1, w2, b2, w3, b3, activation)
    return _GLUMLPFn.apply(x, w1, b1, w2, b2, w3, b3, activation)


def _norm_mlp_fwd_impl(
    x: torch.Tensor, residual: torch.Tensor, norm_w: torch.Tensor, eps: float, offset: float,
    w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
    w3: torch.Tensor, b3: torch.Tensor | None, activation: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(s, rstd, y)``: the residual sum, the norm's ``rstd`` and the MLP's output; ``fc_1``/``fc_2``'s outputs are
    freed on return."""
    s, rstd, a, b = _rms_norm_linear_impl(x, residual, norm_w, eps, offset, w1, b1, w2, b2)
    y = _glu_linear_impl(a, b, w3, b3, activation)
    return s, rstd, y


def _norm_mlp_bwd_impl(
    ds: torch.Tensor, dy: torch.Tensor, s: torch.Tensor, norm_w: torch.Tensor, rstd: torch.Tensor,
    w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None, w3: torch.Tensor,
    eps: float, offset: float, activation: str, has_b3: bool, needs: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor]:
    """``(dx, d norm_w, dw1, db1, dw2, db2, dw3, db3)``, each an empty tensor where not needed (``needs``: norm_w,
    w1, b1, w2, b2, w3, b3). ``dx`` is also the residual's gradient. At least one row (``rms_norm_glu_mlp`` sends
    empty inputs to the reference path)."""
    need_nw, need_w1, need_b1, need_w2, need_b2, need_w3, need_b3 = needs
    n = _rms_norm_fwd_impl(s, None, norm_w, eps, offset)[0].reshape(-1, s.shape[-1])  # (N, C), as the forward's
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, C)
    n_rows = n.shape[0]
    # Chunks of rows (_launch.mlp_chunk_rows, glu_mlp's): each chunk's fc_1 / fc_2 outputs and d h, three
    # (rows, I) tensors that the GLU backward reads at once, exist one chunk at a time. The weight gradients sum
    # the chunks in the weights' dtype (the GEMM adds each chunk's product to the running sum in fp32 and rounds
    # once per chunk, as gradient accumulation over micro-batches does in LitGPT's bf16-true training).
    rows = _launch.mlp_chunk_rows(n_rows)
    dw1 = dw2 = dw3 = None
    bias_sums = {}  # fp32 over the chunks
    dn = n  # (N, C): each chunk's d n is written over its rows of n, once their weight gradients are made
    for r0 in range(0, n_rows, rows):
        r1 = min(r0 + rows, n_rows)
        n_c, dy_c = n[r0:r1], dy2[r0:r1]
        a, b, dh = _recomputed_glu_bwd(n_c, dy_c, w1, b1, w2, b2, w3, activation, write_h=True)  # d a, d b, h
        first = r0 == 0
        if need_w3:
            dw3 = dy_c.t().mm(dh) if first else dw3.addmm_(dy_c.t(), dh)  # (C, I)
        del dh
        if need_w1:
            dw1 = a.t().mm(n_c) if first else dw1.addmm_(a.t(), n_c)  # (I, C)
        if need_w2:
            dw2 = b.t().mm(n_c) if first else dw2.addmm_(b.t(), n_c)
        for key, src, need in (("b3", dy_c, has_b3 and need_b3), ("b1", a, b1 is not None and need_b1),
                               ("b2", b, b2 is not None and need_b2)):
            if need:  # (a, b hold d a, d b here)
                part = src.sum(0, dtype=torch.float32)
                bias_sums[key] = part if first else bias_sums[key].add_(part)
        torch.mm(a, w1, out=dn[r0:r1]).addmm_(b, w2)  # (rows, C), over n_c (read for the last time above)
        del a, b, n_c
    del n
    db1, db2, db3 = (bias_sums[k].to(w3.dtype) if k in bias_sums else None for k in ("b1", "b2", "b3"))
    dx, dnw = _rms_norm_bwd_impl(dn.view(s.shape), ds, s, norm_w, rstd, offset, need_nw)
    # (a custom op's outputs may not alias each other: a new empty tensor for each gradient not made)
    return dx.view(s.shape), dnw, *(g if g is not None else w3.new_empty(0) for g in (dw1, db1, dw2, db2, dw3, db3))


# Under torch.compile: two opaque custom ops, so that the compiler keeps neither fc_1's nor fc_2's output either
_norm_mlp_op = torch.library.custom_op("lit_liger::rms_norm_glu_mlp", _norm_mlp_fwd_impl, mutates_args=())
_norm_mlp_bwd = torch.library.custom_op("lit_liger::rms_norm_glu_mlp_bwd", _norm_mlp_bwd_impl, mutates_args=())


@_norm_mlp_op.register_fake
def _(x, residual, norm_w, eps, offset, w1, b1, w2, b2, w3, b3, activation):
    n_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return x.new_empty(x.shape), x.new_empty(n_rows, dtype=torch.float32), x.new_empty((*x.shape[:-1], w3.shape[0]))


@_norm_mlp_bwd.register_fake
def _(ds, dy, s, norm_w, rstd, w1, b1, w2, b2, w3, eps, offset, activation, has_b3, needs):
    need_nw, need_w1, need_b1, need_w2, need_b2, need_w3, need_b3 = needs

    def grad(like, shape, need):
        return like.new_empty(shape) if need else w3.new_empty(0)

    return (s.new_empty(s.shape), grad(norm_w, norm_w.shape, need_nw), grad(w3, w1.shape, need_w1),
            grad(w3, w1.shape[:1], b1 is not None and need_b1), grad(w3, w2.shape, need_w2),
            grad(w3, w2.shape[:1], b2 is not None and need_b2), grad(w3, w3.shape, need_w3),
            grad(w3, w3.shape[:1], has_b3 and need_b3))


def _nm_setup_context(ctx, inputs, output):
    x, residual, norm_w, eps, offset, w1, b1, w2, b2, w3, b3, activation = inputs
    s, rstd, _ = output
    ctx.save_for_backward(s, norm_w, rstd, w1, b1, w2, b2, w3)  # not fc_1 / fc_2's outputs: recomputed
    ctx.cfg = (eps, offset, activation, b3 is not None)


def _nm_backward(ctx, ds, drstd, dy, bwd=_norm_mlp_bwd):
    s, norm_w, rstd, w1, b1, w2, b2, w3 = ctx.saved_tensors
    eps, offset, activation, has_b3 = ctx.cfg
    need = ctx.needs_input_grad  # x, residual, norm_w, eps, offset, w1, b1, w2, b2, w3, b3, activation
    needs = [bool(need[i]) for i in (2, 5, 6, 7, 8, 9, 10)]
    dx, *grads = bwd(ds, dy, s, norm_w, rstd, w1, b1, w2, b2, w3, eps, offset, activation, has_b3, needs)
    dnw, dw1, db1, dw2, db2, dw3, db3 = (g if n else None for g, n in zip(grads, needs))
    return dx, dx, dnw, None, None, dw1, db1, dw2, db2, dw3, db3, None


_norm_mlp_op.register_autograd(_nm_backward, setup_context=_nm_setup_context)


class _NormMLPRecomputeFn(torch.autograd.Function):
    """``s = x + residual``; ``y = F.linear(act(F.linear(n, w1, b1)) * F.linear(n, w2, b2), w3, b3)`` with
    ``n = rms_norm(s)`` (a LitGPT Block's fused residual, ``norm_2`` and GLU MLP), keeping only ``s`` and the
    norm's ``rstd`` for backward: not ``fc_1``/``fc_2``'s ``(N, I)`` outputs, which the backward recomputes (two
    GEMMs) from the recomputed ``n``, chunk of rows by chunk (``_launch.mlp_chunk_rows``), so that the three
    ``(rows, I)`` tensors its GLU backward reads at once exist for one chunk at a time. Trainable weights. The
    eager form of ``lit_liger::rms_norm_glu_mlp`` (the same implementations, without the dispatcher)."""

    @staticmethod
    def forward(ctx, x, residual, norm_w, eps, offset, w1, b1, w2, b2, w3, b3, activation):
        out = _norm_mlp_fwd_impl(x, residual, norm_w, eps, offset, w1, b1, w2, b2, w3, b3, activation)
        _nm_setup_context(ctx, (x, residual, norm_w, eps, offset, w1, b1, w2, b2, w3, b3, activation), out)
        ctx.mark_non_differentiable(out[1])
        return out

    @staticmethod
    def backward(ctx, ds, drstd, dy):
        return _nm_backward(ctx, ds, drstd, dy, bwd=_norm_mlp_bwd_impl)


def rms_norm_glu_mlp(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float,
    w1: torch.Tensor, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
    w3: torch.Tensor, b3: torch.Tensor | None = None, activation: str = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, F.linear(act(F.linear(n, w1, b1)) * F.linear(n, w2, b2), w3, b3))`` with ``s = x + residual`` and
    ``n = rms_norm(s, norm_weight, eps, offset)``: a LitGPT Block's residual add, ``norm_2`` and GLU MLP, whose
    ``fc_1``/``fc_2`` outputs (two ``(N, I)`` tensors per layer) are recomputed in backward instead of kept
    (``LigerConfig.recompute_mlp``: two more GEMMs per layer). On the Triton path, in eager mode and under
    ``torch.compile`` (a custom op); on the reference path, or without autograd, the same math with the outputs
    kept."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    named = {"x": x, "residual": residual, "norm_weight": norm_weight, "w1": w1, "b1": b1, "w2": w2, "b2": b2,
             "w3": w3, "b3": b3}
    for name, t in named.items():
        if t is not None:
            check_float(name, t)
    check_same_device(**named)
    check_same_dtype(**named)
    C = x.shape[-1]
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"residual shape {tuple(residual.shape)} must equal x's {tuple(x.shape)}")
    I = w1.shape[0] if w1.dim() == 2 else -1
    shapes = {"norm_weight": (C,), "w1": (I, C), "w2": (I, C), "w3": (C, I), "b1": (I,), "b2": (I,), "b3": (C,)}
    for name, want in shapes.items():
        t = named[name]
        if t is not None and tuple(t.shape) != want:
            raise ValueError(f"rms_norm_glu_mlp: {name} has shape {tuple(t.shape)}, expected {want} for x of shape "
                             f"{tuple(x.shape)} and w1 of shape {tuple(w1.shape)}")
    if not use_triton(x) or x.numel() == 0 or not torch.is_grad_enabled():
        s, (a, b) = rms_norm_linear(x, norm_weight, [(w1, b1), (w2, b2)], eps, offset, residual=residual)
        return s, glu_linear(a, b, w3, b3, activation)
    fn = _norm_mlp_op if torch.compiler.is_compiling() else _NormMLPRecomputeFn.apply
    s, _, y = fn(x.contiguous(), residual.contiguous(), norm_weight, float(eps), float(offset), w1, b1, w2, b2, w3,
                 b3, activation)
    return s, y
