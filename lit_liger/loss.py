"""The fused-loss seam between a swapped LitGPT model and its loss.

In training (grad enabled, no KV-cache ``input_pos``) a swapped ``GPT`` returns a
:class:`LigerLogits` instead of the ``(B, T, V)`` logits: the final hidden states plus a handle on
the ``lm_head``. :func:`chunked_cross_entropy` (a drop-in for LitGPT's function of the same name)
turns it into the loss with the fused linear cross-entropy kernel, so the N x V logits never exist.

A ``LigerLogits`` is deliberately *not* a tensor: code that expected logits (``.softmax()``,
``torch.cat``, arithmetic, LitGPT's own ``chunked_cross_entropy``) gets a clear ``TypeError``
instead of a silently wrong number. The only tensor-like operation it allows is indexing the
(B, T) dimensions with the vocabulary dimension left whole (``out[..., :-1, :]``, the shift every
LitGPT training script does), which is applied to the hidden states.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

__all__ = ["GatheredHead", "LigerLogits", "chunked_cross_entropy", "lm_head_weight_bias"]

_HELP = (
    "In training, a model swapped by lit-liger returns a LigerLogits (deferred logits: final hidden "
    "states + lm_head) instead of the (B, T, vocab) logits, so that the loss can run as a fused linear "
    "cross-entropy. Compute the loss with `lit_liger.chunked_cross_entropy(output, targets)` (or "
    "`output.loss(targets)`); call `output.materialize()` if you really need the logits; or turn the "
    "fused loss off with `LigerConfig(fused_linear_cross_entropy=False)` / `--liger.fused_linear_cross_entropy false`."
)


def _unwrap_linear(lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(weight, bias, per-output scale) of LitGPT's lm_head variants, or raise if not expressible."""
    if isinstance(lm_head, nn.Linear):
        return lm_head.weight, lm_head.bias, None
    inner = getattr(lm_head, "linear", None)
    if isinstance(inner, nn.Linear):
        if hasattr(lm_head, "lora_A") or hasattr(lm_head, "r"):
            if getattr(lm_head, "r", 0) and getattr(lm_head, "r", 0) > 0:
                raise NotImplementedError("lm_head carries a LoRA update (lora_head=True)")
            return inner.weight, inner.bias, None
        if hasattr(lm_head, "adapter_scale") and hasattr(lm_head, "adapter_bias"):
            # AdapterV2Linear: scale * (x W^T + b + adapter_bias)
            bias = lm_head.adapter_bias if inner.bias is None else inner.bias + lm_head.adapter_bias
            return inner.weight, bias, lm_head.adapter_scale
    raise NotImplementedError(f"lm_head of type {type(lm_head).__name__} is not a Linear layer lit-liger knows")


