"""LayerNorm as LitGPT uses it: ``torch.nn.LayerNorm`` (Pythia, phi, Falcon, ...) and, for OLMo-1,
``torch.nn.LayerNorm(elementwise_affine=False)`` (no weight, no bias).

``layer_norm(x, weight, bias, eps)`` equals ``F.layer_norm(x, (H,), weight, bias, eps)``: the
statistics and the affine transform run in fp32 and the result is written in ``x.dtype``. ``weight``
and ``bias`` are each optional; their gradients are computed only when they require grad.

Two fused forms for LitGPT's Block, the same kernels behind constexpr switches:

* ``layer_norm_residual(x, residual, weight, bias, eps)`` returns ``(s, layer_norm(s))`` with
  ``s = x + residual`` rounded to ``x.dtype`` (``x = attn_out + x; norm_2(x)``: OLMo-1, StableLM-3B), in
  one pass over memory, like ``kernels.rms_norm.rms_norm_residual``.
* ``layer_norm_dual(x, w1, b1, w2, b2, eps)`` returns both LayerNorms of one ``x`` (a parallel-residual
  Block's ``norm_1(x)`` and ``norm_2(x)``: Pythia, StableLM-alpha, RedPajama-INCITE): ``x`` read once
  and the statistics computed once in the forward; in the backward ``g = dy1 * w1 + dy2 * w2`` enters the
  usual input-gradient formula (linear in ``g``), so ``x`` is read once and one ``dx`` written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import as_rows, check_float, check_last_dim, check_same_device, check_same_dtype
from ._launch import fast_launch, partial_rows, row_plan, use_triton

__all__ = ["layer_norm", "layer_norm_dual", "layer_norm_reference", "layer_norm_residual"]


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
    X, R, S, Y, W, B, Y2, W2, B2, MEAN, RSTD,
    stride_x, stride_r, stride_s, stride_y, stride_y2,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    DUAL: tl.constexpr, HAS_WEIGHT2: tl.constexpr, HAS_BIAS2: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row. Reads x[row] (and residual[row]) and w, b; writes y[row] = (x - mean) * rstd * w + b in
    the output dtype, and mean[row], rstd[row] in fp32. With HAS_RESIDUAL the row normalized is s = x + residual,
    rounded to the input dtype and written to s[row]. With DUAL a second output y2[row] = x_hat * w2 + b2 from the
    same statistics (two LayerNorms of one input: a parallel-residual Block's norm_1 and norm_2). The variance is
    taken around the mean held in registers (two passes over the row in registers, no E[x^2] - mean^2
    cancellation)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(S.dtype.element_ty)
        tl.store(S + row * stride_s + cols, x, mask=mask)
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    x_hat = xc * rstd
    y = x_hat
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    if DUAL:
        y2 = x_hat
        if HAS_WEIGHT2:
            y2 = y2 * tl.load(W2 + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS2:
            y2 = y2 + tl.load(B2 + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y2 + row * stride_y2 + cols, y2.to(Y2.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@fast_launch
@triton.jit
def _ln_bwd_kernel(
    DY, DY2, DS, X, W, W2, MEAN, RSTD, DX, DW_PARTIAL, DB_PARTIAL, DW2_PARTIAL, DB2_PARTIAL,
    stride_dy, stride_dy2, stride_ds, stride_x, stride_dx,
    n_rows, n_cols,
    HAS_WEIGHT: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
    DUAL: tl.constexpr, HAS_WEIGHT2: tl.constexpr, NEED_DW2: tl.constexpr, NEED_DB2: tl.constexpr,
    HAS_DS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Persistent: program p handles rows p, p+P, ...; per row reads dy[row], x[row], mean[row],
    rstd[row] and writes dx[row] = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * w
    (+ dy2 * w2 with DUAL: the input gradient is linear in g, so both outputs' gradients go through one pass),
    plus ds[row] with HAS_DS (the gradient of the residual sum). With NEED_DW / NEED_DB (NEED_DW2 / NEED_DB2)
    it accumulates its rows' dy * x_hat / dy in fp32 registers and writes one partial row each to
    DW_PARTIAL[p] / DB_PARTIAL[p]; the partials are summed on the device."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_WEIGHT2:
        w2 = tl.load(W2 + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    dw2_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    db2_acc = tl.zeros((BLOCK,), dtype=tl.float32)
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
        if DUAL:
            dy2 = tl.load(DY2 + row64 * stride_dy2 + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT2:
                g += dy2 * w2
            else:
                g += dy2
            if NEED_DW2:
                dw2_acc += dy2 * x_hat
            if NEED_DB2:
                db2_acc += dy2
        c1 = tl.sum(g * x_hat, axis=0) / n_cols
        c2 = tl.sum(g, axis=0) / n_cols
        dx = rstd * (g - c2 - x_hat * c1)
        if HAS_DS:
            dx += tl.load(DS + row64 * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if NEED_DW:
            dw_acc += dy * x_hat
        if NEED_DB:
            db_acc += dy
    if NEED_DW:
        tl.store(DW_PARTIAL + pid * n_cols + cols, dw_acc, mask=mask)
    if NEED_DB:
        tl.store(DB_PARTIAL + pid * n_cols + cols, db_acc, mask=mask)
    if NEED_DW2:
        tl.store(DW2_PARTIAL + pid * n_cols + cols, dw2_acc, mask=mask)
    if NEED_DB2:
        tl.store(DB2_PARTIAL + pid * n_cols + cols, db2_acc, mask=mask)


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
def _layer_norm_fwd_impl(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias: torch.Tensor | None,
    weight2: torch.Tensor | None, bias2: torch.Tensor | None, eps: float, dual: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, s | empty, y2 | empty, mean, rstd)``: ``s = x + residual`` (with a residual), ``y`` its (or x's)
    LayerNorm with ``weight``/``bias``, ``y2`` (``dual``) the same statistics with ``weight2``/``bias2``."""
    x2 = as_rows(x)  # (N, H)
    n_rows, n_cols = x2.shape
    # outputs allocated in x's shape (not views of 2-D tensors: see kernels.rms_norm)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    s = torch.empty(x.shape if residual is not None else (0,), dtype=x.dtype, device=x.device)
    y2 = torch.empty(x.shape if dual else (0,), dtype=x.dtype, device=x.device)
    r2 = as_rows(residual) if residual is not None else x2
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows > 0 and n_cols > 0:
        # one row in registers: BLOCK = next_power_of_2(H), warps so each thread holds 8-16 elements
        plan = row_plan(n_cols, x.element_size(), x.device)
        _ln_fwd_kernel[(n_rows,)](
            x2, r2, s if residual is not None else y, y,
            weight if weight is not None else y, bias if bias is not None else y,
            y2 if dual else y, weight2 if weight2 is not None else y, bias2 if bias2 is not None else y,
            mean, rstd,
            x2.stride(0), r2.stride(0), n_cols, n_cols, n_cols,
            n_cols, eps,
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            DUAL=dual, HAS_WEIGHT2=dual and weight2 is not None, HAS_BIAS2=dual and bias2 is not None,
            BLOCK=plan.block, num_warps=plan.num_warps,
        )
    return y, s, y2, mean, rstd


