"""LitGPT's RMSNorm and LayerNorm on lit-liger's kernels (``LigerConfig.rms_norm``, ``layer_norm``)."""

from __future__ import annotations

import torch

from ..kernels.layer_norm import layer_norm
from ..kernels.rms_norm import rms_norm
from ._common import _stock_under_compile


class _RMSNormMixin:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps, 1.0 if self.add_unit_offset else 0.0)


class _LayerNormMixin:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return layer_norm(x, self.weight, self.bias, self.eps)
