"""The fused-loss seam between a swapped LitGPT model and its loss.

In training (grad enabled, no KV-cache ``input_pos``) a swapped ``GPT`` returns a
:class:`LigerLogits` instead of the ``(B, T, V)`` logits: the final hidden states plus a handle on
the ``lm_head``. :func:`chunked_cross_entropy` (a drop-in for LitGPT's function of the same name)
turns it into the loss with the fused linear cross-entropy kernel, so the N x V logits never exist.

Code written for stock LitGPT keeps working on it unchanged: the loss patterns (LitGPT's own
``chunked_cross_entropy``, ``F.cross_entropy`` on the reshaped/sliced/cast output) run the fused
loss; anything that truly needs logits (a metric's ``argmax``, arithmetic) gets the real logits,
computed once with one warning, and the same numbers as stock (see :class:`LigerLogits`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .quant import dequantize, is_4bit, is_quantized

__all__ = ["GatheredHead", "LigerLogits", "chunked_cross_entropy", "head_lora_input", "lm_head_lora",
           "lm_head_weight_bias"]


def _linear_weight(linear: nn.Linear) -> torch.Tensor:
    if is_quantized(linear.weight) and not is_4bit(linear.weight):
        raise NotImplementedError(
            "lm_head is a bitsandbytes int8 layer: its own forward multiplies in int8 (activations quantized too), "
            "which a decoded weight would not reproduce; the model returns its logits for LitGPT's loss"
        )
    return dequantize(linear.weight) if is_quantized(linear.weight) else linear.weight


def _unwrap_linear(lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(weight, bias, per-output scale) of LitGPT's lm_head variants, or raise if not expressible. A quantized
    (bitsandbytes) head gives its dequantized weight; a LoRA head (``LoRALinear``) its base Linear's, the update
    coming from :func:`lm_head_lora`."""
    if isinstance(lm_head, nn.Linear):
        return _linear_weight(lm_head), lm_head.bias, None
    inner = getattr(lm_head, "linear", None)
    if isinstance(inner, nn.Linear):
        if hasattr(lm_head, "lora_A") or hasattr(lm_head, "r"):
            if _has_lora_update(lm_head) and not all(
                    isinstance(getattr(lm_head, n, None), torch.Tensor) for n in ("lora_A", "lora_B")):
                raise NotImplementedError("lm_head's LoRA update has no lora_A / lora_B matrices")
            return _linear_weight(inner), inner.bias, None
        if hasattr(lm_head, "adapter_scale") and hasattr(lm_head, "adapter_bias"):
            # AdapterV2Linear: scale * (x W^T + b + adapter_bias)
            bias = lm_head.adapter_bias if inner.bias is None else inner.bias + lm_head.adapter_bias
            return _linear_weight(inner), bias, lm_head.adapter_scale
    raise NotImplementedError(f"lm_head of type {type(lm_head).__name__} is not a Linear layer lit-liger knows")


def _has_lora_update(lm_head: nn.Module) -> bool:
    """LitGPT's ``LoRALinear`` with an unmerged update (r > 0): its forward adds ``lora_dropout(x) A^T B^T s``."""
    r = getattr(lm_head, "r", 0)
    return isinstance(r, int) and r > 0 and not getattr(lm_head, "merged", False)


