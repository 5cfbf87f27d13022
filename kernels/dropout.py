"""A LoRA branch's dropout kept as one tensor: the dropped input with its mask inside it.

LitGPT's LoRA layer computes ``xd = dropout(x)`` and keeps two ``(N, C)`` tensors for backward: ``xd`` (for
``lora_A``'s gradient) and PyTorch's dropout mask (``bool``, for ``x``'s gradient): 3 bytes per element in 16 bits.
Here the mask rides in ``xd``'s zeros, 2 bytes per element:

* a dropped element is stored as ``-0.0`` (only the sign bit set);
* a kept element is ``x / (1 - p)``, where a kept zero (``x = ±0``) is stored as ``+0.0``.

``x / (1 - p)`` is never ``-0.0`` for a kept non-zero ``x`` (``|x / (1 - p)| >= |x|``), so "kept" is exactly "not the
bit pattern of ``-0.0``". ``xd`` reads as the same numbers as PyTorch's (zeros aside, whose sign no product or sum
that ``lora_A``'s gradient forms depends on), and the mask comes back from its bits.

``encode_dropped_(xd, mask)`` rewrites PyTorch's ``native_dropout`` output in place (the same random draws as
``nn.Dropout``: ``torch.native_dropout`` is what it calls); ``dropout_grad_add_(dx, dxd, xd, scale)`` adds the
dropout's backward ``dxd * kept(xd) * scale`` into ``dx`` in one pass (fp32 math, one rounding): the work of
PyTorch's dropout backward and of the add of the two branches' input gradients.

Where the LoRA branch's input ``x`` is kept anyway (the attention's output, which the attention's backward keeps;
the input that ``fc_1`` and ``fc_2`` share; the GLU product, recomputed from the two inputs that the GLU's backward
keeps), the dropped copy is not kept at all: the mask is kept as bits, 1/8 byte an element (``pack_kept``), and the
backward forms ``dropout(x)`` again from ``x`` (or from the GLU's inputs) and the bits in the same pass that adds the
dropout's backward into ``dx`` (``dropped_from_bits``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import elementwise_plan, fast_launch, use_triton
from .swiglu import ACTIVATIONS, _act_and_grad, glu_reference

__all__ = ["dropout_grad_add_", "dropped_from_bits", "encode_dropped_", "kept", "pack_kept", "unpack_kept"]

#: float dtype -> (integer view, the bit pattern of -0.0 in it)
_BITS = {torch.bfloat16: (torch.int16, -(1 << 15)), torch.float16: (torch.int16, -(1 << 15)),
         torch.float32: (torch.int32, -(1 << 31))}


def _bits(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    if t.dtype not in _BITS:
        raise TypeError(f"lit-liger dropout: {t.dtype} is not one of bfloat16, float16, float32")
    if not t.is_contiguous():
        raise ValueError("lit-liger dropout: the dropped input must be contiguous")
    it, neg0 = _BITS[t.dtype]
    return t.view(it), neg0


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and the tests' second opinion)
# ----------------------------------------------------------------------------------------------
def kept(xd: torch.Tensor) -> torch.Tensor:
    """The dropout mask (``bool``, True where kept) of an encoded ``xd``."""
    bits, neg0 = _bits(xd)
    return bits != neg0


def _encode_reference(xd: torch.Tensor, mask: torch.Tensor) -> None:
    bits, neg0 = _bits(xd)
    bits.masked_fill_(bits == neg0, 0)  # a kept -0.0 (x = -0.0) becomes +0.0
    bits.masked_fill_(~mask, neg0)


def _grad_add_reference(dx: torch.Tensor, dxd: torch.Tensor, xd: torch.Tensor, scale: float) -> None:
    dx.copy_((dx.float() + dxd.float() * kept(xd) * scale).to(dx.dtype))


_SHIFTS = {}


def _shifts(device: torch.device) -> torch.Tensor:
    t = _SHIFTS.get(device)
    if t is None:
        t = _SHIFTS[device] = torch.arange(8, dtype=torch.uint8, device=device)
    return t


def unpack_kept(bits: torch.Tensor, n: int) -> torch.Tensor:
    """The ``bool`` mask (flat, ``n`` elements) of ``bits`` packed by :func:`pack_kept`: element ``i`` is bit
    ``i % 8`` of byte ``i // 8``."""
    if bits.dtype != torch.uint8 or bits.dim() != 1 or bits.numel() != (n + 7) // 8:
        raise ValueError(f"lit-liger dropout: bits {tuple(bits.shape)} {bits.dtype} do not hold {n} mask elements")
    return ((bits.unsqueeze(-1) >> _shifts(bits.device)) & 1).view(-1)[:n].bool()


