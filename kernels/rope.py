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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check_float, check_same_device, check_same_dtype
from ._launch import elementwise_plan, row_plan, use_triton

__all__ = ["rope", "rope_reference"]


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


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """LitGPT's ``apply_rope``/``apply_rope_interleave`` on the first ``n`` elements + tail, in PyTorch."""
    return _rope_reference_one(q, cos, sin, interleave), _rope_reference_one(k, cos, sin, interleave)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _rope_heads(
    X, O, x_row, o_row, n_heads, sx_h, sx_d, so_h,
    c1, c2, s1, s2, half, n_tail,
    X_PAIRS: tl.constexpr, O_PAIRS: tl.constexpr, BACKWARD: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_TAIL: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """All ``n_heads`` heads of one (b, t) row of X -> O, ``BLOCK_H`` heads per step.

    Per step reads a ``[BLOCK_H, BLOCK_D]`` tile of each rotated half (``x1``, ``x2``) and, with a
    tail, a ``[BLOCK_H, BLOCK_TAIL]`` tile of the pass-through elements; writes the same tiles of O.
    ``X_PAIRS``: the halves are read as the even/odd elements (interleave forward); ``O_PAIRS``: they
    are written there (interleave backward). O has unit stride on the head dim."""
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    if X_PAIRS:
        xa = 2 * d
        xb = 2 * d + 1
    else:
        xa = d
        xb = d + half
    if O_PAIRS:
        oa = 2 * d
        ob = 2 * d + 1
    else:
        oa = d
        ob = d + half
    e = tl.arange(0, BLOCK_TAIL)
    emask = e < n_tail
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)
        hmask = h < n_heads
        m = hmask[:, None] & dmask[None, :]
        xp = X + x_row + h[:, None] * sx_h  # [BLOCK_H, 1] pointers to the heads of this row
        op = O + o_row + h[:, None] * so_h
        a = tl.load(xp + xa[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        b = tl.load(xp + xb[None, :] * sx_d, mask=m, other=0.0).to(tl.float32)
        if BACKWARD:
            ya = a * c1 + b * s2
            yb = b * c2 - a * s1
        else:
            ya = a * c1 - b * s1
            yb = b * c2 + a * s2
        tl.store(op + oa[None, :], ya.to(O.dtype.element_ty), mask=m)
        tl.store(op + ob[None, :], yb.to(O.dtype.element_ty), mask=m)
        if HAS_TAIL:
            tm = hmask[:, None] & emask[None, :]
            tail = tl.load(xp + (2 * half + e)[None, :] * sx_d, mask=tm, other=0.0)
            tl.store(op + (2 * half + e)[None, :], tail.to(O.dtype.element_ty), mask=tm)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN,
    T, n_qh, n_kh, half, n_tail,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sko_b, sko_h, sko_t,
    sc_b, sc_t, sc_d, ss_b, ss_t, ss_d,
    X_PAIRS: tl.constexpr, O_PAIRS: tl.constexpr, BACKWARD: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, HAS_TAIL: tl.constexpr,
):
    """One program per (b, t) row. Reads cos[b|0, t, :n] and sin[b|0, t, :n] once (fp32), then
    rotates every q head and every k head of that row (forward: by +sin; ``BACKWARD``: by -sin,
    i.e. Q/K hold dq/dk of the outputs and QO/KO receive the input gradients). The cos/sin batch
    stride is 0 when they have batch dim 1."""
    row = tl.program_id(0).to(tl.int64)
    bi = row // T
    ti = row % T
    d = tl.arange(0, BLOCK_D)
    dmask = d < half
    cp = COS + bi * sc_b + ti * sc_t
    sp = SIN + bi * ss_b + ti * ss_t
    c1 = tl.load(cp + d * sc_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cp + (d + half) * sc_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sp + d * ss_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sp + (d + half) * ss_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    _rope_heads(
        Q, QO, bi * sq_b + ti * sq_t, bi * sqo_b + ti * sqo_t, n_qh, sq_h, sq_d, sqo_h,
        c1, c2, s1, s2, half, n_tail,
        X_PAIRS, O_PAIRS, BACKWARD, BLOCK_HQ, BLOCK_D, BLOCK_TAIL, HAS_TAIL,
    )
    _rope_heads(
        K, KO, bi * sk_b + ti * sk_t, bi * sko_b + ti * sko_t, n_kh, sk_h, sk_d, sko_h,
        c1, c2, s1, s2, half, n_tail,
        X_PAIRS, O_PAIRS, BACKWARD, BLOCK_HK, BLOCK_D, BLOCK_TAIL, HAS_TAIL,
    )


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


def _launch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    qo: torch.Tensor, ko: torch.Tensor, interleave: bool, backward: bool,
) -> None:
    B, nh, T, hs = q.shape
    ng = k.shape[1]
    n = cos.shape[-1]
    half, n_tail = n // 2, hs - n
    if B * T == 0:
        return
    # Why these blocks: a program owns one (b, t) row, so cos/sin are read once and reused by all
    # nh + ng heads. One head needs its two rotated halves (BLOCK_D = next power of two >= n/2,
    # each half one tile column range) plus the tail. Per loop step a program holds BLOCK_H heads,
    # sized so the step's tile is the launch module's per-program elementwise chunk (1024
    # elements with 32-wide warps, 2048 with 64-wide): for Llama's hs=128 that is 8 heads per step,
    # so 32 q heads take 4 steps and 8 kv heads 1 step, with no masked-off lanes and fp32 math that
    # stays in registers. q and k get their own BLOCK_H so a few kv heads do not run a q-sized,
    # mostly masked tile. num_warps is row_plan's for a "row" of one step's tile (16-byte
    # accesses per thread, within the device's thread limit).
    block_d = triton.next_power_of_2(max(half, 1))
    block_tail = triton.next_power_of_2(max(n_tail, 1))
    head_cols = 2 * block_d + (block_tail if n_tail > 0 else 0)
    chunk = elementwise_plan(q.numel() + k.numel(), q.device).block
    per_step = max(1, chunk // head_cols)
    per_step = 1 << (per_step.bit_length() - 1)  # power of two, as tl.arange requires
    block_hq = min(triton.next_power_of_2(max(nh, 1)), per_step)
    block_hk = min(triton.next_power_of_2(max(ng, 1)), per_step)
    warps = row_plan(block_hq * head_cols, q.element_size(), q.device).num_warps
    sc_b = cos.stride(0) if cos.shape[0] != 1 else 0  # batch 1 broadcasts over B
    ss_b = sin.stride(0) if sin.shape[0] != 1 else 0
    _rope_kernel[(B * T,)](
        q, k, qo, ko, cos, sin,
        T, nh, ng, half, n_tail,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        qo.stride(0), qo.stride(1), qo.stride(2),
        ko.stride(0), ko.stride(1), ko.stride(2),
        sc_b, cos.stride(1), cos.stride(2), ss_b, sin.stride(1), sin.stride(2),
        X_PAIRS=interleave and not backward, O_PAIRS=interleave and backward, BACKWARD=backward,
        BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_D=block_d, BLOCK_TAIL=block_tail,
        HAS_TAIL=n_tail > 0, num_warps=warps,
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


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_rot, k_rot)``: LitGPT's ``apply_rope`` (``apply_rope_interleave`` with ``interleave``) on the
    first ``cos.shape[-1]`` elements of every head of q ``(B, nh, T, hs)`` and k ``(B, ng, T, hs)``,
    the rest passed through; both in one kernel launch. See the module docstring for the layout."""
    _check(q, k, cos, sin)
    if not use_triton(q):
        return rope_reference(q, k, cos, sin, bool(interleave))
    return _fwd(q, k, cos, sin, bool(interleave))
