"""Triton kernels of lit-liger (installed as ``lit_liger.kernels``). Imports torch and triton only.

Each op lives in one file: Triton forward/backward kernels, a ``torch.library`` custom op with a
fake (meta) implementation and registered autograd, the reference PyTorch math used on CPU, and
the functional API below. Launch parameters come from ``_launch.py``.
"""

if __name__ != "lit_liger.kernels":
    # This folder is importable as a top-level ``kernels`` wherever the repository root is on ``sys.path`` (pytest's
    # ``pythonpath``, ``python -m`` from a checkout). Imported under that name it would define every ``lit_liger::``
    # op a second time, and other packages import ``kernels`` meaning Hugging Face's (bitsandbytes' CPU backend
    # does, in a try/except): refuse, so that they fall back and lit-liger's ops exist once.
    raise ImportError(f"lit-liger's kernels are the package `lit_liger.kernels`, not {__name__!r}")

from ._launch import device_limits, use_triton
from .layer_norm import layer_norm, layer_norm_dual, layer_norm_residual
from .rms_norm import rms_norm, rms_norm_linear, rms_norm_residual
from .rope import rope, rope_qkv
from .fused_linear_cross_entropy import fused_linear_cross_entropy
from .swiglu import geglu, glu_linear, glu_mlp, swiglu
from .gelu import gelu, gelu_linear
from .attention import softcap_attention
from .embedding import embedding

__all__ = [
    "device_limits",
    "use_triton",
    "rms_norm",
    "rms_norm_residual",
    "rms_norm_linear",
    "layer_norm",
    "layer_norm_residual",
    "layer_norm_dual",
    "rope",
    "rope_qkv",
    "swiglu",
    "geglu",
    "glu_linear",
    "glu_mlp",
    "gelu",
    "gelu_linear",
    "fused_linear_cross_entropy",
    "softcap_attention",
    "embedding",
]
