"""``LigerConfig``: one switch per kernel, all on by default."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal


@dataclass
class LigerConfig:
    """Which kernels lit-liger swaps into a LitGPT model.

    Args:
        rms_norm: RMSNorm (with or without Gemma's unit offset) -> Triton RMSNorm.
        layer_norm: LayerNorm (with or without affine parameters) -> Triton LayerNorm.
        rope: q/k rotary embedding in one launch (partial rotary, GQA, interleaved layout).
        swiglu: ``LLaMAMLP`` (and each ``LLaMAMoE`` expert) -> ``silu(fc_1) * fc_2`` kernel.
        geglu: ``GemmaMLP`` -> ``gelu(fc_1) * fc_2`` kernel (tanh or exact GELU per config).
        fused_residual: residual add + norm_2 fused in the Block where the structure allows.
        recompute_norm: in those Blocks, the RMSNorm outputs read by plain Linears (``attn.qkv``;
            ``mlp.fc_1``/``fc_2``) are recomputed in backward instead of kept for their weight
            gradients (two ``(B, T, C)`` activations per layer less; one extra norm pass each).
        fused_linear_cross_entropy: in training, lm_head + cross-entropy without the N x V logits.
        flce_mode: ``"fast"`` (3 GEMMs, fp32 weight-gradient buffer) or ``"lean"`` (least memory).
    """

    rms_norm: bool = True
    layer_norm: bool = True
    rope: bool = True
    swiglu: bool = True
    geglu: bool = True
    fused_residual: bool = True
    recompute_norm: bool = True
    fused_linear_cross_entropy: bool = True
    flce_mode: Literal["fast", "lean"] = "fast"

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "flce_mode":
                if v not in ("fast", "lean"):
                    raise ValueError(f"LigerConfig.flce_mode must be 'fast' or 'lean', got {v!r}")
            elif not isinstance(v, bool):
                raise TypeError(f"LigerConfig.{f.name} must be true or false, got {v!r} ({type(v).__name__})")

    @classmethod
    def off(cls) -> "LigerConfig":
        return cls(**{f.name: False for f in fields(cls) if f.name != "flce_mode"})

    @classmethod
    def from_value(cls, value: Any) -> "LigerConfig":
        """Accepts a LigerConfig, None (defaults), a bool (all on/off) or a mapping of switches."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            return cls() if value else cls.off()
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"unknown lit-liger switch(es) {sorted(unknown)}; known: {sorted(known)}")
            return cls(**value)
        raise TypeError(f"cannot make a LigerConfig from {value!r}")

    @property
    def enabled(self) -> bool:
        return any(v for k, v in asdict(self).items() if k != "flce_mode")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
