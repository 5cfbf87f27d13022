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

__all__ = ["dequantize", "is_quantized"]


def is_quantized(weight: torch.Tensor) -> bool:
    """A bitsandbytes-quantized weight: 4-bit storage with a ``quant_state``, or int8 rows with ``SCB`` scales."""
    return getattr(weight, "quant_state", None) is not None or (weight.dtype == torch.int8 and hasattr(weight, "SCB"))


def dequantize(weight: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The ``(out, in)`` matrix a bitsandbytes layer multiplies by, in ``dtype`` (default: the quantization's own,
    which Lightning's plugin makes float16 for 4-bit; float32 for int8). No autograd graph: it is frozen."""
    import bitsandbytes.functional as bnb_f

    with torch.no_grad():
        if getattr(weight, "quant_state", None) is not None:
            w = bnb_f.dequantize_4bit(weight.data, weight.quant_state)  # (out, in)
        else:
            w = bnb_f.int8_vectorwise_dequant(weight.data, weight.SCB)  # (out, in): int8 rows x scale / 127
        return w if dtype is None or w.dtype == dtype else w.to(dtype)
