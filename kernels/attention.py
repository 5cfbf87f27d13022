"""Causal self-attention with an optional logit softcap (Gemma-2), in Triton: forward and backward.

``softcap_attention(q, k, v, scale, softcap)`` computes, for ``q (B, nh, T, hs)`` and ``k, v (B, ng, T, hs)``
(``nh`` a multiple of ``ng``: GQA/MQA read each kv head where it is)::

    z = scale * q @ kᵀ;  z = softcap * tanh(z / softcap)  (if softcap);  causal mask;  softmax(z) @ v

exactly LitGPT's order (scale, then softcap, then the mask). No ``(T, T)`` tensor is kept: the forward is
an online softmax over key blocks that saves one log-sum-exp per query row; the backward recomputes each
block's scores, and the softcap's derivative ``1 - tanh²`` comes from the recomputed ``tanh``. Two backward
kernels: one per key block (``dk``, ``dv``, summed over the query heads of its group, so no atomics) and one
per query block (``dq``). The key-block kernel accumulates ``(BLOCK_N, hs)`` tiles or, with the plan's
``kv_hs_major``, their transposes ``(hs, BLOCK_N)``: the head size is then its dots' M, which lets Hopper run them as
warp-group MMAs with key blocks small enough for the registers. Query-block programs start with the last block (the
most keys under the causal mask).

The output is returned as a ``(B, nh, T, hs)`` view of a ``(B, T, nh, hs)`` tensor: LitGPT's next step,
``y.transpose(1, 2).reshape(B, T, C)``, is then a view, not a copy.

CUDA tensors (and CPU tensors under ``TRITON_INTERPRET=1``) run the kernels; other CPU tensors run
:func:`reference`, the same math in PyTorch. ``torch.compile`` traces the custom ops ``lit_liger::attn_fwd`` /
``attn_bwd`` (opaque, with fake implementations). Launch settings: ``_launch.attention_plan``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.utils.weak import WeakIdKeyDictionary

from ._checks import check_float, check_same_device, check_same_dtype
from ._launch import attention_plan, cdiv, use_triton

__all__ = ["softcap_attention", "reference", "sample_starts"]

_LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in fp32. ``UPCAST``: both operands taken to fp32 first, for bf16 under Triton's
    interpreter (CI), whose bf16 ``tl.dot`` returns garbage (triton 3.x); the operands hold bf16 values already, so
    the products are the GPU's."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _scores(qk, scale2, cap_c1, cap2, HAS_CAP: tl.constexpr):
    """Base-2 logits of raw ``q·k`` (``log2(e) * z``) and, with a softcap, ``tanh(scale * q·k / cap)``."""
    if HAS_CAP:
        # tanh(u) = 1 - 2 / (exp(2u) + 1): exact at both ends (exp2 -> inf gives 1, -> 0 gives -1)
        t = 1.0 - 2.0 / (tl.exp2(qk * cap_c1) + 1.0)
        return t * cap2, t
    return qk * scale2, qk


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k_base, v_base, kv, offs_m, offs_n, skt, svt, T, scale2, cap_c1, cap2, st,
               MASKED: tl.constexpr, HAS_CAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
               VARLEN: tl.constexpr):
    """One key block of the online softmax. ``VARLEN``: ``st`` holds each row's first key (its sample's start), and
    the masked blocks also hide the keys before it (a row may then see no key of a block: its max stays -inf)."""
    cols = kv + offs_n
    k = tl.load(k_base + cols[:, None] * skt, mask=cols[:, None] < T, other=0.0)
    v = tl.load(v_base + cols[:, None] * svt, mask=cols[:, None] < T, other=0.0)
    z, _ = _scores(_dot(q, tl.trans(k), PREC, UPCAST), scale2, cap_c1, cap2, HAS_CAP)
    if MASKED:
        if VARLEN:
            z = tl.where((cols[None, :] <= offs_m[:, None]) & (cols[None, :] >= st[:, None]), z, float("-inf"))
        else:
            z = tl.where(cols[None, :] <= offs_m[:, None], z, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(z, 1))
    if VARLEN:
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # (no key yet: p = 0, not -inf - -inf)
    p = tl.exp2(z - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC, UPCAST)
    return acc, l_i, m_new


@triton.jit
def _query_block(K, V, skb, skh, svb, svh, T, NH, GROUP, HS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """A query-block program's indices: its first row, (batch, head) index, batch, head, the row / key / feature
    offsets, which rows exist, and the bases of its kv head's k and v (GQA: head ``h`` reads kv head
    ``h // GROUP``). The last query block (the most keys under the causal mask) goes to the first program, so the
    longest programs start first and the short ones fill the last wave."""
    start = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // NH
    h = bh % NH
    g = h // GROUP
    offs_m = start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HS)
    k_base = K + b.to(tl.int64) * skb + g * skh + offs_d[None, :]
    v_base = V + b.to(tl.int64) * svb + g * svh + offs_d[None, :]
    return start, bh, b, h, offs_m, tl.arange(0, BLOCK_N), offs_d, offs_m < T, k_base, v_base


@triton.jit
def _cdiv(a, b: tl.constexpr):
    return (a + b - 1) // b


@triton.jit
def _varlen_keys(STARTS, offs_m, row_ok, start, T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A query block's keys over packed samples: its rows' first keys ``st`` (``STARTS``: nondecreasing, each row's
    sample start), the first key block (the one holding the block's first row's start: whole blocks of earlier
    samples are skipped), and ``[full_lo, full_end)``: the key blocks every row sees whole (at or after the last
    row's start, before the first row), which need no mask; the blocks before and after them do."""
    st = tl.load(STARTS + offs_m, mask=row_ok, other=0)
    last = tl.minimum(start + BLOCK_M, T) - 1
    kv_lo = (tl.load(STARTS + start) // BLOCK_N) * BLOCK_N
    full_end = (start // BLOCK_N) * BLOCK_N  # (the diagonal's first key block)
    full_lo = tl.minimum(_cdiv(tl.load(STARTS + last), BLOCK_N) * BLOCK_N, full_end)
    return st, kv_lo, full_lo, full_end


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
    T, NH, GROUP, scale2, cap_c1, cap2, STARTS,
    HAS_CAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, HS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr,
):
    start, bh, b, h, offs_m, offs_n, offs_d, row_ok, k_base, v_base = _query_block(
        K, V, skb, skh, svb, svh, T, NH, GROUP, HS, BLOCK_M, BLOCK_N)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HS), tl.float32)
    if VARLEN:
        st, kv_lo, full_lo, full_end = _varlen_keys(STARTS, offs_m, row_ok, start, T, BLOCK_M, BLOCK_N)
        for kv in range(kv_lo, full_lo, BLOCK_N):
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                                       scale2, cap_c1, cap2, st, True, HAS_CAP, PREC, UPCAST, True)
        for kv in range(full_lo, full_end, BLOCK_N):
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                                       scale2, cap_c1, cap2, st, False, HAS_CAP, PREC, UPCAST, True)
        for kv in range(full_end, tl.minimum(start + BLOCK_M, T), BLOCK_N):
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                                       scale2, cap_c1, cap2, st, True, HAS_CAP, PREC, UPCAST, True)
    else:
        # key blocks wholly below the first query row need no mask; the rest up to the diagonal do
        full_end = (start // BLOCK_N) * BLOCK_N
        for kv in range(0, full_end, BLOCK_N):
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                                       scale2, cap_c1, cap2, 0, False, HAS_CAP, PREC, UPCAST, False)
        for kv in range(full_end, tl.minimum(start + BLOCK_M, T), BLOCK_N):
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                                       scale2, cap_c1, cap2, 0, True, HAS_CAP, PREC, UPCAST, False)
    acc = acc / l_i[:, None]
    tl.store(O + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :],
             acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + bh.to(tl.int64) * T + offs_m, m_i + tl.log2(l_i), mask=row_ok)