_layer_norm_fwd = torch.library.custom_op("lit_liger::layer_norm_fwd", _layer_norm_fwd_impl, mutates_args=())


@_layer_norm_fwd.register_fake
def _(x, residual, weight, bias, weight2, bias2, eps, dual):
    n_rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    s = x.new_empty(x.shape) if residual is not None else x.new_empty(0)
    y2 = x.new_empty(x.shape) if dual else x.new_empty(0)
    return (x.new_empty(x.shape), s, y2, x.new_empty(n_rows, dtype=torch.float32),
            x.new_empty(n_rows, dtype=torch.float32))


def _layer_norm_bwd_impl(
    dy: torch.Tensor, dy2: torch.Tensor | None, ds: torch.Tensor | None, x: torch.Tensor,
    weight: torch.Tensor | None, weight2: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor,
    needs: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dw, db, dw2, db2)``, each parameter gradient an empty tensor where not needed (``needs``: dw, db, dw2,
    db2). ``dy2``: the second output's gradient (a dual forward); ``ds``: the residual sum's, added to ``dx``."""
    need_dw, need_db, need_dw2, need_db2 = needs
    x2, dy2d = as_rows(x), as_rows(dy)  # (N, H)
    n_rows, n_cols = x2.shape
    dual = dy2 is not None
    dy2_2 = as_rows(dy2) if dual else dy2d
    ds2 = as_rows(ds) if ds is not None else dy2d
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_prog = partial_rows(n_rows, x.device)

    def partial(need):
        return torch.empty((n_prog, n_cols) if need else (0,), dtype=torch.float32, device=x.device)

    parts = [partial(n) for n in needs]
    if n_rows > 0 and n_cols > 0:
        plan = row_plan(n_cols, x.element_size(), x.device)
        _ln_bwd_kernel[(n_prog,)](
            dy2d, dy2_2, ds2, x2, weight if weight is not None else x2, weight2 if weight2 is not None else x2,
            mean, rstd, dx, *parts,
            dy2d.stride(0), dy2_2.stride(0), ds2.stride(0), x2.stride(0), n_cols,
            n_rows, n_cols,
            HAS_WEIGHT=weight is not None, NEED_DW=need_dw, NEED_DB=need_db,
            DUAL=dual, HAS_WEIGHT2=dual and weight2 is not None, NEED_DW2=need_dw2, NEED_DB2=need_db2,
            HAS_DS=ds is not None, BLOCK=plan.block, num_warps=plan.num_warps,
        )
    # (P, H) fp32 partials -> (H,) on the device (no host sync): weights in their dtype, biases in fp32 (cast by
    # the autograd backward, which knows their dtype)
    out = []
    for need, part, pdtype in zip(needs, parts, (weight, None, weight2, None)):
        pdtype = pdtype.dtype if pdtype is not None else torch.float32
        if not need:
            out.append(x.new_empty(0))
        elif n_rows > 0:
            out.append(part.sum(0).to(pdtype))
        else:
            out.append(torch.zeros(n_cols, dtype=pdtype, device=x.device))
    return (dx, *out)


_layer_norm_bwd = torch.library.custom_op("lit_liger::layer_norm_bwd", _layer_norm_bwd_impl, mutates_args=())


@_layer_norm_bwd.register_fake
def _(dy, dy2, ds, x, weight, weight2, mean, rstd, needs):
    n_cols = x.shape[-1]
    out = []
    for need, p in zip(needs, (weight, None, weight2, None)):
        dtype = p.dtype if p is not None else torch.float32
        out.append(x.new_empty(n_cols, dtype=dtype) if need else x.new_empty(0))
    return (x.new_empty(x.shape), *out)


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, weight2, bias2, eps, dual = inputs
    y, s, y2, mean, rstd = output
    ctx.save_for_backward(s if residual is not None else x, weight, weight2, mean, rstd)
    ctx.bias_dtypes = (bias.dtype if bias is not None else None, bias2.dtype if bias2 is not None else None)
    ctx.has_residual = residual is not None
    ctx.dual = dual


def _backward(ctx, dy, ds, dy2, dmean, drstd, bwd=_layer_norm_bwd):
    saved, weight, weight2, mean, rstd = ctx.saved_tensors
    needs_in = ctx.needs_input_grad  # x, residual, weight, bias, weight2, bias2, eps, dual
    b_dtype, b2_dtype = ctx.bias_dtypes
    needs = [weight is not None and needs_in[2], b_dtype is not None and needs_in[3],
             ctx.dual and weight2 is not None and needs_in[4], ctx.dual and b2_dtype is not None and needs_in[5]]
    if dy is None:  # (eager: an output unused downstream has no gradient)
        dy = torch.zeros_like(saved)
    if ctx.dual and dy2 is None:
        dy2 = torch.zeros_like(saved)
    dx, dw, db, dw2, db2 = bwd(dy, dy2 if ctx.dual else None, ds if ctx.has_residual else None, saved, weight,
                              weight2, mean, rstd, needs)
    return (dx, dx if ctx.has_residual else None, dw if needs[0] else None,
            db.to(b_dtype) if needs[1] else None, dw2 if needs[2] else None,
            db2.to(b2_dtype) if needs[3] else None, None, None)


_layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


class _LayerNormFn(torch.autograd.Function):
    """Eager fast path: the same kernels and autograd as the custom op, without the custom-op
    dispatcher's per-call host overhead (tens of microseconds, comparable to the kernels
    themselves at LitGPT sizes). ``torch.compile`` traces the custom op instead (see ``_fwd``)."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, weight2, bias2, eps, dual):
        out = _layer_norm_fwd_impl(x, residual, weight, bias, weight2, bias2, eps, dual)
        _setup_context(ctx, (x, residual, weight, bias, weight2, bias2, eps, dual), out)
        # mean, rstd; the empty placeholders of an absent residual sum / second output (one call: each replaces
        # the last)
        ctx.mark_non_differentiable(out[3], out[4], *([out[1]] if residual is None else []),
                                    *([out[2]] if not dual else []))
        ctx.set_materialize_grads(False)  # no zero gradients built for mean/rstd
        return out

    @staticmethod
    def backward(ctx, dy, ds, dy2, dmean, drstd):
        return _backward(ctx, dy, ds, dy2, dmean, drstd, bwd=_layer_norm_bwd_impl)