def lm_head_weight_bias(lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The local, gathered (V, H) weight and (V,) bias the kernel reads.

    FSDP2 (DTensor) parameters are all-gathered with autograd (their gradient is reduce-scattered
    back); a sharded flat parameter (FSDP1 outside its forward) or an empty ZeRO-3 partition never
    reaches the kernel: it raises.
    """
    weight, bias, scale = _unwrap_linear(lm_head)
    weight, bias = _local(weight, "weight"), (_local(bias, "bias") if bias is not None else None)
    if scale is not None:
        scale = _local(scale, "adapter_scale")
        weight = weight * scale.view(-1, 1).to(weight.dtype)  # (V, H)
        bias = bias * scale if bias is not None else None
    out_features = getattr(getattr(lm_head, "linear", lm_head), "out_features", None)
    in_features = getattr(getattr(lm_head, "linear", lm_head), "in_features", None)
    if weight.dim() != 2 or (out_features is not None and tuple(weight.shape) != (out_features, in_features)):
        raise RuntimeError(
            f"lm_head weight has shape {tuple(weight.shape)} but the layer is ({out_features}, {in_features}): "
            "the parameter is sharded (FSDP flat parameter / ZeRO-3 partition) at loss time. lit-liger's fused "
            "loss must read the gathered weight; see the multi-GPU section of the README."
        )
    return weight, bias


def _local(t: torch.Tensor, name: str) -> torch.Tensor:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        DTensor = ()  # type: ignore[assignment]
    if DTensor and isinstance(t, DTensor):
        return t.full_tensor()
    return t


class GatheredHead:
    """The lm_head weight (V, H) and bias (V,) copied, with autograd, while a sharding strategy had
    them gathered. A plain holder on purpose: output mappers (Fabric's precision ``convert_output``,
    FSDP's hook registration) must not copy or cast a (V, H) tensor."""

    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias


class LigerLogitsError(TypeError, AttributeError):
    """Raised when a LigerLogits is used as if it were a logits tensor."""


@dataclasses.dataclass(eq=False, repr=False)
class LigerLogits:
    """Deferred logits: ``hidden`` ``(B, T, H)`` and the ``lm_head`` that would map it to ``(B, T, V)``.

    A dataclass so that wrappers which walk a module's outputs for tensors find ``hidden``: FSDP1
    and FSDP2 register their root pre-backward hook on it (without one, FSDP1's backward fails its
    state check). Wrappers may also *cast* it: Fabric's ``bf16-true`` precision converts floating
    outputs to float32 after the forward. ``dtype`` records the compute dtype, and the loss casts
    ``hidden`` back to it (bf16 -> fp32 -> bf16 is exact, so the loss is unchanged).
    """

    hidden: torch.Tensor
    lm_head: nn.Module
    softcap: float | None
    vocab_size: int
    mode: str = "fast"  # fused linear cross-entropy operating point: "fast" or "lean"
    head: GatheredHead | None = None  # gathered in a sharded forward, else None
    dtype: torch.dtype | None = None  # dtype the model computed hidden in (None: hidden's own)
    # Sequence bucketing (LigerConfig.seq_buckets): ``hidden`` is (B, T_bucket, H) and the logits that the
    # caller sees are rows [t0, t1) of its T dim; None: the whole of hidden (no padding).
    t0: int = 0
    t1: int | None = None
    # Cap on the fused loss's logits chunk (LigerConfig.activation_checkpointing: the bytes of the Blocks' kept
    # inputs, so that the loss's buffer does not set the step's peak); None: the kernel's default.
    max_chunk_bytes: int | None = None

    # --- the one tensor-like operation allowed: index the leading (B, T) dims --------------------------
    @property
    def shape(self) -> torch.Size:
        lead = tuple(self.hidden.shape[:-1])
        if self.t1 is not None:
            lead = (*lead[:-1], self.t1 - self.t0)
        return torch.Size((*lead, self.vocab_size))

    def dim(self) -> int:
        return self.hidden.dim()

    def __getitem__(self, index: Any) -> LigerLogits:
        idx = index if isinstance(index, tuple) else (index,)
        nd = self.hidden.dim()  # logits have the same number of dims as hidden
        if sum(i is Ellipsis for i in idx) > 1:
            raise IndexError("an index can only have a single ellipsis")
        if Ellipsis in idx:
            pos = idx.index(Ellipsis)
            fill = nd - (len(idx) - 1)
            idx = idx[:pos] + (slice(None),) * fill + idx[pos + 1 :]
        if len(idx) != nd or not _is_full_slice(idx[-1]):
            raise TypeError(
                f"LigerLogits only supports indexing the leading dims with the vocabulary dim whole "
                f"(e.g. out[..., :-1, :]); got {index!r}. " + _HELP
            )
        if self.t1 is None:
            return dataclasses.replace(self, hidden=self.hidden[idx[:-1]])
        t_index = idx[-2]
        if all(_is_full_slice(i) for i in idx[:-2]) and isinstance(t_index, slice) and t_index.step in (None, 1):
            # a slice of the sequence (the training scripts' shift): move the window, keep the padded rows
            start, stop, _ = t_index.indices(self.t1 - self.t0)
            return dataclasses.replace(self, t0=self.t0 + start, t1=self.t0 + max(start, stop))
        return self.unpadded()[index]

    def unpadded(self) -> LigerLogits:
        """The same logits without the bucket's padding rows (``hidden`` sliced to the window)."""
        if self.t1 is None:
            return self
        return dataclasses.replace(self, hidden=self.hidden[..., self.t0 : self.t1, :], t0=0, t1=None)

    # --- the loss ----------------------------------------------------------------------------------
    def loss(
        self,
        targets: torch.Tensor,
        ignore_index: int = -100,
        reduction: str = "mean",
        num_valid_targets: torch.Tensor | int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if tuple(targets.shape) != tuple(self.shape[:-1]):
            raise ValueError(
                f"targets shape {tuple(targets.shape)} does not match the model output's leading dims "
                f"{tuple(self.shape[:-1])} (did you shift one and not the other?)"
            )
        window = None
        if self.t1 is not None and (self.t0, self.t1) != (0, self.hidden.shape[-2]):
            # padded rows (the bucket's tail, the shifted-out first/last rows) get ignore_index: the mean is
            # over the same valid targets as the unpadded batch's, and their rows get zero gradient
            window = (self.t0, self.t1)
            padded = targets.new_full(self.hidden.shape[:-1], ignore_index)  # (B, T_bucket)
            padded[..., self.t0 : self.t1] = targets
            targets = padded
        from .kernels.fused_linear_cross_entropy import fused_linear_cross_entropy

        if self.head is not None:
            weight, bias = self.head.weight, self.head.bias
        else:
            weight, bias = lm_head_weight_bias(self.lm_head)
        hidden = self.hidden
        if self.dtype is not None and hidden.dtype != self.dtype:
            hidden = hidden.to(self.dtype)  # undo a wrapper's output cast (see the class docstring)
        loss = fused_linear_cross_entropy(
            hidden, weight, targets, bias,
            ignore_index=ignore_index, reduction=reduction, softcap=self.softcap,
            num_valid_targets=num_valid_targets,
            **{"mode": self.mode, "max_chunk_bytes": self.max_chunk_bytes, **kwargs},
        )
        if window is not None and reduction == "none":
            loss = loss.view(targets.shape)[..., window[0] : window[1]]  # per-token losses of the window only
        return loss

    def materialize(self) -> torch.Tensor:
        """The real ``(..., V)`` logits (allocates them: only for code that truly needs logits)."""
        hidden = self.unpadded().hidden
        hidden = hidden if self.dtype is None else hidden.to(self.dtype)
        logits = self.lm_head(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    # --- everything else fails loudly ---------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise LigerLogitsError(f"LigerLogits has no tensor attribute/method {name!r}. " + _HELP)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise LigerLogitsError(f"torch function {getattr(func, '__name__', func)} got a LigerLogits. " + _HELP)

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise LigerLogitsError("arithmetic/conversion on LigerLogits. " + _HELP)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _fail
    __matmul__ = __rmatmul__ = __pow__ = __neg__ = __float__ = __int__ = __bool__ = __len__ = __iter__ = _fail
    __array__ = _fail

    def __repr__(self) -> str:
        return f"LigerLogits(shape={tuple(self.shape)}, dtype={self.hidden.dtype}, device={self.hidden.device})"


def _is_full_slice(i: Any) -> bool:
    return isinstance(i, slice) and i.start is None and i.stop is None and i.step is None


def chunked_cross_entropy(
    model_output: torch.Tensor | LigerLogits | list,
    targets: torch.Tensor,
    chunk_size: int = 128,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Drop-in for ``litgpt.utils.chunked_cross_entropy``.

    Takes what a swapped model returns in training (a :class:`LigerLogits`, or a list of them when
    ``lm_head_chunk_size > 0`` was passed) and computes the fused linear cross-entropy; real logits
    (or lists of logit chunks) go to LitGPT's own function unchanged.
    """
    if isinstance(model_output, list) and model_output and isinstance(model_output[0], LigerLogits):
        if len(model_output) != 1:
            raise ValueError("expected a one-element list of LigerLogits (the whole sequence)")
        model_output = model_output[0]
    if isinstance(model_output, LigerLogits):
        return model_output.loss(targets, ignore_index=ignore_index)
    from litgpt.utils import chunked_cross_entropy as litgpt_chunked_cross_entropy

    return litgpt_chunked_cross_entropy(model_output, targets, chunk_size=chunk_size, ignore_index=ignore_index)
