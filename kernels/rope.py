"""Rotary position embedding (RoPE) of q and k with LitGPT's semantics, in one kernel launch.

``rope(q, k, cos, sin, interleave=False)`` returns ``(q_rot, k_rot)`` equal to what LitGPT's
``CausalSelfAttention.forward`` builds::

    q_roped = apply_rope(q[..., :n], cos, sin)            # or apply_rope_interleave
    q = torch.cat((q_roped, q[..., n:]), dim=-1)          # the same for k

* q ``(B, nh, T, hs)``, k ``(B, ng, T, hs)`` (any head counts: MHA, GQA, MQA); cos/sin
  ``(1|B, T, n)`` with ``n`` even and ``n <= hs``. Partial rotary (``n < hs``, Pythia/Phi): the
  first ``n`` elements of each head are rotated, the tail passes through, without LitGPT's slice
  and ``torch.cat`` copies.
* Rotate-half layout: with ``x1, x2`` the two halves of the rotated part,
  ``out = [x1*c1 - x2*s1, x2*c2 + x1*s2]`` (``c1, c2`` the halves of ``cos``, same for ``sin``).
* ``interleave=True`` equals ``apply_rope_interleave``: the rotated part is first permuted to
  ``[x0, x2, x4, ..., x1, x3, ...]`` (so ``x1`` = even, ``x2`` = odd elements) and the output
  stays in that permuted layout, exactly as LitGPT returns it.
* Math: LitGPT computes ``x * cos + rotated * sin`` in the promoted dtype of x and cos (fp32 with
  its fp32 rope cache) and casts to ``x.dtype``. Here the math is always fp32 (one rounding to
  ``x.dtype`` at the end): the same computation for an fp32 cache (up to the last bit of an fp32
  fused multiply-add), slightly more accurate than LitGPT when the cache itself is 16-bit.
* Backward: the inverse rotation (``dx1 = dy1*c1 + dy2*s2``, ``dx2 = dy2*c2 - dy1*s1``, written
  back to the even/odd positions with ``interleave``); identity on the tail. cos/sin are rope
  buffers: their gradient is not computed, and ``rope`` raises ``ValueError`` if either requires
  grad.
* Layout: inputs are read through their 4 strides (LitGPT's q/k are ``qkv.split`` +
  ``view`` + ``transpose`` views; nothing is copied). Outputs (and the input gradients) are new
  tensors with unit stride on ``hs`` and the same dim order as the input: when the heads are
  inner to time in memory (``x.stride(1) < x.stride(2)``, LitGPT's transposed views) the output
  is a ``(B, T, nh, hs)`` buffer seen as ``(B, nh, T, hs)`` -- the layout flash attention reads
  without a copy, and whose gradient flows back through LitGPT's ``transpose``/``view`` without
  a copy; otherwise it is contiguous ``(B, nh, T, hs)``. The CPU reference path returns what
  LitGPT's ``torch.cat`` returns (contiguous). Inputs are never modified.
* qk-norm (``q_weight``/``k_weight`` given; Qwen3, Gemma-3: LitGPT's ``norm_qk_type="default"``):
  every q (k) head is first RMS-normalized over its full ``hs`` exactly as ``litgpt.model.RMSNorm``
  does it (fp32 math, ``x * rsqrt(mean(x^2) + eps) * (w + offset)``, ``offset`` 1.0 for
  ``add_unit_offset``), rounded to the input dtype as LitGPT's norm returns it, then rotated, in
  the same launch. The normalized heads are never written to memory. Backward recomputes each
  head's rstd from the saved q and k (the only extra tensors kept: the inputs themselves, which
  LitGPT's norm keeps too); ``q_weight``/``k_weight`` gradients are reduced in fp32 as
  per-program partial rows summed on the device (no host sync). Unlike ``RMSNorm``'s
  ``1 + weight`` in the weight dtype, ``w + offset`` is added in fp32 (as ``rms_norm`` does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check_float, check_same_device, check_same_dtype
from ._launch import elementwise_plan, fast_launch, next_pow2, partial_rows, row_plan, use_triton

__all__ = ["rope", "rope_qkv", "rope_reference"]


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and tests' second opinion; the tests' primary reference is litgpt's apply_rope)
# ----------------------------------------------------------------------------------------------
def _rope_reference_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    n = cos.shape[-1]
    xr = x[..., :n]  # (B, nh, T, n)
    if interleave:
        # [x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...]; the result stays in this layout
        xr = xr.unflatten(-1, (n // 2, 2)).transpose(-1, -2).flatten(-2)
    x1, x2 = xr[..., : n // 2], xr[..., n // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)  # (B, nh, T, n)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # (1|B, 1, T, n)
    roped = (xr * c + rotated * s).to(x.dtype)
    return torch.cat((roped, x[..., n:]), dim=-1)  # (B, nh, T, hs)


def _rms_norm_heads_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """``litgpt.model.RMSNorm`` over the head dim, line for line (``1 + weight`` in the weight dtype)."""
    dtype = x.dtype
    xf = x.float()
    x_normed = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + eps)
    w = (offset + weight) if offset else weight
    return (x_normed * w.float()).to(dtype=dtype)


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False, *,
    q_weight: torch.Tensor | None = None, k_weight: torch.Tensor | None = None, eps: float = 1e-6,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LitGPT's ``apply_rope``/``apply_rope_interleave`` on the first ``n`` elements + tail, in PyTorch;
    with ``q_weight``/``k_weight``, LitGPT's per-head ``RMSNorm`` of q and k first."""
    if q_weight is not None:
        q = _rms_norm_heads_reference(q, q_weight, eps, offset)
        k = _rms_norm_heads_reference(k, k_weight, eps, offset)
    return _rope_reference_one(q, cos, sin, interleave), _rope_reference_one(k, cos, sin, interleave)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _halves(d, half, PAIRS: tl.constexpr):
    """Positions of the two rotated halves' elements ``d``: the even/odd elements (``PAIRS``,
    LitGPT's interleaved layout) or the first/second half (rotate-half layout)."""
    if PAIRS:
        a = 2 * d
        b = 2 * d + 1
    else:
        a = d
        b = d + half
    return a, b


