"""Packed micro-batches (``LigerConfig.packing``): the batch's samples laid end to end, no padding computed.

litgpt's collate pads each micro-batch to its longest sample (input ids with 0 on the right, targets with
``ignore_index``): on instruction data a third of the positions a step computes are padding. Attention is causal
and the padding comes last, so a sample's real positions never see its padding; dropping the padding and running
the samples as one sequence, with attention that stays inside each sample (variable-length attention over
cumulative sequence lengths) and RoPE positions that restart at each sample, computes the same numbers for every
real position. What a step computes then is the real tokens, not the padded rectangle.

How a batch is packed (:func:`plan`): each row's length is the position after its last non-zero token id (at least 1):
the trailing zeros are the collate's padding. The rows are laid end to end, and the packed length is padded up to a
bucket (``LigerConfig.seq_buckets``, :func:`lit_liger.swap.buckets.packed_bucket_length`; the pad is a segment of its own at
the end, whose outputs nothing reads), so that a run sees few shapes (CUDA graphs). Where the data loader did not lay
the batch out on the host (:func:`host_plan`), one host sync per step reads the lengths (while every batch read has
filled its length, only now and then: ``lit_liger.swap.gpt.LENGTH_READS``). A sample whose real last token is id 0 is
shortened by this rule: its left-out positions' targets are checked at the loss (:class:`lit_liger.swap.loss.LigerLogits`),
and where one is not ignored the loss comes from an unpacked forward instead (with a warning), so a packed step is never
silently different.

Attention (:func:`attend`): on CUDA, PyTorch's flash attention over cumulative sequence lengths
(``aten::_flash_attention_forward``/``_backward``: GQA without copies, a sliding window as its left window,
capturable in CUDA graphs); on CPU (tests, Triton's interpreter) LitGPT's own attention per sample. Layers with
attention logit softcapping (Gemma-2) attend through lit-liger's Triton softcap kernel
(``kernels/attention.py``) given each position's sample start (:func:`sample_starts`, a sliding window folded in):
query ``i`` sees keys ``starts[i] <= j <= i``, whole key blocks of earlier samples skipped.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..kernels._launch import device_limits

__all__ = ["BATCH_KEY", "LeftOut", "Pack", "Plan", "attend", "flash_varlen_ok", "host_plan", "plan", "ready_plan", "register"]


@dataclasses.dataclass
class Pack:
    """Where the samples of a packed sequence start and end: ``cu_seqlens`` ``(S + 1,)`` int32 on the device (the
    samples, then the bucket's pad segment, which may be empty), ``max_len`` a bound on a segment's length (the
    packed length: static, so that a captured graph serves any batch of that length), and ``bounds``, the same
    boundaries on the host (the per-sample reference path; None where only the device has them, inside a replay)."""

    cu_seqlens: torch.Tensor
    max_len: int
    bounds: tuple[int, ...] | None = None
    #: what one forward computes once for all its layers from ``cu_seqlens`` (:func:`sample_starts`): a dict on the
    #: copy a model's forward makes for itself (``GPT._liger_hidden``), None on the plan's own (whose boundaries a
    #: captured step rewrites in place before each replay)
    memo: dict | None = dataclasses.field(default=None, compare=False, repr=False)

    def for_one_forward(self) -> "Pack":
        """This pack for one forward (and its recompute in backward): the same boundaries, a memo of its own."""
        return dataclasses.replace(self, memo={})


@dataclasses.dataclass
class Plan:
    """One packed micro-batch: ``idx`` ``(1, N)`` token ids (samples end to end, then the bucket's pad),
    ``positions`` ``(N,)`` each token's position inside its sample (RoPE), ``pack`` the attention's boundaries, and
    ``rows`` ``(B, T)`` for each position of the caller's batch its row in the packed sequence (-1: padding left
    out)."""

    idx: torch.Tensor
    positions: torch.Tensor
    pack: Pack
    rows: torch.Tensor
    real: int  # tokens of the samples (N without the bucket's pad)
    check: LeftOut | None = None  # what the host knows about the left-out positions' targets (see ready_plan)


@dataclasses.dataclass
class LeftOut:
    """What the data loader found, on the host, about the targets at the positions a packed batch leaves out
    (:func:`host_plan`): ``same``: no label that is not ``ignore_index`` sits at a left-out position of ``labels``;
    ``shifted``: none sits one position after one (litgpt's ``targets[..., 1:]`` against ``logits[..., :-1]``).
    ``labels`` (a weak reference) and ``version`` say which tensor that was and that it was not written to since."""

    labels: Any
    version: int
    same: bool
    shifted: bool
    ignore_index: int

    def verdict(self, targets: torch.Tensor, rows: torch.Tensor, root_rows: torch.Tensor, ignore_index: int
                ) -> bool | None:
        """Whether the loss over ``targets`` against the positions ``rows`` (a view of ``root_rows``, the batch's
        ``(B, T)`` rows) is free of left-out targets: True / False where the loader's finding answers it (``targets``
        is the registered labels, or ``labels[..., 1:]`` against ``rows[..., :-1]``, unchanged), None where it
        does not (the caller checks on the device)."""
        labels = self.labels()
        if labels is None or ignore_index != self.ignore_index or labels._version != self.version \
                or labels.dim() != 2 or root_rows.shape != labels.shape:
            return None
        if targets.untyped_storage().data_ptr() != labels.untyped_storage().data_ptr() \
                or rows.untyped_storage().data_ptr() != root_rows.untyped_storage().data_ptr():
            return None
        if targets.stride() != labels.stride() or rows.stride() != root_rows.stride() \
                or rows.storage_offset() != root_rows.storage_offset():
            return None
        B, T = labels.shape
        if targets.shape == labels.shape == rows.shape and targets.storage_offset() == labels.storage_offset():
            return self.same
        if targets.shape == rows.shape == (B, T - 1) and targets.storage_offset() == labels.storage_offset() + \
                labels.stride(1):
            return self.shifted
        return None


def row_lengths(idx: torch.Tensor) -> list[int]:
    """Each row's length without its trailing zeros (the collate's right padding), at least 1 (one host sync)."""
    B, T = idx.shape
    nonzero = idx != 0
    last = T - torch.flip(nonzero, dims=(1,)).to(torch.int8).argmax(dim=1)  # (B,) one past the last non-zero
    last = torch.where(nonzero.any(dim=1), last, torch.ones_like(last))
    return last.tolist()


def _layout(lengths: list[int], T: int, bucket: Callable[[int], int] | None, max_position: int) -> tuple:
    """Where each row's tokens go in the packed sequence: ``(real, n, bounds, src, positions, rows)`` on the host. The
    bucket's pad segment counts positions from 0, kept below ``T`` and ``max_position`` (its outputs are not read)."""
    real = sum(lengths)
    n = bucket(real) if bucket is not None else real
    n = max(n, real)
    starts = [0]
    for L in lengths:
        starts.append(starts[-1] + L)
    bounds = (*starts, n)  # the samples, then the pad segment [real, n)
    src = torch.cat([torch.arange(L) + b * T for b, L in enumerate(lengths)])  # (real,) flat (b, t) of each row
    top = min(T, max_position) - 1
    positions = torch.cat([torch.arange(L) for L in lengths] + [torch.arange(n - real).clamp_(max=top)])
    rows = torch.full((len(lengths) * T,), -1, dtype=torch.long)
    rows[src] = torch.arange(real)
    return real, n, bounds, src, positions, rows


