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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import elementwise_plan, fast_launch, use_triton

__all__ = ["dropout_grad_add_", "encode_dropped_", "kept"]

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
