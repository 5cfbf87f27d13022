"""bitsandbytes-quantized Linear weights (QLoRA: ``litgpt finetune_lora --quantize bnb.nf4|nf4-dq|fp4|fp4-dq|int8``).

Lightning's ``BitsandbytesPrecision`` replaces each ``nn.Linear`` with a bitsandbytes subclass whose ``weight`` holds
packed 4-bit storage (``Params4bit``, with a ``quant_state``) or int8 rows with per-row scales (``Int8Params``,
``SCB``): its data is not the ``(out, in)`` matrix. The layer's own forward dequantizes it for each matmul (for more
than one row of input), and so does lit-liger where it reads such a weight itself: the fused loss's quantized
``lm_head`` and the LoRA function's quantized base projection. A quantized weight is always frozen.
bitsandbytes is imported only when a quantized weight is met (the optional extra ``lit-liger[qlora]``).
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import _called_plainly


__all__ = ["dequantize", "is_4bit", "is_quantized", "linear_4bit"]


def is_quantized(weight: torch.Tensor) -> bool:
    """A bitsandbytes-quantized weight: 4-bit storage with a ``quant_state``, or int8 rows with ``SCB`` scales."""
    return getattr(weight, "quant_state", None) is not None or (weight.dtype == torch.int8 and hasattr(weight, "SCB"))


def is_4bit(weight: torch.Tensor) -> bool:
    """A bitsandbytes 4-bit weight (``Params4bit`` with its ``quant_state``: nf4 / fp4, with or without double
    quantization of the scales)."""
    return getattr(weight, "quant_state", None) is not None


def dequantize(weight: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The ``(out, in)`` matrix a bitsandbytes layer multiplies by, in ``dtype`` (default: the quantization's own,
    which Lightning's plugin makes float16 for 4-bit; float32 for int8). No autograd graph: it is frozen.

    A 4-bit weight is decoded straight into ``dtype`` by bitsandbytes' own ``dequantize_4bit`` op (its kernels
    write bf16, fp16 or fp32): the layer's own forward decodes into the quantization's dtype and then casts, a
    second pass over the matrix (measured on an H100, QLoRA Llama-3.2-1B: a fifth of the GPU time of a
    step). One rounding of the same value instead of two."""
    import bitsandbytes.functional as bnb_f

    with torch.no_grad():
        if not is_4bit(weight):
            w = bnb_f.int8_vectorwise_dequant(weight.data, weight.SCB)  # (out, in): int8 rows x scale / 127
            return w if dtype is None or w.dtype == dtype else w.to(dtype)
        qs = weight.quant_state
        op = _dequantize_4bit_op()
        if dtype is None or dtype == qs.dtype or op is None:
            w = bnb_f.dequantize_4bit(weight.data, qs)  # (out, in)
            return w if dtype is None or w.dtype == dtype else w.to(dtype)
        absmax = qs.absmax
        if qs.nested:  # double quantization: the blocks' scales are themselves quantized
            absmax = bnb_f.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
            absmax = absmax.float()
        return op(weight.data, absmax, qs.blocksize, qs.quant_type, qs.shape, dtype)  # (out, in)


def _dequantize_4bit_op():
    """``torch.ops.bitsandbytes.dequantize_4bit`` (bitsandbytes >= 0.46), or None."""
    try:
        return torch.ops.bitsandbytes.dequantize_4bit.default
    except (AttributeError, RuntimeError):
        return None


class _Linear4bitFn(torch.autograd.Function):
    """``x Wᵀ + b`` for a frozen 4-bit ``W``: decoded to ``x``'s dtype for the forward's GEMM and again for the
    backward's (never kept), as bitsandbytes' own layer does, without its second (cast) pass."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(weight)  # the packed parameter: no copy
        ctx.has_bias = bias is not None
        return torch.nn.functional.linear(x, dequantize(weight, x.dtype), bias)  # (..., out)

    @staticmethod
    def backward(ctx, dy):
        (weight,) = ctx.saved_tensors
        dx = dy @ dequantize(weight, dy.dtype) if ctx.needs_input_grad[0] else None  # (..., in)
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, None, db


def linear_4bit(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, dequantize(weight), bias)`` for a frozen bitsandbytes 4-bit ``weight`` ``(out, in)``."""
    if not is_4bit(weight):
        raise TypeError("linear_4bit needs a bitsandbytes 4-bit weight (a Params4bit with its quant_state)")
    if weight.requires_grad:
        raise ValueError("a quantized weight is frozen; it cannot require grad")
    if x.shape[-1] != weight.quant_state.shape[1]:
        raise ValueError(f"x's last dimension {x.shape[-1]} must equal in_features {weight.quant_state.shape[1]}")
    return _Linear4bitFn.apply(x, weight, bias)


def _4bit_linear(m: nn.Module, x: torch.Tensor) -> bool:
    """A bitsandbytes 4-bit Linear (QLoRA's frozen base) computing in ``x``'s dtype: the LoRA function dequantizes
    its weight as the layer's own forward does (int8 layers multiply in int8: they keep their own forward)."""
    w = getattr(m, "weight", None)
    return (
        isinstance(m, nn.Linear) and w is not None and is_4bit(w)
        and getattr(m, "compute_dtype", None) in (None, x.dtype) and not w.requires_grad
    )


class _Linear4bitMixin:
    """A bitsandbytes 4-bit Linear (QLoRA's frozen projections without a LoRA update, the lm_head where the loss
    needs logits): :func:`lit_liger.swap.quant.linear_4bit`, the weight decoded straight into the compute dtype (one
    kernel where bitsandbytes' forward decodes to float16 and casts); bitsandbytes' own forward where that does not
    apply (a single row, which bitsandbytes multiplies without decoding; autocast; a hook; a compute dtype other
    than the input's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _4bit_linear(self, x) and x.numel() > x.shape[-1] and not torch.is_autocast_enabled(x.device.type) \
                and _called_plainly(self) and (self.bias is None or self.bias.dtype == x.dtype):
            return linear_4bit(x, self.weight, self.bias)
        return super().forward(x)