#: with a bucket ladder (``LigerConfig.seq_buckets``: the captured step), a micro-batch without padding (every sample
#: fills the collate's length) is packed too: it runs as the ladder's packed length of its tokens, whose CUDA graphs the
#: packed micro-batches share, instead of an unpacked ``(B, T)`` shape of its own (one capture more, and cuDNN
#: attention's plan for that shape in its warm-up: the warm-ups of 2-GPU runs took 0.1-1.4 s,
#: ``benchmarks/results/h200x2-2026-11-27h``). Flash attention over the samples' boundaries computes what the unpacked
#: rows' causal attention does. The model packs one only once a batch with padding has come
#: (``lit_liger.swap.gpt._GPTMixin._liger_plan``): in a run whose batches all fill their length (pretraining) every
#: batch keeps the one unpacked shape, where cuDNN attention's replayed kernels are faster. (The switch that ran such a
#: batch unpacked left in issue 67: docs/performance-trail.md.) See :func:`plan`


def plan(idx: torch.Tensor, bucket: Callable[[int], int] | None, max_position: int) -> Plan | None:
    """The packed form of the ``(B, T)`` batch ``idx``, or None where packing changes nothing (one row; or no row
    with padding and no ``bucket``). ``bucket``: the packed length's bucket (None: exact); ``max_position``: positions
    stay below it (the RoPE cache's length).

    With a ``bucket`` ladder (the captured step) a batch without padding is packed too (the comment above)."""
    B, T = idx.shape
    if B < 2:
        return None
    lengths = row_lengths(idx)
    if sum(lengths) == B * T and bucket is None:
        return None
    real, n, bounds, src, positions, rows = _layout(lengths, T, bucket, max_position)
    host = torch.cat([src, positions, rows, torch.tensor(bounds)])  # one copy to the device, not four
    if idx.device.type == "cuda":
        host = host.pin_memory().to(idx.device, non_blocking=True)
    src, positions, rows, cu = host.to(idx.device).split([real, n, B * T, len(bounds)])
    cu = cu.to(torch.int32)
    packed = F.pad(idx.reshape(-1)[src], (0, n - real), value=0).unsqueeze(0)  # (1, n)
    return Plan(packed, positions, Pack(cu, n, bounds), rows.view(B, T), real)


