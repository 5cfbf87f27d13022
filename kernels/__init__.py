"""Triton kernels of lit-liger (installed as ``lit_liger.kernels``). Imports torch and triton only."""

from ._launch import device_limits, use_triton
from .rms_norm import rms_norm, rms_norm_residual

__all__ = ["device_limits", "use_triton", "rms_norm", "rms_norm_residual"]