@triton.jit
def _attn_delta_kernel(O, DO, DELTA, sob, soh, sot, sdb, sdh, sdt, T, NH, HS: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta = rowsum(dO * O)`` in fp32, per query row."""
    bh = tl.program_id(1)
    b = bh // NH
    h = bh % NH
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HS)
    mask = offs_m[:, None] < T
    o = tl.load(O + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=mask, other=0.0)
    tl.store(DELTA + bh.to(tl.int64) * T + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=offs_m < T)


@triton.jit
def _dkdv_block(dk, dv, k, v, q_base, do_base, row_base, qs, offs_m, offs_n, sqt, sdt, T, LSE, DELTA,
                scale2, cap_c1, cap2, STARTS, MASKED: tl.constexpr, HAS_CAP: tl.constexpr, PREC: tl.constexpr,
                UPCAST: tl.constexpr, HS_MAJOR: tl.constexpr, VARLEN: tl.constexpr):
    """One query block's contribution to a key block's ``dk``, ``dv``: ``(BLOCK_N, HS)``, or with ``HS_MAJOR``
    their transposes ``(HS, BLOCK_N)`` (the head size is then the M of their dots: warp-group MMAs on Hopper
    whatever the key block's size)."""
    rows = qs + offs_m
    row_ok = rows < T
    q = tl.load(q_base + rows[:, None] * sqt, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_base + rows[:, None] * sdt, mask=row_ok[:, None], other=0.0)
    # padded rows: lse = +inf gives p = 0 there
    lse = tl.load(LSE + row_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + row_base + rows, mask=row_ok, other=0.0)
    if VARLEN and MASKED:
        st = tl.load(STARTS + rows, mask=row_ok, other=T)  # each row's first key (its sample's start)
    if HS_MAJOR:
        z, t = _scores(_dot(q, tl.trans(k), PREC, UPCAST), scale2, cap_c1, cap2, HAS_CAP)
        p = tl.exp2(z - lse[:, None])  # (BLOCK_M, BLOCK_N)
        if MASKED:
            if VARLEN:
                p = tl.where((offs_n[None, :] <= rows[:, None]) & (offs_n[None, :] >= st[:, None]), p, 0.0)
            else:
                p = tl.where(offs_n[None, :] <= rows[:, None], p, 0.0)
        dv += _dot(tl.trans(do), p.to(do.dtype), PREC, UPCAST)
        if HAS_CAP:
            p = p * (1.0 - t * t)  # the softcap's derivative, folded in before dp is live
        ds = p * (_dot(do, tl.trans(v), PREC, UPCAST) - delta[:, None])
        dk += _dot(tl.trans(q), ds.to(q.dtype), PREC, UPCAST)
    else:
        zT, tT = _scores(_dot(k, tl.trans(q), PREC, UPCAST), scale2, cap_c1, cap2, HAS_CAP)
        pT = tl.exp2(zT - lse[None, :])  # (BLOCK_N, BLOCK_M)
        if MASKED:
            if VARLEN:
                pT = tl.where((offs_n[:, None] <= rows[None, :]) & (offs_n[:, None] >= st[None, :]), pT, 0.0)
            else:
                pT = tl.where(offs_n[:, None] <= rows[None, :], pT, 0.0)
        dv += _dot(pT.to(do.dtype), do, PREC, UPCAST)
        if HAS_CAP:
            pT = pT * (1.0 - tT * tT)
        dsT = pT * (_dot(v, tl.trans(do), PREC, UPCAST) - delta[None, :])
        dk += _dot(dsT.to(q.dtype), q, PREC, UPCAST)
    return dk, dv


@triton.jit
def _attn_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
    T, NH, NG, GROUP, scale, scale2, cap_c1, cap2, STARTS, QEND,
    HAS_CAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, HS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HS_MAJOR: tl.constexpr, VARLEN: tl.constexpr,
):
    """One key block of one kv head: ``dv = Σ pᵀ dO``, ``dk = Σ dsᵀ q`` over the query heads of its group and the
    query blocks at or after it (causal). ``VARLEN``: ``QEND[2 * block]`` the first query whose first key
    (``STARTS``) is after the block's first key, ``QEND[2 * block + 1]`` the first after its last: the query
    blocks from the diagonal's end to the first are unmasked, and the loop stops at the second."""
    start = tl.program_id(0) * BLOCK_N
    bg = tl.program_id(1)
    b = bg // NG
    g = bg % NG
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HS)
    col_ok = offs_n[:, None] < T
    k = tl.load(K + b.to(tl.int64) * skb + g * skh + offs_n[:, None] * skt + offs_d[None, :], mask=col_ok, other=0.0)
    v = tl.load(V + b.to(tl.int64) * svb + g * svh + offs_n[:, None] * svt + offs_d[None, :], mask=col_ok, other=0.0)
    if HS_MAJOR:
        dk = tl.zeros((HS, BLOCK_N), tl.float32)
        dv = tl.zeros((HS, BLOCK_N), tl.float32)
    else:
        dk = tl.zeros((BLOCK_N, HS), tl.float32)
        dv = tl.zeros((BLOCK_N, HS), tl.float32)
    lo = (start // BLOCK_M) * BLOCK_M
    masked_end = lo + _cdiv(start + BLOCK_N - lo, BLOCK_M) * BLOCK_M
    for hh in range(0, GROUP):
        h = g * GROUP + hh
        q_base = Q + b.to(tl.int64) * sqb + h * sqh + offs_d[None, :]
        do_base = DO + b.to(tl.int64) * sdb + h * sdh + offs_d[None, :]
        row_base = (b * NH + h).to(tl.int64) * T
        # query blocks from the one holding this key block's first row; those that start after its last
        # row need no causal mask
        # VARLEN: the query loop ends at the last query whose sample holds these keys (q_end), and only the blocks
        # from full_end on can hold queries of a later sample (masked again); otherwise both are T
        if VARLEN:
            q_full = tl.load(QEND + 2 * tl.program_id(0))
            q_end = tl.load(QEND + 2 * tl.program_id(0) + 1)
            full_end = masked_end + tl.maximum(q_full - masked_end, 0) // BLOCK_M * BLOCK_M
        else:
            q_end = T
            full_end = T
        for qs in range(lo, tl.minimum(masked_end, q_end), BLOCK_M):
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, row_base, qs, offs_m, offs_n, sqt, sdt, T,
                                 LSE, DELTA, scale2, cap_c1, cap2, STARTS, True, HAS_CAP, PREC, UPCAST,
                                 HS_MAJOR, VARLEN)
        for qs in range(masked_end, full_end, BLOCK_M):
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, row_base, qs, offs_m, offs_n, sqt, sdt, T,
                                 LSE, DELTA, scale2, cap_c1, cap2, STARTS, False, HAS_CAP, PREC, UPCAST,
                                 HS_MAJOR, VARLEN)
        for qs in range(full_end, q_end, BLOCK_M):  # (empty without VARLEN)
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, row_base, qs, offs_m, offs_n, sqt, sdt, T,
                                 LSE, DELTA, scale2, cap_c1, cap2, STARTS, True, HAS_CAP, PREC, UPCAST,
                                 HS_MAJOR, VARLEN)
    dk = dk * scale
    dk_ptr = DK + b.to(tl.int64) * sdkb + g * sdkh
    dv_ptr = DV + b.to(tl.int64) * sdvb + g * sdvh
    if HS_MAJOR:
        tl.store(dk_ptr + offs_n[None, :] * sdkt + offs_d[:, None], dk.to(DK.dtype.element_ty), mask=col_ok.T)
        tl.store(dv_ptr + offs_n[None, :] * sdvt + offs_d[:, None], dv.to(DV.dtype.element_ty), mask=col_ok.T)
    else:
        tl.store(dk_ptr + offs_n[:, None] * sdkt + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=col_ok)
        tl.store(dv_ptr + offs_n[:, None] * sdvt + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=col_ok)