#: the key under which :func:`host_plan`'s result travels in a batch dict (popped by :func:`register`)
BATCH_KEY = "_liger_pack"


def host_plan(idx: torch.Tensor, labels: torch.Tensor | None, bucket: Callable[[int], int] | None,
              ignore_index: int = -100) -> tuple | None:
    """:func:`plan`'s work done on the host, where the batch is still a CPU tensor (in a data loader's collate, so in
    its worker processes): ``(data, meta)``, one int64 tensor (the packed ids, positions, rows, boundaries) to travel
    to the device with the batch, and the host facts (sizes, boundaries, and the :class:`LeftOut` findings on
    ``labels``); None where :func:`plan` would return None."""
    if idx.dim() != 2 or idx.is_cuda or idx.dtype not in (torch.int32, torch.int64):
        return None
    B, T = idx.shape
    if B < 2:
        return None
    lengths = row_lengths(idx)  # (a CPU tensor: no device sync)
    if sum(lengths) == B * T and bucket is None:
        return None
    real, n, bounds, src, positions, rows = _layout(lengths, T, bucket, T)  # (T: the model's RoPE cache is longer)
    packed = F.pad(idx.reshape(-1)[src].long(), (0, n - real), value=0)
    same = shifted = None
    if labels is not None and labels.shape == idx.shape and not labels.is_cuda:
        left = (rows < 0).view(B, T)
        labeled = labels != ignore_index
        same = not bool((left & labeled).any())
        shifted = not bool((left[:, :-1] & labeled[:, 1:]).any())
    data = torch.cat([packed, positions, rows, torch.tensor(bounds)])
    return data, (B, T, real, n, bounds, bucket is not None, same, shifted, ignore_index)


#: a cache of the host plan the data loader made for the batch the training loop is about to use, keyed by that batch
#: tensor (``id(input_ids)``, checked against a weak reference and its version; one at a time): any model that trains
#: on that very tensor may use it, the plan depends on the token ids alone
_READY: dict[int, tuple] = {}


def register(batch: Any) -> None:
    """Take :func:`host_plan`'s result out of a batch dict that reached the device (``batch[BATCH_KEY]``) and keep it
    for the forward of ``batch["input_ids"]`` (:func:`ready_plan`). Only the latest batch is kept."""
    _READY.clear()
    entry = batch.pop(BATCH_KEY, None) if isinstance(batch, dict) else None
    idx, labels = (batch.get("input_ids"), batch.get("labels")) if isinstance(batch, dict) else (None, None)
    if entry is None or not isinstance(idx, torch.Tensor):
        return
    data, meta = entry
    if not isinstance(labels, torch.Tensor):
        labels = None
    _READY[id(idx)] = (weakref.ref(idx), idx._version, None if labels is None else weakref.ref(labels),
                       None if labels is None else labels._version, data, meta)