@triton.jit
def _load_cos_sin(COS, SIN, bi, ti, half, sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, BLOCK_D: tl.constexpr):
    """cos[b|0, t, :n] and sin[b|0, t, :n] as fp32 halves ``c1, c2, s1, s2``, each ``[1, BLOCK_D]``."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    cp = COS + bi * sc_b + ti * sc_t
    sp = SIN + bi * ss_b + ti * ss_t
    c1 = tl.load(cp + d * sc_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cp + (d + half) * sc_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sp + d * ss_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sp + (d + half) * ss_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    return c1, c2, s1, s2


@triton.jit
def _rope_heads(
    X, O, W, x_row, o_row, n_heads, sx_h, sx_d, so_h, sw,
    c1, c2, s1, s2, half, n_tail, eps, offset,
    X_PAIRS: tl.constexpr, O_PAIRS: tl.constexpr, BACKWARD: tl.constexpr, HAS_NORM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TAIL: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """All ``n_heads`` heads of one (b, t) row of X -> O, ``BLOCK_H`` heads per step.

    Per step reads a ``[BLOCK_H, BLOCK_D]`` tile of each rotated half (``x1``, ``x2``) and, with a
    tail, a ``[BLOCK_H, BLOCK_TAIL]`` tile of the pass-through elements; writes the same tiles of O.
    ``X_PAIRS``: the halves are read as the even/odd elements (interleave forward); ``O_PAIRS``: they
    are written there (interleave backward). O has unit stride on the head dim.
    ``HAS_NORM`` (forward only): each head, whole in the step's tiles, is RMS-normalized with the
    weight W (read once per program, at the same head positions as X) and rounded to X's dtype
    before the rotation; the tail is written normalized."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    xa, xb = _halves(d, half, X_PAIRS)
    oa, ob = _halves(d, half, O_PAIRS)
    e = tl.arange(0, BLOCK_TAIL)
    emask = e < n_tail
    if HAS_NORM:
        hs = 2 * half + n_tail
        wa = (tl.load(W + xa * sw, mask=dmask, other=0.0).to(tl.float32) + offset)[None, :]
        wb = (tl.load(W + xb * sw, mask=dmask, other=0.0).to(tl.float32) + offset)[None, :]
        if HAS_TAIL:
            wt = (tl.load(W + (2 * half + e) * sw, mask=emask, other=0.0).to(tl.float32) + offset)[None, :]
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        hmask = h < n_heads
        m = hmask[:, None] & dmask[None, :]
        xp = X + x_row + h[:, None] * sx_h  # [BLOCK_H, 1] pointers to the heads of this row
        op = O + o_row + h[:, None] * so_h
        a = tl.load(xp + xa[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        b = tl.load(xp + xb[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        if HAS_NORM:
            ssq = tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)  # [BLOCK_H]
            if HAS_TAIL:
                tm = hmask[:, None] & emask[None, :]
                t = tl.load(xp + (2 * half + e)[None, :] * sx_d, mask=tm, other=0.0).to(tl.float32)
                ssq += tl.sum(t * t, axis=1)
            rstd = (1.0 / tl.sqrt(ssq / hs + eps))[:, None]
            # LitGPT's RMSNorm returns x.dtype: round the normalized halves before rotating them
            a = (a * rstd * wa).to(X.dtype.element_ty).to(tl.float32)
            b = (b * rstd * wb).to(X.dtype.element_ty).to(tl.float32)
        if BACKWARD:
            ya = a * c1 + b * s2
            yb = b * c2 - a * s1
        else:
            ya = a * c1 - b * s1
            yb = b * c2 + a * s2
        tl.store(op + oa[None, :], ya.to(O.dtype.element_ty), mask=m)
        tl.store(op + ob[None, :], yb.to(O.dtype.element_ty), mask=m)
        if HAS_TAIL:
            if HAS_NORM:
                tl.store(op + (2 * half + e)[None, :], (t * rstd * wt).to(O.dtype.element_ty), mask=tm)
            else:
                tm = hmask[:, None] & emask[None, :]
                tail = tl.load(xp + (2 * half + e)[None, :] * sx_d, mask=tm, other=0.0)
                tl.store(op + (2 * half + e)[None, :], tail.to(O.dtype.element_ty), mask=tm)


@fast_launch
@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, WQ, WK,
    T, n_qh, n_kh, half, n_tail, eps, offset,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
    sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, swq, swk,
    X_PAIRS: tl.constexpr, O_PAIRS: tl.constexpr, BACKWARD: tl.constexpr, HAS_NORM: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """One program per (b, t) row. Reads cos[b|0, t, :n] and sin[b|0, t, :n] once (fp32), then
    rotates every q head and every k head of that row (forward: by +sin; ``BACKWARD``: by -sin,
    i.e. Q/K hold dq/dk of the outputs and QO/KO receive the input gradients). The cos/sin batch
    stride is 0 when they have batch dim 1. ``HAS_NORM`` (forward): q heads are RMS-normalized
    with WQ and k heads with WK before the rotation (WQ/WK are not read otherwise)."""
    row = tl.program_id(0).to(tl.int64)
    bi = row // T
    ti = row % T
    c1, c2, s1, s2 = _load_cos_sin(COS, SIN, bi, ti, half, sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, BLOCK_D)
    _rope_heads(
        Q, QO, WQ, bi * sq_b + ti * sq_t, bi * sqo_b + ti * sqo_t, n_qh, sq_h, sq_d, sqo_h, swq,
        c1, c2, s1, s2, half, n_tail, eps, offset,
        X_PAIRS, O_PAIRS, BACKWARD, HAS_NORM, BLOCK_HQ, BLOCK_D, BLOCK_TAIL, HAS_TAIL,
    )
    _rope_heads(
        K, KO, WK, bi * sk_b + ti * sk_t, bi * sko_b + ti * sko_t, n_kh, sk_h, sk_d, sko_h, swk,
        c1, c2, s1, s2, half, n_tail, eps, offset,
        X_PAIRS, O_PAIRS, BACKWARD, HAS_NORM, BLOCK_HK, BLOCK_D, BLOCK_TAIL, HAS_TAIL,
    )


@triton.jit
def _rope_norm_heads_bwd(
    DY, X, DX, dy_row, x_row, dx_row, n_heads, sdy_h, sdy_d, sx_h, sx_d, sdx_h,
    wa, wb, wt, acc_a, acc_b, acc_t,
    c1, c2, s1, s2, half, n_tail, eps,
    PAIRS: tl.constexpr, NEED_DW: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TAIL: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """Backward of norm + rotation for all ``n_heads`` heads of one (b, t) row, ``BLOCK_H`` per step.

    Per step reads ``[BLOCK_H, *]`` tiles of dy (output layout: the rotated halves are contiguous)
    and of the saved input x (at the head positions ``PAIRS`` selects: even/odd with interleave),
    rotates dy back (the gradient ``g`` of the normalized head), recomputes the head's rstd from x
    and writes ``dx = rstd * (g*w - x_hat * mean(g*w * x_hat))`` (DX has unit stride on the head
    dim). With ``NEED_DW`` adds ``sum over heads of g * x_hat`` to the fp32 accumulators."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    pa, pb = _halves(d, half, PAIRS)
    e = tl.arange(0, BLOCK_TAIL)
    emask = e < n_tail
    te = 2 * half + e
    hs = 2 * half + n_tail
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        hmask = h < n_heads
        m = hmask[:, None] & dmask[None, :]
        dyp = DY + dy_row + h[:, None] * sdy_h
        xp = X + x_row + h[:, None] * sx_h
        dxp = DX + dx_row + h[:, None] * sdx_h
        ya = tl.load(dyp + d[None, :] * sdy_d, mask=m, other=0.0).to(tl.float32)
        yb = tl.load(dyp + (d + half)[None, :] * sdy_d, mask=m, other=0.0).to(tl.float32)
        ga = ya * c1 + yb * s2  # gradient of the normalized head at positions pa, pb
        gb = yb * c2 - ya * s1
        xa = tl.load(xp + pa[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        xb = tl.load(xp + pb[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        ssq = tl.sum(xa * xa, axis=1) + tl.sum(xb * xb, axis=1)
        if HAS_TAIL:
            tm = hmask[:, None] & emask[None, :]
            gt = tl.load(dyp + te[None, :] * sdy_d, mask=tm, other=0.0).to(tl.float32)
            xt = tl.load(xp + te[None, :] * sx_d, mask=tm, other=0.0).to(tl.float32)
            ssq += tl.sum(xt * xt, axis=1)
        rstd = (1.0 / tl.sqrt(ssq / hs + eps))[:, None]
        ha = xa * rstd
        hb = xb * rstd
        gwa = ga * wa
        gwb = gb * wb
        dot = tl.sum(gwa * ha, axis=1) + tl.sum(gwb * hb, axis=1)
        if HAS_TAIL:
            ht = xt * rstd
            gwt = gt * wt
            dot += tl.sum(gwt * ht, axis=1)
        dot = (dot / hs)[:, None]
        tl.store(dxp + pa[None, :], (rstd * (gwa - ha * dot)).to(DX.dtype.element_ty), mask=m)
        tl.store(dxp + pb[None, :], (rstd * (gwb - hb * dot)).to(DX.dtype.element_ty), mask=m)
        if HAS_TAIL:
            tl.store(dxp + te[None, :], (rstd * (gwt - ht * dot)).to(DX.dtype.element_ty), mask=tm)
        if NEED_DW:
            acc_a += tl.sum(ga * ha, axis=0)
            acc_b += tl.sum(gb * hb, axis=0)
            if HAS_TAIL:
                acc_t += tl.sum(gt * ht, axis=0)
    return acc_a, acc_b, acc_t


@triton.jit
def _load_norm_weight(W, sw, half, n_tail, offset, PAIRS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TAIL: tl.constexpr):
    """``w + offset`` (fp32) at the head positions of the two halves (even/odd with ``PAIRS``) and the tail."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    e = tl.arange(0, BLOCK_TAIL)
    pa, pb = _halves(d, half, PAIRS)
    wa = (tl.load(W + pa * sw, mask=dmask, other=0.0).to(tl.float32) + offset)[None, :]
    wb = (tl.load(W + pb * sw, mask=dmask, other=0.0).to(tl.float32) + offset)[None, :]
    wt = (tl.load(W + (2 * half + e) * sw, mask=e < n_tail, other=0.0).to(tl.float32) + offset)[None, :]
    return wa, wb, wt


@triton.jit
def _store_dw_partial(DW, pid, hs, half, n_tail, acc_a, acc_b, acc_t,
                      PAIRS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TAIL: tl.constexpr):
    """Writes one program's fp32 partial weight gradient row DW[pid, :hs] (head positions as in x)."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    e = tl.arange(0, BLOCK_TAIL)
    pa, pb = _halves(d, half, PAIRS)
    base = DW + tl.cast(pid, tl.int64) * hs
    tl.store(base + pa, acc_a, mask=dmask)
    tl.store(base + pb, acc_b, mask=dmask)
    tl.store(base + 2 * half + e, acc_t, mask=e < n_tail)


@fast_launch
@triton.jit
def _rope_norm_bwd_kernel(
    DQ, DK, Q, K, DQI, DKI, COS, SIN, WQ, WK, DWQ, DWK,
    n_rows, T, n_qh, n_kh, half, n_tail, eps, offset,
    sdq_b, sdq_h, sdq_t, sdq_d, sdk_b, sdk_h, sdk_t, sdk_d,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    sdqi_b, sdqi_h, sdqi_t, sdki_b, sdki_h, sdki_t,
    sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, swq, swk,
    PAIRS: tl.constexpr, NEED_DW: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """Backward of qk-norm + RoPE. Persistent: program p handles (b, t) rows p, p+P, ...; per row
    reads cos/sin once and, for every q and k head, dy and the saved input, and writes the input
    gradient (DQI/DKI). With ``NEED_DW`` it then writes one fp32 partial row of each weight's
    gradient (its rows' sum over heads of ``g * x_hat``) to DWQ[p] / DWK[p], summed on the device
    afterwards."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    wqa, wqb, wqt = _load_norm_weight(WQ, swq, half, n_tail, offset, PAIRS, BLOCK_D, BLOCK_TAIL)
    wka, wkb, wkt = _load_norm_weight(WK, swk, half, n_tail, offset, PAIRS, BLOCK_D, BLOCK_TAIL)
    acc_qa = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_qb = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_qt = tl.zeros((BLOCK_TAIL,), dtype=tl.float32)
    acc_ka = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_kb = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_kt = tl.zeros((BLOCK_TAIL,), dtype=tl.float32)
    for row in range(pid, n_rows, n_prog):
        row64 = tl.cast(row, tl.int64)
        bi = row64 // T
        ti = row64 % T
        c1, c2, s1, s2 = _load_cos_sin(COS, SIN, bi, ti, half, sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, BLOCK_D)
        acc_qa, acc_qb, acc_qt = _rope_norm_heads_bwd(
            DQ, Q, DQI, bi * sdq_b + ti * sdq_t, bi * sq_b + ti * sq_t, bi * sdqi_b + ti * sdqi_t,
            n_qh, sdq_h, sdq_d, sq_h, sq_d, sdqi_h,
            wqa, wqb, wqt, acc_qa, acc_qb, acc_qt,
            c1, c2, s1, s2, half, n_tail, eps,
            PAIRS, NEED_DW, BLOCK_HQ, BLOCK_D, BLOCK_TAIL, HAS_TAIL,
        )
        acc_ka, acc_kb, acc_kt = _rope_norm_heads_bwd(
            DK, K, DKI, bi * sdk_b + ti * sdk_t, bi * sk_b + ti * sk_t, bi * sdki_b + ti * sdki_t,
            n_kh, sdk_h, sdk_d, sk_h, sk_d, sdki_h,
            wka, wkb, wkt, acc_ka, acc_kb, acc_kt,
            c1, c2, s1, s2, half, n_tail, eps,
            PAIRS, NEED_DW, BLOCK_HK, BLOCK_D, BLOCK_TAIL, HAS_TAIL,
        )
    if NEED_DW:
        hs = 2 * half + n_tail
        _store_dw_partial(DWQ, pid, hs, half, n_tail, acc_qa, acc_qb, acc_qt, PAIRS, BLOCK_D, BLOCK_TAIL)
        _store_dw_partial(DWK, pid, hs, half, n_tail, acc_ka, acc_kb, acc_kt, PAIRS, BLOCK_D, BLOCK_TAIL)


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------
def _heads_inner(x: torch.Tensor) -> bool:
    """True when x's heads are inner to time in memory (LitGPT's ``view(B, T, nh, hs).transpose(1, 2)``)."""
    return x.stride(1) < x.stride(2)


def _new_like(x: torch.Tensor, heads_inner: bool) -> torch.Tensor:
    """A new (B, H, T, hs) tensor with unit stride on hs, heads inner to time iff ``heads_inner``."""
    B, H, T, D = x.shape
    if heads_inner:
        return x.new_empty((B, T, H, D)).transpose(1, 2)  # (B, H, T, hs) view of a (B, T, H, hs) buffer
    return x.new_empty((B, H, T, D))


def _blocks(q: torch.Tensor, k: torch.Tensor, n: int) -> tuple[int, int, int, int, int]:
    """``(BLOCK_D, BLOCK_TAIL, BLOCK_HQ, BLOCK_HK, num_warps)`` for q, k and ``n`` rotated elements.

    Why these blocks: a program owns one (b, t) row, so cos/sin are read once and reused by all
    nh + ng heads. One head needs its two rotated halves (BLOCK_D = next power of two >= n/2,
    each half one tile column range) plus the tail. Per loop step a program holds BLOCK_H heads,
    sized so the step's tile is the launch module's per-program elementwise chunk (1024
    elements with 32-wide warps, 2048 with 64-wide): for Llama's hs=128 that is 8 heads per step,
    so 32 q heads take 4 steps and 8 kv heads 1 step, with no masked-off lanes and fp32 math that
    stays in registers. q and k get their own BLOCK_H so a few kv heads do not run a q-sized,
    mostly masked tile. num_warps is row_plan's for a "row" of one step's tile (16-byte
    accesses per thread, within the device's thread limit). The qk-norm backward uses the same
    plan: for hs=128 bf16 (2 warps) it compiles for sm_90 to ~138 registers without spills, so
    the 4 persistent programs per SM fit at once (4 warps would need ~212 registers each)."""
    hs, nh, ng = q.shape[-1], q.shape[1], k.shape[1]
    half, n_tail = n // 2, hs - n
    block_d = next_pow2(half)
    block_tail = next_pow2(n_tail)
    head_cols = 2 * block_d + (block_tail if n_tail > 0 else 0)
    chunk = elementwise_plan(q.numel() + k.numel(), q.device).block
    per_step = max(1, chunk // head_cols)
    per_step = 1 << (per_step.bit_length() - 1)  # power of two, as tl.arange requires
    block_hq = min(next_pow2(nh), per_step)
    block_hk = min(next_pow2(ng), per_step)
    warps = row_plan(block_hq * head_cols, q.element_size(), q.device).num_warps
    return block_d, block_tail, block_hq, block_hk, warps


def _cs_batch_strides(cos: torch.Tensor, sin: torch.Tensor) -> tuple[int, int]:
    # batch 1 broadcasts over B
    return (cos.stride(0) if cos.shape[0] != 1 else 0), (sin.stride(0) if sin.shape[0] != 1 else 0)


def _launch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    qo: torch.Tensor, ko: torch.Tensor, interleave: bool, backward: bool,
    q_weight: torch.Tensor | None = None, k_weight: torch.Tensor | None = None, eps: float = 0.0,
    offset: float = 0.0,
) -> None:
    """Forward (with qk-norm when weights are given) or the plain rotation's backward: one program per row."""
    B, nh, T, hs = q.shape
    ng = k.shape[1]
    n = cos.shape[-1]
    half, n_tail = n // 2, hs - n
    if B * T == 0:
        return
    block_d, block_tail, block_hq, block_hk, warps = _blocks(q, k, n)
    sc_b, ss_b = _cs_batch_strides(cos, sin)
    has_norm = q_weight is not None
    wq = q_weight if has_norm else q  # not read without HAS_NORM
    wk = k_weight if has_norm else k
    _rope_kernel[(B * T,)](
        q, k, qo, ko, cos, sin, wq, wk,
        T, nh, ng, half, n_tail, eps, offset,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        qo.stride(0), qo.stride(1), qo.stride(2),
        ko.stride(0), ko.stride(1), ko.stride(2),
        sc_b, cos.stride(1), cos.stride(2), ss_b, sin.stride(1), sin.stride(2),
        wq.stride(0) if has_norm else 0, wk.stride(0) if has_norm else 0,
        X_PAIRS=interleave and not backward, O_PAIRS=interleave and backward, BACKWARD=backward,
        HAS_NORM=has_norm, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_D=block_d, BLOCK_TAIL=block_tail,
        HAS_TAIL=n_tail > 0, num_warps=warps,
    )


def _launch_norm_bwd(
    dq: torch.Tensor, dk: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    q_weight: torch.Tensor, k_weight: torch.Tensor, dq_in: torch.Tensor, dk_in: torch.Tensor,
    dwq_partial: torch.Tensor, dwk_partial: torch.Tensor, interleave: bool, eps: float, offset: float,
    need_dw: bool, n_prog: int,
) -> None:
    """Backward of qk-norm + rotation on a persistent grid of ``n_prog`` programs."""
    B, nh, T, hs = q.shape
    ng = k.shape[1]
    n = cos.shape[-1]
    half, n_tail = n // 2, hs - n
    n_rows = B * T
    block_d, block_tail, block_hq, block_hk, warps = _blocks(q, k, n)
    sc_b, ss_b = _cs_batch_strides(cos, sin)
    _rope_norm_bwd_kernel[(n_prog,)](
        dq, dk, q, k, dq_in, dk_in, cos, sin, q_weight, k_weight, dwq_partial, dwk_partial,
        n_rows, T, nh, ng, half, n_tail, eps, offset,
        dq.stride(0), dq.stride(1), dq.stride(2), dq.stride(3),
        dk.stride(0), dk.stride(1), dk.stride(2), dk.stride(3),
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        dq_in.stride(0), dq_in.stride(1), dq_in.stride(2),
        dk_in.stride(0), dk_in.stride(1), dk_in.stride(2),
        sc_b, cos.stride(1), cos.stride(2), ss_b, sin.stride(1), sin.stride(2),
        q_weight.stride(0), k_weight.stride(0),
        PAIRS=interleave, NEED_DW=need_dw, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_D=block_d,
        BLOCK_TAIL=block_tail, HAS_TAIL=n_tail > 0, num_warps=warps,
    )


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
def _rope_fwd_impl(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    qo = _new_like(q, _heads_inner(q))  # (B, nh, T, hs)
    ko = _new_like(k, _heads_inner(k))  # (B, ng, T, hs)
    _launch(q, k, cos, sin, qo, ko, interleave, backward=False)
    return qo, ko


_rope_fwd = torch.library.custom_op("lit_liger::rope_fwd", _rope_fwd_impl, mutates_args=())


@_rope_fwd.register_fake
def _(q, k, cos, sin, interleave):
    return _new_like(q, _heads_inner(q)), _new_like(k, _heads_inner(k))


def _rope_bwd_impl(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool,
    q_heads_inner: bool, k_heads_inner: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # the input gradients take q's / k's layout so they flow back through LitGPT's views copy-free
    dq_in = _new_like(dq, q_heads_inner)  # (B, nh, T, hs)
    dk_in = _new_like(dk, k_heads_inner)  # (B, ng, T, hs)
    _launch(dq, dk, cos, sin, dq_in, dk_in, interleave, backward=True)
    return dq_in, dk_in


_rope_bwd = torch.library.custom_op("lit_liger::rope_bwd", _rope_bwd_impl, mutates_args=())


@_rope_bwd.register_fake
def _(dq, dk, cos, sin, interleave, q_heads_inner, k_heads_inner):
    return _new_like(dq, q_heads_inner), _new_like(dk, k_heads_inner)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, interleave = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleave = interleave
    ctx.q_heads_inner = _heads_inner(q)
    ctx.k_heads_inner = _heads_inner(k)
    ctx.q_shape, ctx.k_shape = q.shape, k.shape


def _backward(ctx, dq, dk, bwd=_rope_bwd):
    cos, sin = ctx.saved_tensors
    if dq is None:
        dq = cos.new_zeros(ctx.q_shape, dtype=dk.dtype)
    if dk is None:
        dk = cos.new_zeros(ctx.k_shape, dtype=dq.dtype)
    dq_in, dk_in = bwd(dq, dk, cos, sin, ctx.interleave, ctx.q_heads_inner, ctx.k_heads_inner)
    return (
        dq_in if ctx.needs_input_grad[0] else None,
        dk_in if ctx.needs_input_grad[1] else None,
        None,  # cos, sin: rope buffers, no gradient (rope() refuses ones that require grad)
        None,
        None,
    )


_rope_fwd.register_autograd(_backward, setup_context=_setup_context)


class _RopeFn(torch.autograd.Function):
    """Eager fast path: the same kernels and autograd as the custom op, without the custom-op
    dispatcher's per-call host overhead (tens of microseconds, comparable to the kernels
    themselves at LitGPT sizes). ``torch.compile`` traces the custom op instead (see ``_fwd``)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, interleave):
        out = _rope_fwd_impl(q, k, cos, sin, interleave)
        _setup_context(ctx, (q, k, cos, sin, interleave), out)
        ctx.set_materialize_grads(False)  # _backward builds the zeros of an unused output itself
        return out

    @staticmethod
    def backward(ctx, dq, dk):
        return _backward(ctx, dq, dk, bwd=_rope_bwd_impl)


def _fwd(q, k, cos, sin, interleave):
    if torch.compiler.is_compiling():
        return _rope_fwd(q, k, cos, sin, interleave)
    return _RopeFn.apply(q, k, cos, sin, interleave)


# qk-norm + RoPE: its own pair of ops (the plain rotation's saved state and backward stay as above)
def _rope_qk_norm_fwd_impl(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_weight: torch.Tensor,
    k_weight: torch.Tensor, interleave: bool, eps: float, offset: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    qo = _new_like(q, _heads_inner(q))  # (B, nh, T, hs)
    ko = _new_like(k, _heads_inner(k))  # (B, ng, T, hs)
    _launch(q, k, cos, sin, qo, ko, interleave, False, q_weight, k_weight, eps, offset)
    return qo, ko


_rope_qk_norm_fwd = torch.library.custom_op("lit_liger::rope_qk_norm_fwd", _rope_qk_norm_fwd_impl, mutates_args=())


@_rope_qk_norm_fwd.register_fake
def _(q, k, cos, sin, q_weight, k_weight, interleave, eps, offset):
    return _new_like(q, _heads_inner(q)), _new_like(k, _heads_inner(k))


def _rope_qk_norm_bwd_impl(
    dq: torch.Tensor, dk: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    q_weight: torch.Tensor, k_weight: torch.Tensor, interleave: bool, eps: float, offset: float, need_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq_in, dk_in, dq_weight, dk_weight)``; the weight gradients are empty unless ``need_dw``."""
    dq_in = _new_like(q, _heads_inner(q))  # input gradients in the inputs' layout (see _rope_bwd_impl)
    dk_in = _new_like(k, _heads_inner(k))
    B, _, T, hs = q.shape
    n_rows = B * T
    n_prog = partial_rows(n_rows, q.device)
    dw_shape = (n_prog, hs) if need_dw else (0,)
    dwq_partial = torch.empty(dw_shape, dtype=torch.float32, device=q.device)
    dwk_partial = torch.empty(dw_shape, dtype=torch.float32, device=q.device)
    if n_rows > 0:
        _launch_norm_bwd(
            dq, dk, q, k, cos, sin, q_weight, k_weight, dq_in, dk_in, dwq_partial, dwk_partial,
            interleave, eps, offset, need_dw, n_prog,
        )
    if not need_dw:
        return dq_in, dk_in, q_weight.new_empty(0), k_weight.new_empty(0)
    if n_rows == 0:
        return dq_in, dk_in, torch.zeros_like(q_weight), torch.zeros_like(k_weight)
    return dq_in, dk_in, dwq_partial.sum(0).to(q_weight.dtype), dwk_partial.sum(0).to(k_weight.dtype)


_rope_qk_norm_bwd = torch.library.custom_op("lit_liger::rope_qk_norm_bwd", _rope_qk_norm_bwd_impl, mutates_args=())


@_rope_qk_norm_bwd.register_fake
def _(dq, dk, q, k, cos, sin, q_weight, k_weight, interleave, eps, offset, need_dw):
    if need_dw:
        dwq, dwk = q_weight.new_empty(q_weight.shape), k_weight.new_empty(k_weight.shape)
    else:
        dwq, dwk = q_weight.new_empty(0), k_weight.new_empty(0)
    return _new_like(q, _heads_inner(q)), _new_like(k, _heads_inner(k)), dwq, dwk


def _setup_context_norm(ctx, inputs, output):
    q, k, cos, sin, q_weight, k_weight, interleave, eps, offset = inputs
    # the inputs themselves: backward recomputes each head's rstd from them (no extra tensor kept)
    ctx.save_for_backward(q, k, cos, sin, q_weight, k_weight)
    ctx.interleave, ctx.eps, ctx.offset = interleave, eps, offset


def _backward_norm(ctx, dq, dk, bwd=_rope_qk_norm_bwd):
    q, k, cos, sin, q_weight, k_weight = ctx.saved_tensors
    if dq is None:
        dq = q.new_zeros(q.shape)
    if dk is None:
        dk = k.new_zeros(k.shape)
    need = ctx.needs_input_grad
    need_dw = need[4] or need[5]
    dq_in, dk_in, dwq, dwk = bwd(dq, dk, q, k, cos, sin, q_weight, k_weight, ctx.interleave, ctx.eps, ctx.offset, need_dw)
    return (
        dq_in if need[0] else None,
        dk_in if need[1] else None,
        None,  # cos, sin: rope buffers
        None,
        dwq if need[4] else None,
        dwk if need[5] else None,
        None,
        None,
        None,
    )


_rope_qk_norm_fwd.register_autograd(_backward_norm, setup_context=_setup_context_norm)


class _RopeQKNormFn(torch.autograd.Function):
    """Eager fast path of the qk-norm + RoPE custom op (see ``_RopeFn``)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, q_weight, k_weight, interleave, eps, offset):
        out = _rope_qk_norm_fwd_impl(q, k, cos, sin, q_weight, k_weight, interleave, eps, offset)
        _setup_context_norm(ctx, (q, k, cos, sin, q_weight, k_weight, interleave, eps, offset), out)
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, dq, dk):
        return _backward_norm(ctx, dq, dk, bwd=_rope_qk_norm_bwd_impl)


def _fwd_norm(q, k, cos, sin, q_weight, k_weight, interleave, eps, offset):
    if torch.compiler.is_compiling():
        return _rope_qk_norm_fwd(q, k, cos, sin, q_weight, k_weight, interleave, eps, offset)
    return _RopeQKNormFn.apply(q, k, cos, sin, q_weight, k_weight, interleave, eps, offset)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _check(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_float(name, t)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q and k must be 4-D (B, n_heads, T, head_size), got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    check_same_dtype(q=q, k=k)
    check_same_device(q=q, k=k, cos=cos, sin=sin)
    B, _, T, hs = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, T, hs):
        raise ValueError(
            f"k {tuple(k.shape)} must match q {tuple(q.shape)} in batch, sequence length and head size "
            "(only the number of heads may differ)"
        )
    if cos.dim() != 3 or sin.dim() != 3:
        raise ValueError(f"cos and sin must be 3-D (1|B, T, n), got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.shape[1] != T:
        raise ValueError(f"cos/sin shape {tuple(cos.shape)}: dim 1 must be the sequence length T={T} of q and k")
    if cos.shape[0] not in (1, B):
        raise ValueError(f"cos/sin shape {tuple(cos.shape)}: batch dim must be 1 or B={B}")
    n = cos.shape[2]
    if n % 2 != 0 or n > hs:
        raise ValueError(
            f"cos/sin last dim (rotated elements per head) must be even and <= head size {hs}, got {n}"
        )
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            "cos/sin require grad, but rope() does not compute gradients for them (they are rope buffers); "
            "pass cos.detach() / sin.detach()"
        )


def _check_norm(q: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None) -> None:
    if (q_weight is None) != (k_weight is None):
        raise ValueError(
            "qk-norm needs both q_weight and k_weight (the RMSNorm weights of q and k heads), or neither; "
            f"got q_weight={'None' if q_weight is None else 'a tensor'}, k_weight={'None' if k_weight is None else 'a tensor'}"
        )
    if q_weight is None:
        return
    hs = q.shape[-1]
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check_float(name, w)
        if w.dim() != 1 or w.shape[0] != hs:
            raise ValueError(f"{name} must be 1-D of the head size ({hs},), got shape {tuple(w.shape)}")
    check_same_device(q=q, q_weight=q_weight, k_weight=k_weight)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False, *,
    q_weight: torch.Tensor | None = None, k_weight: torch.Tensor | None = None, eps: float = 1e-6,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_rot, k_rot)``: LitGPT's ``apply_rope`` (``apply_rope_interleave`` with ``interleave``) on the
    first ``cos.shape[-1]`` elements of every head of q ``(B, nh, T, hs)`` and k ``(B, ng, T, hs)``,
    the rest passed through; both in one kernel launch. See the module docstring for the layout.

    With ``q_weight`` and ``k_weight`` (both ``(hs,)``), every q / k head is first normalized as
    ``litgpt.model.RMSNorm(hs, eps=eps, add_unit_offset=offset == 1.0)`` does it (LitGPT's
    ``norm_qk_type="default"``), in the same launch; their gradients are computed."""
    _check(q, k, cos, sin)
    _check_norm(q, q_weight, k_weight)
    if not use_triton(q):
        return rope_reference(
            q, k, cos, sin, bool(interleave), q_weight=q_weight, k_weight=k_weight, eps=eps, offset=offset
        )
    if q_weight is None:
        return _fwd(q, k, cos, sin, bool(interleave))
    return _fwd_norm(q, k, cos, sin, q_weight, k_weight, bool(interleave), float(eps), float(offset))


# ----------------------------------------------------------------------------------------------
# RoPE on the fused qkv projection: the backward writes the whole qkv gradient
# ----------------------------------------------------------------------------------------------
def _qkv_views(qkv: torch.Tensor, n_head: int, n_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LitGPT's q, k, v views of a ``(B, T, (nh + 2 ng) * hs)`` qkv tensor: ``split`` + ``view`` +
    ``transpose`` to ``(B, nh|ng, T, hs)`` (no copies)."""
    B, T, C = qkv.shape
    hs = C // (n_head + 2 * n_groups)
    q, k, v = qkv.split((n_head * hs, n_groups * hs, n_groups * hs), dim=-1)
    return (q.view(B, T, n_head, hs).transpose(1, 2), k.view(B, T, n_groups, hs).transpose(1, 2),
            v.view(B, T, n_groups, hs).transpose(1, 2))


class _RopeQKVFn(torch.autograd.Function):
    """``(rope(q), rope(k), v)`` of a qkv tensor. The backward writes dq and dk, rotated back, and dv
    straight into one qkv-shaped gradient: the ``split``'s backward (a concatenation that reads dq, dk
    and dv again) never runs. v is returned as a copy in its own (B, T, ng, hs) buffer, not a view:
    attention keeps v for its backward, and a view would keep the whole qkv projection alive with it
    (for 32 q / 8 kv heads that is 6x the size of v), while nothing else needs qkv after this."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, n_head, n_groups, interleave):
        q, k, v = _qkv_views(qkv, n_head, n_groups)
        v = _new_like(v, heads_inner=True).copy_(v)  # (B, ng, T, hs) view of its own (B, T, ng, hs) buffer
        qo, ko = _rope_fwd_impl(q, k, cos, sin, interleave)
        ctx.save_for_backward(cos, sin)
        ctx.meta = (n_head, n_groups, interleave, qkv.shape, qkv.dtype)
        ctx.set_materialize_grads(False)
        return qo, ko, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        n_head, n_groups, interleave, shape, dtype = ctx.meta
        dqkv = torch.empty(shape, dtype=dtype, device=cos.device)  # (B, T, (nh + 2 ng) * hs)
        dq_in, dk_in, dv_in = _qkv_views(dqkv, n_head, n_groups)
        if dq is None:
            dq = torch.zeros_like(dq_in)
        if dk is None:
            dk = torch.zeros_like(dk_in)
        _launch(dq, dk, cos, sin, dq_in, dk_in, interleave, backward=True)
        if dv is None:
            dv_in.zero_()
        else:
            dv_in.copy_(dv)
        return dqkv, None, None, None, None, None


def rope_qkv(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_head: int, n_query_groups: int,
    interleave: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_rot, k_rot, v)`` from LitGPT's fused qkv projection ``(B, T, (nh + 2 ng) * hs)``: the q, k, v
    views LitGPT's ``CausalSelfAttention`` makes (``split``, ``view``, ``transpose``), with :func:`rope`
    applied to q and k (same layout, same numbers) and v a view (in training a copy in its own
    buffer, so that attention keeping v for backward does not keep all of qkv alive). In training
    the gradient of ``qkv`` is written by the RoPE backward kernel itself (dv copied beside it),
    instead of RoPE writing dq and dk and the split's backward concatenating them again. Under
    ``torch.compile`` it traces as the split plus :func:`rope`'s custom op (whose backward the
    compiler fuses with the concatenation)."""
    if qkv.dim() != 3:
        raise ValueError(f"qkv must be (B, T, (n_head + 2 * n_query_groups) * head_size), got {tuple(qkv.shape)}")
    if n_head <= 0 or n_query_groups <= 0 or qkv.shape[-1] % (n_head + 2 * n_query_groups):
        raise ValueError(
            f"qkv's last dim {qkv.shape[-1]} is not (n_head + 2 * n_query_groups) = {n_head + 2 * n_query_groups} "
            "times a head size"
        )
    q, k, v = _qkv_views(qkv, n_head, n_query_groups)
    _check(q, k, cos, sin)
    interleave = bool(interleave)
    training = torch.is_grad_enabled() and qkv.requires_grad
    if not use_triton(q) or torch.compiler.is_compiling() or not training:
        # v in its own buffer in training here too: under torch.compile a saved view of qkv would keep
        # the whole projection alive (the compiler's partitioner then saves the small copy instead)
        return (*rope(q, k, cos, sin, interleave), own_buffer(v) if training else v)
    return _RopeQKVFn.apply(qkv, cos, sin, n_head, n_query_groups, interleave)


def own_buffer(t: torch.Tensor) -> torch.Tensor:
    """A copy of a ``(B, heads, T, hs)`` head view (of a qkv projection) in its own ``(B, T, heads, hs)``
    buffer, the layout the view had: what attention saves for backward then keeps only these heads
    alive, not the whole projection the view came from."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)