@triton.jit
def _dq_block(dq, q, do, lse, delta, k_base, v_base, kv, offs_m, offs_n, skt, svt, T, scale2, cap_c1, cap2, st,
              MASKED: tl.constexpr, HAS_CAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
              VARLEN: tl.constexpr):
    cols = kv + offs_n
    k = tl.load(k_base + cols[:, None] * skt, mask=cols[:, None] < T, other=0.0)
    v = tl.load(v_base + cols[:, None] * svt, mask=cols[:, None] < T, other=0.0)
    z, t = _scores(_dot(q, tl.trans(k), PREC, UPCAST), scale2, cap_c1, cap2, HAS_CAP)
    p = tl.exp2(z - lse[:, None])
    if MASKED:
        if VARLEN:
            p = tl.where((cols[None, :] <= offs_m[:, None]) & (cols[None, :] >= st[:, None]), p, 0.0)
        else:
            p = tl.where(cols[None, :] <= offs_m[:, None], p, 0.0)
    if HAS_CAP:
        p = p * (1.0 - t * t)  # the softcap's derivative, folded in before dp is live
    ds = p * (_dot(do, tl.trans(v), PREC, UPCAST) - delta[:, None])
    return dq + _dot(ds.to(k.dtype), k, PREC, UPCAST)