def _fwd(x, residual, weight, bias, weight2, bias2, eps, dual):
    if torch.compiler.is_compiling():
        return _layer_norm_fwd(x, residual, weight, bias, weight2, bias2, eps, dual)
    return _LayerNormFn.apply(x, residual, weight, bias, weight2, bias2, eps, dual)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _check(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
           residual: torch.Tensor | None = None, **more: torch.Tensor | None) -> None:
    check_float("x", x)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., H)")
    params = {"weight": weight, "bias": bias, **more}
    for name, p in params.items():
        if p is None:
            continue
        check_float(name, p)
        if p.dim() != 1:
            raise ValueError(f"{name} must be 1-D (H,), got shape {tuple(p.shape)}")
        check_last_dim("x", x, p.shape[0], f"the normalized size, {name}.shape[0]")
    check_same_device(x=x, residual=residual, **params)
    if residual is not None:
        check_float("residual", residual)
        check_same_dtype(x=x, residual=residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} must equal x shape {tuple(x.shape)}")


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """``F.layer_norm(x, (H,), weight, bias, eps)``: fp32 math, output in ``x.dtype``. ``weight`` and
    ``bias`` are ``(H,)`` or ``None`` (``torch.nn.LayerNorm(elementwise_affine=False)``, OLMo-1)."""
    _check(x, weight, bias)
    if not use_triton(x):
        return layer_norm_reference(x, weight, bias, eps)
    return _fwd(x, None, weight, bias, None, None, float(eps), False)[0]