def ready_plan(idx: torch.Tensor, bucketed: bool, max_position: int) -> Plan | None:
    """The plan :func:`register` kept for exactly this tensor (the same object, not written to since, laid out with
    the model's bucket ladder, its positions inside the RoPE cache's ``max_position``), or None: the caller plans it
    with :func:`plan`."""
    entry = _READY.get(id(idx))
    if entry is None:
        return None
    ref, version, labels_ref, labels_version, data, meta = entry
    B, T, real, n, bounds, was_bucketed, same, shifted, ignore_index = meta
    if ref() is not idx or idx._version != version or tuple(idx.shape) != (B, T) or data.device != idx.device \
            or T > max_position or was_bucketed != bucketed:
        return None
    packed, positions, rows, cu = data.split([n, n, B * T, len(bounds)])
    check = None
    if labels_ref is not None and same is not None:
        check = LeftOut(labels_ref, labels_version, same, shifted, ignore_index)
    return Plan(packed.to(idx.dtype).view(1, n), positions, Pack(cu.to(torch.int32), n, bounds), rows.view(B, T), real,
                check)


def flash_varlen_ok(device: torch.device, dtype: torch.dtype, head_size: int) -> bool:
    """PyTorch's flash attention serves packed attention here: an NVIDIA CUDA device of sm_80 or newer, 16-bit, head
    size <= 256, flash enabled, a PyTorch with the variable-length op."""
    return (
        device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and head_size <= 256
        and torch.version.hip is None and torch.backends.cuda.flash_sdp_enabled()
        and hasattr(torch.ops.aten, "_flash_attention_forward") and device_limits(device).capability >= (8, 0)
    )


def _window_args(window: int | None) -> dict:
    # LitGPT's window W: query i sees keys i - W < j <= i, flash's left window W - 1 (right 0: causal)
    return {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}


class _FlashVarlen(torch.autograd.Function):
    """Causal flash attention over packed samples: q ``(N, nh, hs)``, k/v ``(N, ng, hs)`` -> ``(N, nh, hs)``."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                scale: float, window: int | None) -> torch.Tensor:
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale, **_window_args(window))
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale, ctx.window = max_len, scale, window
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out, lse, cu, cu, ctx.max_len, ctx.max_len, 0.0, True, rng, unused,
            scale=ctx.scale, **_window_args(ctx.window))
        return dq, dk, dv, None, None, None, None


def sample_starts(pack: Pack, n: int, window: int | None) -> torch.Tensor:
    """Each packed position's first key (its sample's start; with a sliding window ``W`` at least ``i - W + 1``),
    int32 ``(n,)`` on the device: the softcap kernel's ``starts``. Computed from ``cu_seqlens`` (device ops, no sync)
    once per forward where ``pack.memo`` is a dict (a forward's own copy: the layers of one window share it), else per
    call: a captured step copies new boundaries into the plan's ``pack`` before each replay."""
    from ..kernels.attention import sample_starts as _starts

    memo = pack.memo
    if memo is not None and (n, window) in memo:
        return memo[(n, window)]
    starts = _starts(pack.cu_seqlens, n, window)
    if memo is not None:
        memo[(n, window)] = starts
    return starts


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: Pack, scale: float, window: int | None,
           per_sample: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
           softcap: float | None = None, softcap_kernel: bool = False) -> torch.Tensor:
    """Causal attention inside each packed sample: q ``(1, nh, N, hs)``, k/v ``(1, ng, N, hs)`` -> ``(1, N, nh, hs)``.
    ``per_sample(q, k, v, T)``: the layer's own attention of one ``(1, heads, T, hs)`` sample (LitGPT's math: the
    reference path), returning ``(1, T, nh, hs)``. ``softcap``: the layer's attention logit softcap, attended through
    lit-liger's softcap kernel with each position's sample start where ``softcap_kernel`` (else per sample)."""
    if softcap is not None and softcap_kernel:
        from ..kernels.attention import softcap_attention

        starts = sample_starts(pack, q.shape[2], window)
        return softcap_attention(q, k, v, scale, softcap, starts=starts).transpose(1, 2)  # (1, N, nh, hs)
    if softcap is None and flash_varlen_ok(q.device, q.dtype, q.shape[-1]):
        y = _FlashVarlen.apply(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                               pack.cu_seqlens, pack.max_len, scale, window)  # (N, nh, hs)
        return y.unsqueeze(0)
    if pack.bounds is None:
        raise RuntimeError("lit-liger packing: this attention needs the samples' boundaries on the host (a packed "
                           "step captured on a device without flash attention); turn packing off")
    b = pack.bounds
    parts = [per_sample(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], e - s) for s, e in zip(b[:-1], b[1:]) if e > s]
    return torch.cat(parts, dim=1)  # (1, N, nh, hs)