@triton.jit
def _attn_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sdqb, sdqh, sdqt,
    T, NH, GROUP, scale, scale2, cap_c1, cap2, STARTS,
    HAS_CAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, HS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr,
):
    """One query block of one head: ``dq = Σ ds k`` over the key blocks up to the diagonal (``VARLEN``: from its
    rows' samples' starts, as the forward)."""
    start, bh, b, h, offs_m, offs_n, offs_d, row_ok, k_base, v_base = _query_block(
        K, V, skb, skh, svb, svh, T, NH, GROUP, HS, BLOCK_M, BLOCK_N)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, HS), tl.float32)
    if VARLEN:
        st, kv_lo, full_lo, full_end = _varlen_keys(STARTS, offs_m, row_ok, start, T, BLOCK_M, BLOCK_N)
        for kv in range(kv_lo, full_lo, BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                           scale2, cap_c1, cap2, st, True, HAS_CAP, PREC, UPCAST, True)
        for kv in range(full_lo, full_end, BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                           scale2, cap_c1, cap2, st, False, HAS_CAP, PREC, UPCAST, True)
        for kv in range(full_end, tl.minimum(start + BLOCK_M, T), BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                           scale2, cap_c1, cap2, st, True, HAS_CAP, PREC, UPCAST, True)
    else:
        full_end = (start // BLOCK_N) * BLOCK_N
        for kv in range(0, full_end, BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                           scale2, cap_c1, cap2, 0, False, HAS_CAP, PREC, UPCAST, False)
        for kv in range(full_end, tl.minimum(start + BLOCK_M, T), BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, kv, offs_m, offs_n, skt, svt, T,
                           scale2, cap_c1, cap2, 0, True, HAS_CAP, PREC, UPCAST, False)
    dq = dq * scale
    tl.store(DQ + b.to(tl.int64) * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Launches (custom ops for torch.compile; the eager autograd function calls the same impls)
# ----------------------------------------------------------------------------------------------
def _consts(scale: float, softcap: float) -> tuple[float, float, float]:
    """``scale2`` (base-2 logit per raw ``q·k`` without a cap), ``cap_c1`` (``2u·log2 e`` per raw ``q·k``, the
    tanh's argument) and ``cap2`` (``cap·log2 e``)."""
    if softcap > 0:
        return scale * _LOG2E, 2.0 * scale / softcap * _LOG2E, softcap * _LOG2E
    return scale * _LOG2E, 0.0, 0.0


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _prec(t: torch.Tensor) -> dict:
    """The dots' constexprs: fp32 inputs take full-precision dots, as LitGPT's fp32 math (TF32 would lose ~3
    digits); bf16 on CPU (the interpreter) is upcast (see ``_dot``)."""
    return dict(PREC="ieee" if t.dtype == torch.float32 else "tf32", UPCAST=_upcast(t))


def _upcast(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and t.device.type == "cpu"


def _attn_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float,
                   starts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    B, NH, T, HS = q.shape
    NG = k.shape[1]
    o = torch.empty((B, T, NH, HS), dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty((B, NH, T), dtype=torch.float32, device=q.device)
    if o.numel():
        plan = attention_plan(HS, q.dtype, q.device, T, B * NH)
        scale2, cap_c1, cap2 = _consts(scale, softcap)
        _attn_fwd_kernel[(cdiv(T, plan.fwd_m), B * NH)](
            q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            T, NH, NH // NG, scale2, cap_c1, cap2, lse if starts is None else starts,
            HAS_CAP=softcap > 0, **_prec(q), HS=HS, BLOCK_M=plan.fwd_m, BLOCK_N=plan.fwd_n, VARLEN=starts is not None,
            num_warps=plan.fwd_warps, num_stages=plan.fwd_stages,
        )
    return o, lse


_attn_fwd = torch.library.custom_op("lit_liger::attn_fwd", _attn_fwd_impl, mutates_args=())


@_attn_fwd.register_fake
def _(q, k, v, scale, softcap, starts=None):
    B, NH, T, HS = q.shape
    return q.new_empty((B, T, NH, HS)).transpose(1, 2), q.new_empty((B, NH, T), dtype=torch.float32)


def _attn_bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, scale: float, softcap: float, starts: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    do, q, k, v, o = (_unit_last(t) for t in (do, q, k, v, o))
    B, NH, T, HS = q.shape
    NG = k.shape[1]
    # gradients in the layout their forward inputs came in where that is a plain transpose of (B, T, heads, hs)
    dq = torch.empty((B, T, NH, HS), dtype=q.dtype, device=q.device).transpose(1, 2)
    dk = torch.empty((B, T, NG, HS), dtype=k.dtype, device=k.device).transpose(1, 2)
    dv = torch.empty((B, T, NG, HS), dtype=v.dtype, device=v.device).transpose(1, 2)
    if not q.numel():
        return dq, dk, dv
    plan = attention_plan(HS, q.dtype, q.device, T, B * NH)
    scale2, cap_c1, cap2 = _consts(scale, softcap)
    delta = torch.empty((B, NH, T), dtype=torch.float32, device=q.device)
    _attn_delta_kernel[(cdiv(T, plan.delta_m), B * NH)](
        o, do, delta, *o.stride()[:3], *do.stride()[:3], T, NH, HS=HS, BLOCK_M=plan.delta_m,
        num_warps=plan.delta_warps)
    common = dict(HAS_CAP=softcap > 0, **_prec(q), HS=HS, VARLEN=starts is not None)
    q_end = delta if starts is None else _query_ends(starts, T, plan.kv_n)
    _attn_dkdv_kernel[(cdiv(T, plan.kv_n), B * NG)](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        T, NH, NG, NH // NG, scale, scale2, cap_c1, cap2, delta if starts is None else starts, q_end,
        BLOCK_M=plan.kv_m, BLOCK_N=plan.kv_n, HS_MAJOR=plan.kv_hs_major, num_warps=plan.kv_warps,
        num_stages=plan.kv_stages, **common,
    )
    _attn_dq_kernel[(cdiv(T, plan.q_m), B * NH)](
        q, k, v, do, lse, delta, dq,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dq.stride()[:3],
        T, NH, NH // NG, scale, scale2, cap_c1, cap2, delta if starts is None else starts,
        BLOCK_M=plan.q_m, BLOCK_N=plan.q_n, num_warps=plan.q_warps, num_stages=plan.q_stages, **common,
    )
    return dq, dk, dv


_attn_bwd = torch.library.custom_op("lit_liger::attn_bwd", _attn_bwd_impl, mutates_args=())


#: starts -> {(T, block_n): its query ends}: the layers of one packed forward share one ``starts`` tensor
#: (``lit_liger.swap.packing.sample_starts``), whose query ends their backward computes once
_QUERY_ENDS = WeakIdKeyDictionary()


def _query_ends(starts: torch.Tensor, T: int, block_n: int) -> torch.Tensor:
    """Per key block of ``block_n`` keys, ``(first query whose first key is after the block's first key, the first
    after its last)`` (``starts`` is nondecreasing), int32 ``(2 * blocks,)``: the dK/dV kernel's unmasked query rows
    and where its query loop stops. Device ops only (no sync); once per ``starts`` tensor and version."""
    memo = _QUERY_ENDS.setdefault(starts, {})
    key = (T, block_n, starts._version)
    if key not in memo:
        memo[key] = _query_ends_of(starts, T, block_n)
    return memo[key]


def _query_ends_of(starts: torch.Tensor, T: int, block_n: int) -> torch.Tensor:
    first = torch.arange(0, T, block_n, device=starts.device, dtype=starts.dtype)
    last = (first + block_n).clamp_(max=T) - 1
    ends = torch.searchsorted(starts, torch.stack([first, last], dim=1), right=True)  # (blocks, 2)
    return ends.to(torch.int32).reshape(-1)


@_attn_bwd.register_fake
def _(do, q, k, v, o, lse, scale, softcap, starts=None):
    B, NH, T, HS = q.shape
    NG = k.shape[1]
    return (q.new_empty((B, T, NH, HS)).transpose(1, 2), k.new_empty((B, T, NG, HS)).transpose(1, 2),
            v.new_empty((B, T, NG, HS)).transpose(1, 2))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, softcap, *starts = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, *starts)
    ctx.scale, ctx.softcap = scale, softcap


def _backward(ctx, do, dlse, bwd=_attn_bwd):
    q, k, v, o, lse, *starts = ctx.saved_tensors
    starts = starts[0] if starts else None
    dq, dk, dv = bwd(do, q, k, v, o, lse, ctx.scale, ctx.softcap, starts)
    return dq, dk, dv, None, None, None


_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


class _AttnFn(torch.autograd.Function):
    """Eager path: the custom op's kernels and autograd without the dispatcher's host cost."""

    @staticmethod
    def forward(ctx, q, k, v, scale, softcap, starts=None):
        out = _attn_fwd_impl(q, k, v, scale, softcap, starts)
        _setup_context(ctx, (q, k, v, scale, softcap, starts), out)
        ctx.mark_non_differentiable(out[1])
        return out

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse, bwd=_attn_bwd_impl)


# ----------------------------------------------------------------------------------------------
# Reference and public API
# ----------------------------------------------------------------------------------------------
def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None = None,
              starts: torch.Tensor | None = None) -> torch.Tensor:
    """The same math in PyTorch, LitGPT's order (scale, softcap, causal mask, fp32 softmax, ``@ v``); keeps
    ``(B, nh, T, T)`` scores. The CPU path and the tests' reference. ``starts``: query ``i`` sees keys
    ``starts[i] <= j <= i`` (packed samples: a block-diagonal causal mask)."""
    nh, ng, T = q.shape[1], k.shape[1], q.shape[2]
    if ng != nh:
        k = k.repeat_interleave(nh // ng, dim=1)
        v = v.repeat_interleave(nh // ng, dim=1)
    z = (q @ k.transpose(-2, -1)) * scale
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    if starts is not None:
        causal = causal & (torch.arange(T, device=q.device)[None, :] >= starts.to(q.device)[:, None])
    z = z.masked_fill(~causal, float("-inf"))
    return torch.softmax(z, dim=-1, dtype=torch.float32).to(v.dtype) @ v


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, heads, T, head_size), got shape {tuple(t.shape)}")
    check_same_device(q=q, k=k, v=v)
    check_same_dtype(q=q, k=k, v=v)
    B, nh, T, hs = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != T or k.shape[3] != hs or k.shape[1] < 1 \
            or nh % k.shape[1]:
        raise ValueError(f"k and v must be (B, ng, T, hs) with nh % ng == 0 for q {tuple(q.shape)}; got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if not supported_head_size(hs):
        raise ValueError(f"head_size must be a power of two from 16 to 256 for the Triton kernel, got {hs}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be a positive finite number or None, got {softcap!r}")


def supported_head_size(hs: int) -> bool:
    """Head sizes the kernels take (a power of two from 16 to 256)."""
    return 16 <= hs <= 256 and not hs & (hs - 1)


def softcap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      softcap: float | None = None, starts: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ``q (B, nh, T, hs)`` over ``k, v (B, ng, T, hs)`` with LitGPT's scale and optional
    logit softcap. Returns ``(B, nh, T, hs)`` (a transposed view of ``(B, T, nh, hs)`` on the Triton path).

    ``starts`` (packed samples, variable lengths): int32 ``(T,)``, nondecreasing, ``starts[i] <= i``, the first key
    query ``i`` sees (its sample's start, or later under a sliding window): it attends keys ``starts[i] <= j <= i``.
    Whole key blocks before a query block's first start are skipped. Not differentiable (see :func:`sample_starts`)."""
    _check(q, k, v, scale, softcap)
    if starts is not None and (starts.shape != (q.shape[2],) or starts.dtype != torch.int32
                               or starts.device != q.device):
        raise ValueError(f"starts must be int32 ({q.shape[2]},) on {q.device}, got {starts.dtype} "
                         f"{tuple(starts.shape)} on {starts.device}")
    if not use_triton(q):
        return reference(q, k, v, float(scale), softcap, starts)
    cap = float(softcap) if softcap is not None else 0.0
    if torch.compiler.is_compiling():
        return _attn_fwd(q, k, v, float(scale), cap, starts)[0]
    return _AttnFn.apply(q, k, v, float(scale), cap, starts)[0]


def sample_starts(cu_seqlens: torch.Tensor, n: int, window: int | None = None) -> torch.Tensor:
    """:func:`softcap_attention`'s ``starts`` for ``n`` packed positions whose samples end at ``cu_seqlens``
    (``(S + 1,)``, from 0 to ``n``, repeats allowed: empty samples): each position's sample start, and with a
    sliding window ``W`` (LitGPT's: query ``i`` sees ``i - W < j``) at least ``i - W + 1``. Device ops only."""
    cu = cu_seqlens.to(torch.int64)
    i = torch.arange(n, device=cu.device)
    starts = cu[torch.searchsorted(cu, i, right=True) - 1]
    if window is not None:
        starts = torch.maximum(starts, i - (window - 1))
    return starts.to(torch.int32)