def _pack_reference(mask: torch.Tensor) -> torch.Tensor:
    m = mask.reshape(-1).to(torch.uint8)
    pad = (-m.numel()) % 8
    if pad:
        m = torch.cat([m, m.new_zeros(pad)])
    return (m.view(-1, 8) << _shifts(m.device)).sum(-1, dtype=torch.int32).to(torch.uint8)


def _dropped_reference(dx, dxd, bits, scale, x, a, b, activation, write_xd):
    src = x if x is not None else a
    keep = unpack_kept(bits, src.numel()).view(src.shape)
    if dx is not None:
        dx.copy_((dx.float() + dxd.float() * keep * scale).to(dx.dtype))
    if not write_xd:
        return None
    g = x if x is not None else glu_reference(a, b, activation)  # the forward's GLU product, rounded as it was
    return (g.float() * keep * scale).to(g.dtype)


# ----------------------------------------------------------------------------------------------
# Triton kernels (flat 1-D launch over contiguous tensors)
# ----------------------------------------------------------------------------------------------
@fast_launch
@triton.jit
def _encode_kernel(XD, M, n, NEG0: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    bits = tl.load(XD + offs, mask=inb, other=0)
    keep = tl.load(M + offs, mask=inb, other=0) != 0
    bits = tl.where(keep, tl.where(bits == NEG0, 0, bits), NEG0)
    tl.store(XD + offs, bits.to(XD.dtype.element_ty), mask=inb)


@fast_launch
@triton.jit
def _grad_add_kernel(DX, DXD, XD, n, scale, NEG0: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    keep = tl.load(XD + offs, mask=inb, other=0) != NEG0
    dx = tl.load(DX + offs, mask=inb, other=0.0).to(tl.float32)
    dxd = tl.load(DXD + offs, mask=inb, other=0.0).to(tl.float32)
    dx += tl.where(keep, dxd * scale, 0.0)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=inb)


@fast_launch
@triton.jit
def _pack_kernel(M, BITS, n, n_bytes, BLOCK: tl.constexpr):
    """BLOCK bytes of bits from one contiguous ``(BLOCK, 8)`` tile of the mask, one coalesced load (the kernel before
    made eight loads strided by 8 bytes, one per bit: this one is 2.5-4.4x faster, ``python -m benchmarks diag
    pack-bits`` in h200-2026-12-03c b1; 0.77 -> 0.26 ms an iteration of gemma2's recipe). Bit ``j`` of byte ``k`` is
    element ``8k + j``; the eight bits are distinct, so their sum is their OR."""
    byte = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    j = tl.arange(0, 8)
    i = byte[:, None] * 8 + j[None, :]
    m = tl.load(M + i, mask=i < n, other=0)
    acc = tl.sum((m != 0).to(tl.int32) << j[None, :].to(tl.int32), axis=1)
    tl.store(BITS + byte, acc.to(tl.uint8), mask=byte < n_bytes)


@fast_launch
@triton.jit
def _dropped_kernel(DX, DXD, BITS, X, A, B, XD, n, scale, HAS_DX: tl.constexpr, WRITE_XD: tl.constexpr,
                    GLU: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    """``dx += dxd * kept * scale`` (HAS_DX) and ``xd = src * kept * scale`` (WRITE_XD), ``kept`` read from the bits;
    ``src``: X, or with GLU ``act(A) * B`` rounded to XD's dtype as the forward's GLU kernel rounds it."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    byte = tl.load(BITS + offs // 8, mask=inb, other=0).to(tl.int32)
    keep = ((byte >> (offs % 8).to(tl.int32)) & 1) != 0
    if HAS_DX:
        dx = tl.load(DX + offs, mask=inb, other=0.0).to(tl.float32)
        dxd = tl.load(DXD + offs, mask=inb, other=0.0).to(tl.float32)
        dx += tl.where(keep, dxd * scale, 0.0)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=inb)
    if WRITE_XD:
        if GLU:
            a = tl.load(A + offs, mask=inb, other=0.0).to(tl.float32)
            b = tl.load(B + offs, mask=inb, other=0.0).to(tl.float32)
            act, _ = _act_and_grad(a, ACTIVATION, False)
            g = (act * b).to(XD.dtype.element_ty).to(tl.float32)
        else:
            g = tl.load(X + offs, mask=inb, other=0.0).to(tl.float32)
        tl.store(XD + offs, tl.where(keep, g * scale, 0.0).to(XD.dtype.element_ty), mask=inb)


def pack_kept(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (``bool``, contiguous: ``native_dropout``'s) as bits, flat ``uint8`` of ``ceil(n / 8)`` bytes (see
    :func:`unpack_kept`)."""
    if mask.dtype != torch.bool or not mask.is_contiguous():
        raise ValueError(f"lit-liger dropout: the mask must be a contiguous bool tensor, got {mask.dtype}")
    n = mask.numel()
    if not use_triton(mask) or n == 0:
        return _pack_reference(mask)
    n_bytes = (n + 7) // 8
    bits = torch.empty(n_bytes, dtype=torch.uint8, device=mask.device)
    plan = elementwise_plan(n_bytes, mask.device)
    _pack_kernel[plan.grid](mask.view(torch.uint8), bits, n, n_bytes, BLOCK=plan.block, num_warps=plan.num_warps)
    return bits


def dropped_from_bits(bits: torch.Tensor, scale: float, x: torch.Tensor | None = None,
                      glu: tuple[torch.Tensor, torch.Tensor, str] | None = None, dx: torch.Tensor | None = None,
                      dxd: torch.Tensor | None = None, write_xd: bool = True) -> torch.Tensor | None:
    """The dropout's backward from its mask's bits, in one pass: ``dx += dxd * kept * scale`` in place (given ``dx``
    and ``dxd``), and, with ``write_xd``, returns ``dropout(src) = src * kept * scale`` where ``src`` is ``x`` or,
    given ``glu = (a, b, activation)``, the GLU product ``act(a) * b`` (:func:`lit_liger.kernels.swiglu.glu_reference`'s
    rounding). Every tensor contiguous and of ``src``'s shape; ``scale`` = 1 / (1 - p)."""
    if (x is None) == (glu is None):
        raise ValueError("lit-liger dropout: give exactly one of x and glu")
    a, b, activation = glu if glu is not None else (None, None, "silu")
    src = x if x is not None else a
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    ts = [t for t in (x, a, b, dx, dxd) if t is not None]
    if any(t.shape != src.shape or not t.is_contiguous() for t in ts) or (dx is None) != (dxd is None):
        raise ValueError("lit-liger dropout: x (or a and b), dx and dxd must be contiguous tensors of one shape")
    _bits(src)  # the dtype check
    if not use_triton(src) or src.numel() == 0:
        return _dropped_reference(dx, dxd, bits, scale, x, a, b, activation, write_xd)
    if bits.numel() != (src.numel() + 7) // 8 or bits.dtype != torch.uint8:
        raise ValueError(f"lit-liger dropout: bits {tuple(bits.shape)} do not hold {src.numel()} mask elements")
    n = src.numel()
    xd = torch.empty_like(src) if write_xd else None
    plan = elementwise_plan(n, src.device)
    _dropped_kernel[plan.grid](dx if dx is not None else src, dxd if dxd is not None else src, bits,
                               x if x is not None else src, a if a is not None else src, b if b is not None else src,
                               xd if xd is not None else src, n, float(scale), HAS_DX=dx is not None,
                               WRITE_XD=write_xd, GLU=glu is not None, ACTIVATION=ACTIVATIONS[activation],
                               BLOCK=plan.block, num_warps=plan.num_warps)
    return xd


def encode_dropped_(xd: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``xd`` (``native_dropout``'s output) rewritten in place to carry ``mask`` (its ``bool`` mask): returns ``xd``."""
    if mask.shape != xd.shape or mask.dtype != torch.bool or mask.device != xd.device:
        raise ValueError(f"lit-liger dropout: mask {tuple(mask.shape)} {mask.dtype} does not match xd "
                         f"{tuple(xd.shape)} on {xd.device}")
    bits, neg0 = _bits(xd)
    if xd.numel() == 0:
        return xd
    if not use_triton(xd):
        _encode_reference(xd, mask)
        return xd
    n = xd.numel()
    plan = elementwise_plan(n, xd.device)
    _encode_kernel[plan.grid](bits, mask.contiguous().view(torch.uint8), n, NEG0=neg0, BLOCK=plan.block,
                              num_warps=plan.num_warps)
    return xd


def dropout_grad_add_(dx: torch.Tensor, dxd: torch.Tensor, xd: torch.Tensor, scale: float) -> torch.Tensor:
    """``dx += dxd * kept(xd) * scale`` in place (``scale`` = 1 / (1 - p)); all three contiguous, one shape."""
    if not (dx.shape == dxd.shape == xd.shape) or not (dx.is_contiguous() and dxd.is_contiguous()):
        raise ValueError("lit-liger dropout: dx, dxd and xd must be contiguous tensors of one shape")
    bits, neg0 = _bits(xd)
    if xd.numel() == 0:
        return dx
    if not use_triton(xd):
        _grad_add_reference(dx, dxd, xd, scale)
        return dx
    n = xd.numel()
    plan = elementwise_plan(n, xd.device)
    _grad_add_kernel[plan.grid](dx, dxd, bits, n, float(scale), NEG0=neg0, BLOCK=plan.block,
                                num_warps=plan.num_warps)
    return dx