def lm_head_lora(lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """``(A (r, H), B (V, r), scaling)`` of a LoRA lm_head (``lora_head: true``), gathered where FSDP2 holds DTensors;
    None for a head without an unmerged LoRA update."""
    if not _has_lora_update(lm_head):
        return None
    return _local(lm_head.lora_A, "lora_A"), _local(lm_head.lora_B, "lora_B"), float(lm_head.scaling)


def head_lora_input(lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor | None:
    """The LoRA branch's input of a LoRA lm_head for the final hidden states ``hidden``: LitGPT's own
    ``lora_dropout(hidden)`` where it does something (an active ``nn.Dropout``), else None (the branch reads
    ``hidden`` itself). Called in the model's forward, where stock LitGPT's head draws its dropout mask."""
    if not _has_lora_update(lm_head):
        return None
    drop = getattr(lm_head, "lora_dropout", None)
    if isinstance(drop, nn.Dropout):
        return drop(hidden) if drop.training and drop.p > 0 else None  # (B, T, H)
    if drop is None:
        return None
    out = drop(hidden)  # (LitGPT's identity lambda when lora_dropout == 0, or another module)
    return None if out is hidden else out


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
    them gathered (and a LoRA head's ``lora``: ``(A (r, H), B (V, r), scaling)``). A plain holder on purpose: output
    mappers (Fabric's precision ``convert_output``, FSDP's hook registration) must not copy or cast a (V, H) tensor."""

    __slots__ = ("bias", "lora", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 lora: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> None:
        self.weight, self.bias, self.lora = weight, bias, lora


class LigerLogitsError(TypeError, AttributeError):
    """Raised for what a LigerLogits cannot answer (an attribute that torch.Tensor does not have either)."""


def _first_warning(key: str, *found: Any) -> bool:
    """Whether to warn now: the first time for the model whose output is among ``found`` (its ``ModelState``; an
    output made outside a swapped model warns each time), never inside a trace."""
    if torch.compiler.is_compiling():
        return False
    for obj in found:
        if isinstance(obj, _PendingLoss):
            obj = obj.logits
        if isinstance(obj, LigerLogits):
            return obj.state is None or obj.state.warn_once(key)
    return True


def _warn_unpacked(logits: LigerLogits) -> None:
    """One warning per model: a packed output whose left-out positions have targets."""
    if not _first_warning("unpacked loss", logits):
        return
    warnings.warn(
        "lit-liger packing: a sample's trailing token id 0 (the collate's padding id) has a target, so the packed "
        "forward, which leaves trailing zeros out, cannot give this loss; lit-liger computed it from a forward of "
        "the padded batch instead (the same numbers as stock LitGPT, a second forward's time). "
        "Turn packing off (LigerConfig(packing=False), --liger.packing false) for such data. Shown once.",
        stacklevel=4,
    )


def _warn_materialize(what: str, *found: Any) -> None:
    """One warning per model: the first use of its training output (among ``found``) that needs the real logits."""
    if not _first_warning("materialize", *found):
        return
    warnings.warn(
        f"lit-liger: {what} on a swapped model's training output needs the real (..., vocab) logits, so lit-liger "
        "computed them (once per output, the same numbers as stock LitGPT; the memory the fused loss saves is spent "
        "on them). The loss itself needs no logits: `lit_liger.chunked_cross_entropy(output, targets)`, "
        "`litgpt.utils.chunked_cross_entropy` and `F.cross_entropy(output.reshape(-1, vocab), targets.reshape(-1))` "
        "run the fused linear cross-entropy. This warning is shown once.",
        stacklevel=4,
    )


def _to_real(obj: Any) -> Any:
    """``obj`` with every LigerLogits / pending loss in it (lists, tuples, dicts) replaced by its real tensor."""
    if isinstance(obj, LigerLogits):
        return obj.real()
    if isinstance(obj, _PendingLoss):
        return obj.resolve()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_real(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_real(v) for k, v in obj.items()}
    return obj


def _torch_function(func: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
    """``__torch_function__`` of LigerLogits and _PendingLoss: the loss patterns stay fused, the rest gets the
    real tensors (and gives exactly what it gives on stock LitGPT's logits)."""
    kwargs = kwargs or {}
    first = args[0] if args else None
    if func is F.cross_entropy:
        return _cross_entropy(*args, **kwargs)
    if isinstance(first, LigerLogits):
        if func is torch.functional.split or func is torch.split:
            return first.split(*args[1:], **kwargs)
        if func is torch.reshape:
            return first.reshape(*args[1:], **kwargs)
        if func is torch.flatten:
            return first.flatten(*args[1:], **kwargs)
    if func is torch.cat and isinstance(first, (list, tuple)) and first:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
        if len(first) == 1 and isinstance(first[0], (LigerLogits, _PendingLoss)):
            return first[0]  # litgpt's list path: torch.cat([one output], dim=1) is the output itself
        if all(isinstance(p, _PendingLoss) for p in first):
            whole = _PendingLoss.join(first, dim)
            if whole is not None:
                return whole
    if any(isinstance(a, LigerLogits) for a in _flat(args, kwargs)):
        _warn_materialize(f"torch.{getattr(func, '__name__', func)}", *_flat(args, kwargs))
    return func(*_to_real(args), **_to_real(kwargs))


def _flat(args: tuple, kwargs: dict) -> list:
    out: list = []
    for a in (*args, *kwargs.values()):
        out.extend(a if isinstance(a, (list, tuple)) else (a,))
    return out


@dataclasses.dataclass(eq=False, repr=False)
class LigerLogits:
    """Deferred logits: ``hidden`` ``(B, T, H)`` and the ``lm_head`` that would map it to ``(B, T, V)``.

    It stands in for the logits tensor wherever LitGPT's logits were used:

    * the loss patterns run the fused linear cross-entropy (the logits never exist):
      ``lit_liger.chunked_cross_entropy``, ``litgpt.utils.chunked_cross_entropy`` (any ``chunk_size``), and
      ``F.cross_entropy`` on the output reshaped/viewed/flattened to ``(N, V)``, sliced on its leading dims
      (``out[..., :-1, :]``), cast (``.float()``), or split into row chunks whose per-token losses are
      concatenated again;
    * anything else (``argmax``/``softmax`` for a metric, arithmetic, ``torch.cat``...) computes the real
      logits once per output (cached, one warning per process), applies what was done to the output so far,
      and gives the same numbers as stock LitGPT, gradients included.

    A dataclass so that wrappers which walk a module's outputs for tensors find ``hidden``: FSDP1
    and FSDP2 register their root pre-backward hook on it (without one, FSDP1's backward fails its
    state check). Wrappers may also *cast* it: Fabric's ``bf16-true`` precision converts floating
    outputs to float32 after the forward (``apply_to_collection``: each field of a copy of the output set to
    its cast). Such a cast of ``hidden`` or ``x_lora`` (a tensor of ``compute_dtype``, the dtype the model
    computed in, replaced by one of another floating dtype and the same shape) keeps the model's tensor and
    becomes the output's ``dtype`` instead (:meth:`__setattr__`): the caller sees float32 logits, as a cast of
    real logits would give, and no float32 copy of the hidden states lives until the step ends (8 GiB at 512k
    tokens of width 4096). A ``hidden`` of another dtype set some other way is cast back to ``compute_dtype`` by
    the loss (bf16 -> fp32 -> bf16 is exact, so the loss is unchanged).
    """

    hidden: torch.Tensor
    lm_head: nn.Module
    softcap: float | None
    vocab_size: int
    flce_mode: str = "fast"  # fused linear cross-entropy operating point: "fast" or "lean"
    head: GatheredHead | None = None  # gathered in a sharded forward, else None
    compute_dtype: torch.dtype | None = None  # dtype the model computed hidden in (None: hidden's own)
    # Sequence bucketing (LigerConfig.seq_buckets): ``hidden`` is (B, T_bucket, H) and the logits that the
    # caller sees are rows [t0, t1) of its T dim; None: the whole of hidden (no padding).
    t0: int = 0
    t1: int | None = None
    # Cap on the fused loss's logits chunk (LigerConfig.activation_checkpointing: the bytes of the Blocks' kept
    # inputs, so that the loss's buffer does not set the step's peak); None: the kernel's default.
    max_chunk_bytes: int | None = None
    out_dtype: torch.dtype | None = None  # a cast asked for (``.float()``, ``.to(dtype)``); None: hidden's dtype
    # Packing (LigerConfig.packing): ``hidden`` is (N, H), the batch's rows laid end to end, and ``rows`` has the
    # logits' leading dims, each entry the row of ``hidden`` that position's logits come from, or -1 for a right
    # padding position the packed forward left out. ``unpacked``: makes the output's unpacked twin (a forward of
    # the padded batch, LitGPT's computation) for what needs logits at those positions. None: not packed.
    rows: torch.Tensor | None = None
    unpacked: Any = None
    # what the data loader found on the host about the left-out positions' targets (``lit_liger.swap.packing.LeftOut``):
    # where it answers, the loss needs no host sync to check them
    left_out: Any = None
    # A LoRA lm_head with active dropout: the LoRA branch's input, ``lora_dropout(hidden)`` drawn in the forward as
    # stock LitGPT draws it (same shape as ``hidden``, and every view of ``hidden`` applies to it too). None: the
    # branch reads ``hidden`` (no dropout, or no LoRA head).
    x_lora: torch.Tensor | None = None
    # the swapped GPT's ``lit_liger.swap.state.ModelState`` (its warnings and counters); None: made elsewhere
    state: Any = None

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if name in ("hidden", "x_lora") and isinstance(value, torch.Tensor):
            kept = d.get(name)
            if (isinstance(kept, torch.Tensor) and kept is not value and kept.dtype == self.compute_dtype
                    and value.dtype != kept.dtype and value.is_floating_point() and value.shape == kept.shape
                    and value.device == kept.device):
                # a wrapper's cast of the output (see the class docstring): the model's tensor stays, the cast
                # becomes the output's dtype
                if name == "hidden" and self.out_dtype is None:
                    d["_wrapper_cast"] = d["out_dtype"] = value.dtype
                return
        elif name == "out_dtype" and value is None and d.get("_wrapper_cast") is not None:
            value = d["_wrapper_cast"]  # (the wrapper sets every field of its copy, this one to the output's own None)
        object.__setattr__(self, name, value)

    def __post_init__(self) -> None:
        # Plain attributes, not fields (wrappers rebuild the dataclass from its fields with ``dataclasses.replace``,
        # FSDP1's output walk among them; a rebuilt output is a new root): the output the model returned, which
        # caches the real logits; the view/cast ops applied since, replayed on them; for a part of ``split``, (the
        # split output, index, number of parts, dim).
        self.root: LigerLogits | None = None
        self.ops: tuple = ()
        self.part_of: tuple | None = None

    # --- metadata (no logits needed) --------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        if self.rows is not None:
            return torch.Size((*self.rows.shape, self.vocab_size))
        lead = tuple(self.hidden.shape[:-1])
        if self.t1 is not None:
            lead = (*lead[:-1], self.t1 - self.t0)
        return torch.Size((*lead, self.vocab_size))

    @property
    def dtype(self) -> torch.dtype:
        return self.out_dtype or self.hidden.dtype

    @property
    def device(self) -> torch.device:
        return self.hidden.device

    @property
    def requires_grad(self) -> bool:
        return self.hidden.requires_grad

    @property
    def is_cuda(self) -> bool:
        return self.hidden.is_cuda

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def is_floating_point(self) -> bool:
        return True

    def __len__(self) -> int:
        return self.shape[0]

    # --- deferred views and casts -------------------------------------------------------------------------
    def _derive(self, op: tuple, **changes: Any) -> LigerLogits:
        out = dataclasses.replace(self, **changes)
        out.root = self.root if self.root is not None else self
        out.ops = (*self.ops, op)
        return out

    def __getitem__(self, index: Any) -> LigerLogits | torch.Tensor:
        idx = index if isinstance(index, tuple) else (index,)
        nd = self.ndim
        if sum(i is Ellipsis for i in idx) <= 1 and Ellipsis in idx:
            pos = idx.index(Ellipsis)
            idx = idx[:pos] + (slice(None),) * (nd - (len(idx) - 1)) + idx[pos + 1 :]
        elif Ellipsis not in idx and len(idx) < nd:
            idx = idx + (slice(None),) * (nd - len(idx))  # out[:, :-1]: the dims not named are whole
        if len(idx) != nd or not _is_full_slice(idx[-1]) or any(i is None or i is Ellipsis for i in idx):
            _warn_materialize(f"indexing the vocabulary dimension ({index!r})", self)
            return self.real()[index]
        op = ("index", index)
        if self.rows is not None:
            if all(isinstance(i, (int, slice)) for i in idx[:-1]):  # basic indexing: each row stays at most once
                return self._derive(op, rows=self.rows[idx[:-1]])
            _warn_materialize(f"indexing with tensors ({index!r})", self)
            return self.real()[index]
        if self.t1 is None:
            return self._derive(op, **self._hidden_views(lambda h: h[idx[:-1]], unpad=False))  # (..., H)
        t_index = idx[-2]
        if all(_is_full_slice(i) for i in idx[:-2]) and isinstance(t_index, slice) and t_index.step in (None, 1):
            # a slice of the sequence (the training scripts' shift): move the window, keep the padded rows
            start, stop, _ = t_index.indices(self.t1 - self.t0)
            return self._derive(op, t0=self.t0 + start, t1=self.t0 + max(start, stop))
        return self._derive(op, **self._hidden_views(lambda h: h[idx[:-1]]), t0=0, t1=None)

    def reshape(self, *shape: Any) -> LigerLogits | torch.Tensor:
        """A reshape that keeps the vocabulary dim last and whole (``(B, T, V) -> (B*T, V)``) stays deferred."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        if shape and all(isinstance(s, int) for s in shape) and shape[-1] == self.vocab_size and self.rows is not None:
            try:
                return self._derive(("reshape", shape), rows=self.rows.reshape(shape[:-1]))
            except RuntimeError:
                pass  # the leading dims do not fit: stock's reshape raises its own error below
        elif shape and all(isinstance(s, int) for s in shape) and shape[-1] == self.vocab_size:
            try:
                views = self._hidden_views(lambda h: h.reshape(*shape[:-1], h.shape[-1]))  # (..., H)
            except RuntimeError:
                views = None  # the leading dims do not fit: stock's reshape raises its own error below
            if views is not None:
                return self._derive(("reshape", shape), **views, t0=0, t1=None)
        _warn_materialize(f"reshape{shape}", self)
        return self.real().reshape(shape)

    view = reshape  # (a deferred view has no memory layout to refuse)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> LigerLogits | torch.Tensor:
        nd = self.ndim
        s, e = start_dim % nd, end_dim % nd
        if e >= nd - 1 or s > e:
            _warn_materialize("flatten over the vocabulary dimension", self)
            return self.real().flatten(start_dim, end_dim)
        lead = list(self.shape)
        return self.reshape(*lead[:s], -1, *lead[e + 1 :])

    def contiguous(self, *args: Any, **kwargs: Any) -> LigerLogits:
        return self

    def to(self, *args: Any, **kwargs: Any) -> LigerLogits | torch.Tensor:
        """``.to(dtype)`` (and a no-op ``.to(device)``) stay deferred: the loss is computed in fp32 either way."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, (str, torch.device)):
                device = a
            else:
                dtype = device = object()  # .to(other_tensor) or anything else: the real path
        if kwargs or (device is not None and torch.device(device) != self.hidden.device) or (
            dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point)
        ):
            _warn_materialize(".to(...)", self)
            return self.real().to(*args, **kwargs)
        if dtype is None or dtype == self.dtype:
            return self
        return self._derive(("to", dtype), out_dtype=dtype)

    def float(self) -> LigerLogits:
        return self.to(torch.float32)

    def double(self) -> LigerLogits:
        return self.to(torch.float64)

    def bfloat16(self) -> LigerLogits:
        return self.to(torch.bfloat16)

    def half(self) -> LigerLogits:
        return self.to(torch.float16)

    def type_as(self, other: torch.Tensor) -> LigerLogits | torch.Tensor:
        return self.to(other.dtype) if other.device == self.device else self.to(other)

    def split(self, split_size: int | list[int], dim: int = 0) -> tuple:
        """Row chunks (a leading dim) stay deferred; their per-token losses join again in ``torch.cat``."""
        nd = self.ndim
        d = dim % nd
        if d == nd - 1:
            _warn_materialize("split over the vocabulary dimension", self)
            return self.real().split(split_size, dim)
        packed = self.rows is not None
        parts = (self.rows if packed else self._unpadded_hidden()).split(split_size, d)
        lora_parts = (None,) * len(parts)
        if not packed and self.x_lora is not None:
            lora_parts = self._unpadded(self.x_lora).split(split_size, d)
        out = []
        for i, (h, xl) in enumerate(zip(parts, lora_parts)):
            change = {"rows": h} if packed else {"hidden": h, "x_lora": xl, "t0": 0, "t1": None}
            p = self._derive(("split", split_size, d, i), **change)
            p.part_of = (self, i, len(parts), d)
            out.append(p)
        return tuple(out)

    def _unpadded_hidden(self) -> torch.Tensor:
        return self._unpadded(self.hidden)

    def _unpadded(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (``hidden`` or ``x_lora``) without the bucket's padding rows."""
        return t if self.t1 is None else t[..., self.t0 : self.t1, :]

    def _hidden_views(self, view: Any, unpad: bool = True) -> dict:
        """``hidden`` (unpadded first with ``unpad``) and, for a LoRA head with dropout, ``x_lora`` seen through the
        same ``view``: the fields of a derived output."""
        pick = self._unpadded if unpad else (lambda t: t)
        return {"hidden": view(pick(self.hidden)),
                "x_lora": view(pick(self.x_lora)) if self.x_lora is not None else None}

    def unpadded(self) -> LigerLogits:
        """The same logits without the bucket's padding rows (``hidden`` sliced to the window)."""
        if self.t1 is None or self.rows is not None:
            return self
        out = dataclasses.replace(self, **self._hidden_views(lambda t: t), t0=0, t1=None)
        out.root, out.ops, out.part_of = self.root, self.ops, self.part_of
        return out

    # --- the loss ----------------------------------------------------------------------------------
    def loss(
        self,
        targets: torch.Tensor,
        ignore_index: int = -100,
        reduction: str = "mean",
        num_valid_targets: torch.Tensor | int | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The fused linear cross-entropy of these logits (fp32), ``F.cross_entropy``'s semantics per row."""
        if not isinstance(targets, torch.Tensor):
            raise TypeError(f"targets must be a torch.Tensor of class indices, got {type(targets).__name__}")
        if tuple(targets.shape) != tuple(self.shape[:-1]):
            raise ValueError(
                f"targets shape {tuple(targets.shape)} does not match the model output's leading dims "
                f"{tuple(self.shape[:-1])} (did you shift one and not the other?)"
            )
        if self.rows is not None:
            return self._packed_loss(targets, ignore_index, reduction, num_valid_targets, **kwargs)
        return self._fused_loss(targets, ignore_index, reduction, num_valid_targets, **kwargs)

    def _fused_loss(self, targets: torch.Tensor, ignore_index: int, reduction: str,
                    num_valid_targets: torch.Tensor | int | None, **kwargs: Any) -> torch.Tensor:
        window = None
        if self.t1 is not None and (self.t0, self.t1) != (0, self.hidden.shape[-2]):
            # padded rows (the bucket's tail, the shifted-out first/last rows) get ignore_index: the mean is
            # over the same valid targets as the unpadded batch's, and their rows get zero gradient
            window = (self.t0, self.t1)
            padded = targets.new_full(self.hidden.shape[:-1], ignore_index)  # (B, T_bucket)
            padded[..., self.t0 : self.t1] = targets
            targets = padded
        from ..kernels.fused_linear_cross_entropy import fused_linear_cross_entropy

        if self.head is not None:
            weight, bias, lora = self.head.weight, self.head.bias, self.head.lora
        else:
            weight, bias = lm_head_weight_bias(self.lm_head)
            lora = lm_head_lora(self.lm_head)
        hidden, x_lora = self.hidden, self.x_lora
        if self.compute_dtype is not None and hidden.dtype != self.compute_dtype:
            hidden = hidden.to(self.compute_dtype)  # undo a wrapper's output cast (see the class docstring)
            x_lora = x_lora.to(self.compute_dtype) if x_lora is not None else None
        if weight.dtype != hidden.dtype and not torch.is_autocast_enabled(hidden.device.type):
            weight = weight.to(hidden.dtype)  # a dequantized head (QLoRA) comes in its quantization's dtype
            bias = bias.to(hidden.dtype) if bias is not None else None
        if lora is not None:  # a LoRA head (lora_head: true): (x_lora A^T B^T) s joins the chunked logits
            lora_a, lora_b, scaling = lora
            if lora_a.dtype != hidden.dtype and not torch.is_autocast_enabled(hidden.device.type):
                lora_a, lora_b = lora_a.to(hidden.dtype), lora_b.to(hidden.dtype)  # (r, H), (V, r): small
            kwargs = {"lora_a": lora_a, "lora_b": lora_b, "lora_scale": scaling, "x_lora": x_lora, **kwargs}
        loss = fused_linear_cross_entropy(
            hidden, weight, targets, bias,
            ignore_index=ignore_index, reduction=reduction, softcap=self.softcap,
            num_valid_targets=num_valid_targets,
            **{"mode": self.flce_mode, "max_chunk_bytes": self.max_chunk_bytes, **kwargs},
        )
        if window is not None and reduction == "none":
            loss = loss.view(targets.shape)[..., window[0] : window[1]]  # per-token losses of the window only
        return loss

    def _packed_loss(self, targets: torch.Tensor, ignore_index: int, reduction: str,
                     num_valid_targets: torch.Tensor | int | None, **kwargs: Any) -> torch.Tensor:
        """The loss over the packed rows: each position's target goes to its row of ``hidden`` (positions the packed
        forward left out must have ``ignore_index``: checked, else the unpacked twin computes the loss), so the mean
        is over the same valid targets and no logits are computed for padding."""
        rows, flat = self.rows.reshape(-1), targets.reshape(-1)
        left_out = rows < 0
        known = None
        if self.left_out is not None:
            root = self.root if self.root is not None else self
            known = self.left_out.verdict(targets, self.rows, root.rows, ignore_index)
        if self.state is not None:  # (the model's ModelState.loss_checks)
            self.state.loss_checks["host" if known is not None else "device"] += 1
        if (not known) if known is not None else bool((left_out & (flat != ignore_index)).any()):  # (device: a sync)
            _warn_unpacked(self)
            return self._on_unpacked().loss(targets, ignore_index, reduction, num_valid_targets, **kwargs)
        n = self.hidden.shape[0]
        dest = torch.where(left_out, n, rows)  # the left-out positions write to a spare slot
        packed = flat.new_full((n + 1,), ignore_index).scatter_(0, dest, flat)[:n]  # (N,)
        loss = self._fused_loss(packed, ignore_index, reduction, num_valid_targets, **kwargs)
        if reduction == "none":  # back to the positions: a left-out one's target is ignored, its loss 0
            loss = torch.cat([loss.view(-1), loss.new_zeros(1)])[dest].view(targets.shape)
        return loss

    def _on_unpacked(self) -> LigerLogits:
        """This output computed without packing: the root's unpacked twin (made once), with this object's views and
        casts applied."""
        root = self.root if self.root is not None else self
        twin = root.__dict__.get("_twin")
        if twin is None:
            twin = root.__dict__["_twin"] = root.unpacked()
        return self._replay_ops(twin)

    def _replay_ops(self, t: Any) -> Any:
        """``t`` (the root's real logits, or its unpacked twin) with this object's views and casts applied."""
        for op in self.ops:
            kind = op[0]
            if kind == "index":
                t = t[op[1]]
            elif kind == "reshape":
                t = t.reshape(op[1])
            elif kind == "to":
                t = t.to(op[1])
            else:  # "split"
                t = t.split(op[1], op[2])[op[3]]
        return t

    # --- the real logits ---------------------------------------------------------------------------
    def materialize(self) -> torch.Tensor:
        """The real ``(..., V)`` logits of this output (allocates them: only for code that truly needs logits).
        Computed from ``hidden`` each call; :meth:`real` caches them on the model's output."""
        if self.rows is not None:  # packed: LitGPT's logits exist at the padding positions too
            return self._on_unpacked().materialize()
        hidden = self._unpadded_hidden()
        hidden = hidden if self.compute_dtype is None else hidden.to(self.compute_dtype)
        if self.x_lora is not None and _has_lora_update(self.lm_head):
            # LitGPT's LoRALinear forward on the dropout output the loss used (calling the head would draw another)
            x_lora = self._unpadded(self.x_lora)
            x_lora = x_lora if self.compute_dtype is None else x_lora.to(self.compute_dtype)
            head = self.lm_head
            logits = head.linear(hidden) + (x_lora @ head.lora_A.transpose(0, 1) @ head.lora_B.transpose(0, 1)) \
                * head.scaling  # (..., V)
        else:
            logits = self.lm_head(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.to(self.dtype)

    def real(self) -> torch.Tensor:
        """The logits tensor that stock LitGPT would have given for this output: the model output's real logits,
        computed once and cached (again if grad mode turned on since, so that they carry a graph), with this
        object's views and casts applied."""
        root = self.root if self.root is not None else self
        cached = root.__dict__.get("_real")
        needs_graph = torch.is_grad_enabled() and root.hidden.requires_grad
        if cached is None or (needs_graph and cached.grad_fn is None):
            cached = root.materialize()
            root.__dict__["_real"] = cached
        return self._replay_ops(cached)

    # --- everything else: the real logits ------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("root", "ops", "part_of", "_real", "_twin"):
            raise AttributeError(name)
        if not hasattr(torch.Tensor, name):
            raise LigerLogitsError(f"LigerLogits (deferred logits) has no attribute {name!r}, nor does a tensor")
        _warn_materialize(f".{name}", self)
        return getattr(self.real(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_function(func, args, kwargs)

    def __iter__(self):
        _warn_materialize("iterating", self)
        return iter(self.real())

    def __repr__(self) -> str:
        return f"LigerLogits(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.hidden.device})"

    __hash__ = object.__hash__


class _PendingLoss:
    """``F.cross_entropy(part, target, reduction="none")`` of a LigerLogits, not computed yet: ``torch.cat`` of
    the per-token losses of all the parts of one ``split`` (litgpt's ``chunked_cross_entropy``) joins them into
    one pending loss, and ``.sum()`` of it runs the fused loss with ``reduction="sum"`` (gradients in the forward,
    no recompute); anything else computes the per-token losses (fused, ``reduction="none"``) and goes on with
    that tensor."""

    __slots__ = ("_cached", "ignore_index", "label_smoothing", "logits", "target")

    def __init__(self, logits: LigerLogits, target: torch.Tensor, ignore_index: int, label_smoothing: float) -> None:
        self.logits, self.target = logits, target
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self._cached: torch.Tensor | None = None

    @staticmethod
    def join(parts: list | tuple, dim: int) -> _PendingLoss | None:
        first = parts[0]
        whole = first.logits.part_of
        if whole is None or dim % max(1, first.target.dim()) != whole[3] or len(parts) != whole[2]:
            return None
        for i, p in enumerate(parts):
            if (p.logits.part_of is None or p.logits.part_of[0] is not whole[0] or p.logits.part_of[1] != i
                    or (p.ignore_index, p.label_smoothing) != (first.ignore_index, first.label_smoothing)):
                return None
        target = torch.cat([p.target for p in parts], dim)
        return _PendingLoss(whole[0], target, first.ignore_index, first.label_smoothing)

    def _fused(self, reduction: str) -> torch.Tensor:
        loss = self.logits.loss(
            self.target, ignore_index=self.ignore_index, reduction=reduction, label_smoothing=self.label_smoothing
        )
        return loss.to(self.logits.dtype)  # stock's loss has the logits' dtype

    def resolve(self) -> torch.Tensor:
        if self._cached is None:
            self._cached = self._fused("none")
        return self._cached

    def sum(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or self._cached is not None:
            return self.resolve().sum(*args, **kwargs)
        return self._fused("sum")

    @property
    def shape(self) -> torch.Size:
        return self.target.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.logits.dtype

    @property
    def device(self) -> torch.device:
        return self.target.device

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.target.dim()

    def __len__(self) -> int:
        return len(self.target)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_function(func, args, kwargs)

    def __repr__(self) -> str:
        return f"_PendingLoss(shape={tuple(self.shape)}, dtype={self.dtype})"


def _delegate(cls: type, name: str, warn: bool) -> None:
    def op(self: Any, *args: Any) -> Any:
        if warn:
            _warn_materialize(name, self)
        real = self.real() if isinstance(self, LigerLogits) else self.resolve()
        return getattr(real, name)(*_to_real(args))

    op.__name__ = name
    setattr(cls, name, op)


# arithmetic, comparisons and conversions: on the real tensor, as on stock LitGPT's logits
for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__",
    "__pos__", "__abs__", "__lt__", "__le__", "__gt__", "__ge__", "__float__", "__int__", "__bool__",
    "__array__", "__and__", "__or__", "__invert__",
):
    _delegate(LigerLogits, _name, warn=True)
    _delegate(_PendingLoss, _name, warn=False)
_delegate(_PendingLoss, "__iter__", warn=False)
_delegate(_PendingLoss, "__getitem__", warn=False)


def _cross_entropy(
    input: Any, target: Any, weight: torch.Tensor | None = None, size_average: Any = None,
    ignore_index: int = -100, reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0,
) -> Any:
    """``F.cross_entropy`` given a LigerLogits: the fused loss for class-index targets over ``(N, V)`` rows (the
    loss has the logits' dtype, as stock's has); per-class weights, probability targets, the legacy
    ``size_average``/``reduce`` or other layouts take the real logits."""
    fused = (
        isinstance(input, LigerLogits) and isinstance(target, torch.Tensor) and weight is None
        and size_average is None and reduce is None and input.dim() == 2 and target.dim() == 1
        and not target.is_floating_point() and not target.is_complex()
    )
    if not fused:
        if isinstance(input, LigerLogits):
            _warn_materialize("F.cross_entropy with per-class weights, probability targets or (N, V, ...) layout",
                              input)
        return F.cross_entropy(
            _to_real(input), _to_real(target), weight, size_average, ignore_index, reduce, reduction, label_smoothing
        )
    if reduction == "none":
        return _PendingLoss(input, target, ignore_index, label_smoothing)
    loss = input.loss(target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    if reduction == "mean":
        # stock's mean over no valid target is 0/0 = nan (the kernel gives 0): keep stock's number
        loss = torch.where((target != ignore_index).any(), loss, torch.full_like(loss, float("nan")))
    return loss.to(input.dtype)


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
