"""LitGPT's MLPs on lit-liger's kernels: the GLU MLPs (SwiGLU: LLaMAMLP; GeGLU: GemmaMLP) and GptNeoxMLP's GELU."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.gelu import gelu, gelu_linear
from ..kernels.swiglu import geglu, glu_linear, glu_mlp, swiglu
from ._common import (_called_plainly, _CHECKPOINTED, _fresh_outputs, _frozen_linear, _in_scope, _MLP_RECOMPUTED,
                      _plain_linear, _stock_under_compile)
from .fp8 import _fp8_fusable, glu_linear_fp8, is_float8_linear


def _mlp_out(mlp: nn.Module, x: torch.Tensor, activation: str) -> torch.Tensor:
    """``mlp.proj(act(fc_1(x)) * fc_2(x))`` (see :func:`_glu_proj`). Inside a checkpointed Block
    (``LigerConfig.activation_checkpointing``) a frozen MLP runs as :func:`glu_mlp`: its ``(B, T, I)``
    tensors exist one chunk of rows at a time, in the Block's recompute and in its backward."""
    if (_in_scope(mlp, _CHECKPOINTED) or _in_scope(mlp, _MLP_RECOMPUTED)) \
            and (weights := _frozen_mlp_weights(mlp, x)) is not None:
        return glu_mlp(x, *weights, activation=activation)
    reuse = _fresh_outputs(mlp.fc_1, mlp.fc_2)
    return _glu_proj(mlp.proj, mlp.fc_1(x), mlp.fc_2(x), activation, reuse)  # fc_1, fc_2: (B, T, I)


def _glu_proj(proj: nn.Module, a: torch.Tensor, b: torch.Tensor, activation: str, reuse: bool) -> torch.Tensor:
    """``proj(act(a) * b)``: with a plain Linear ``proj`` (no LoRA, no autocast) the GLU product is not kept
    for backward (``glu_linear`` recomputes it): one (B, T, I) tensor per layer fewer. ``reuse``: ``a`` and
    ``b`` are fresh tensors that nothing else holds, so the backward writes their gradients over them
    (``reuse_inputs``): two (B, T, I) tensors fewer at the backward's peak."""
    if (
        type(proj) is nn.Linear
        and a.device.type in ("cuda", "cpu")
        and proj.weight.dtype == a.dtype
        and not torch.is_autocast_enabled(a.device.type)
    ):
        return glu_linear(a, b, proj.weight, proj.bias, activation, reuse_inputs=reuse)  # (B, T, C)
    if is_float8_linear(proj) and _fp8_fusable(a, proj):  # LigerConfig.fp8: the same, the GEMMs torchao's float8
        return glu_linear_fp8(a, b, proj, activation)
    if activation == "silu":
        glu = swiglu(a, b, reuse_inputs=reuse)
    else:
        glu = geglu(a, b, "tanh" if activation == "gelu_tanh" else "none", reuse_inputs=reuse)
    return proj(glu)  # (B, T, I) -> (B, T, C)


def _frozen_mlp_weights(mlp: nn.Module, x: torch.Tensor) -> tuple | None:
    """``(w1, b1, w2, b2, w3, b3)`` where the MLP's three projections are frozen plain Linears (r = 0 LoRA
    included) of ``x``'s dtype and device, called without hooks, in eager mode without autocast; else None."""
    if torch.compiler.is_compiling() or torch.is_autocast_enabled(x.device.type):
        return None
    mods = (mlp.fc_1, mlp.fc_2, mlp.proj)
    parts = [_frozen_linear(m) for m in mods]
    if any(p is None for p in parts):
        return None
    if any(w.dtype != x.dtype or w.device != x.device for w, _ in parts):
        return None
    inner = [m.linear for m in mods if type(m) is not nn.Linear]
    if not _called_plainly(*mods, *inner):
        return None
    return tuple(t for wb in parts for t in wb)


class _SwiGLUMixin:
    _liger_activation = "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return _mlp_out(self, x, "silu")


class _GeGLUMixin:
    @property
    def _liger_activation(self) -> str:
        return "gelu_tanh" if self.config.gelu_approximate == "tanh" else "gelu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return _mlp_out(self, x, self._liger_activation)


class _GeluMLPMixin:
    """LitGPT's ``GptNeoxMLP``, ``proj(gelu(fc(x)))`` (Pythia, Falcon, phi, StableLM-alpha, RedPajama-INCITE): the GELU
    (``gelu_approximate``) on lit-liger's kernel, fp32 math, only its input kept for backward. With a plain Linear
    ``proj`` (no LoRA, float8 or hooks, no autocast) the GELU and ``proj`` run as :func:`gelu_linear`, which keeps
    ``fc``'s output but not the GELU's for backward: one ``(B, T, I)`` tensor per layer fewer (a plain ``proj``
    keeps its input for its weight gradient). ``fc`` and ``proj`` are called as modules otherwise (LitGPT's LoRA
    layers, swapped or not)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        approximate = self.config.gelu_approximate
        h = self.fc(x)  # (B, T, I)
        proj = self.proj
        if (
            _plain_linear(proj) and _called_plainly(proj) and h.device.type in ("cuda", "cpu")
            and proj.weight.dtype == h.dtype and not torch.is_autocast_enabled(h.device.type)
        ):
            return gelu_linear(h, proj.weight, proj.bias, approximate)  # (B, T, C)
        return proj(gelu(h, approximate))  # (B, T, I) -> (B, T, C)