def layer_norm_residual(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(s, layer_norm(s, weight, bias, eps))`` with ``s = x + residual`` (in ``x.dtype``), in one kernel
    (a non-parallel Block's ``x = attn_out + x; norm_2(x)``, the sum kept for the Block's last residual add).
    Only ``s`` is kept for backward; the gradient of ``s`` is added to the norm's input gradient in the same
    pass."""
    _check(x, weight, bias, residual)
    if not use_triton(x):
        s = x + residual
        return s, layer_norm_reference(s, weight, bias, eps)
    y, s, _, _, _ = _fwd(x, residual, weight, bias, None, None, float(eps), False)
    return s, y


def layer_norm_dual(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    weight2: torch.Tensor | None, bias2: torch.Tensor | None, eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(layer_norm(x, weight, bias, eps), layer_norm(x, weight2, bias2, eps))`` in one kernel: ``x`` read once,
    one mean and rstd per row, both outputs written; the backward reads ``x`` once and writes one input gradient
    for both (a parallel-residual Block's ``norm_1(x)`` and ``norm_2(x)``, Pythia, StableLM-alpha, ...)."""
    _check(x, weight, bias, weight2=weight2, bias2=bias2)
    if not use_triton(x):
        return layer_norm_reference(x, weight, bias, eps), layer_norm_reference(x, weight2, bias2, eps)
    y, _, y2, _, _ = _fwd(x, None, weight, bias, weight2, bias2, float(eps), True)
    return y, y2
