"""Training batches prepared on the host by the data loader's workers (litgpt's SFT collate), for both front-ends.

Two things a training step would otherwise ask of the GPU are known on the host while a batch is still a CPU tensor:

* the packed layout of the batch (``LigerConfig.packing``; :func:`lit_liger.swap.packing.host_plan`): the rows' lengths, and
  whether a trained target sits where packing leaves positions out. The forward then reads nothing back from the
  device and the loss checks nothing there;
* litgpt's per-sample token counts, which its training loops sum with ``.item()`` twice per iteration: kept on the
  host they cost no device sync, and their values are the same.

:class:`HostPrep` does both on a collated batch. The ``lit-liger`` command puts it into the training DataLoader's collate
(:class:`LigerCollate`, :func:`install`: the work runs in the loader's worker processes) for litgpt's ``fit``;
``LigerCallback`` runs it in the LightningModule's ``on_before_batch_transfer`` (the Trainer's loader iterator exists
before any callback hook could change its collate). After the batch reaches the device :func:`after_move` unboxes the
token counts and hands the packed layout to the forward of that batch's ``input_ids``
(:func:`lit_liger.swap.packing.register`). One process, or each process of a replicated model (lit-liger's replica
plan, Lightning's ``DDPStrategy``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["AfterMove", "HostPrep", "LigerCollate", "after_move", "install", "prep_for", "unbox"]


class _HostOnly:
    """A value a batch carries past the move to the device untouched (it has no ``.to``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __getstate__(self) -> Any:  # (to and from the data loader's worker processes)
        return self.value

    def __setstate__(self, value: Any) -> None:
        self.value = value


#: a collated batch's CPU tensors up to this many bytes each go from the data loader's worker processes to the training
#: process inside the pickled batch (their bytes), not through shared memory, and arrive in pinned memory where that
#: process uses CUDA. PyTorch sends a tensor through shared memory as a file descriptor, which the receiving process
#: fetches from the worker with a socket connection and an authentication handshake per tensor: a litgpt batch under
#: lit-liger's collate has five (ids, labels, two token counts, the packed layout). And Fabric's move of a tensor in
#: pageable memory to the device waits for the GPU's queued work. Measured on an H200 (litgpt's LoRA loop,
#: Llama-3.2-1B, micro-batch 4, 1,000 iterations, ``benchmarks/results/h200-2026-11-29c``): the loop's host work inside
#: litgpt's timed region 10.7 -> 8.0 ms per iteration; the run no faster, its GPU the bound (~12 ms per iteration).
#: A CPU loader with two workers: ~1.0 ms per batch through shared memory, ~0.2 by value. 0: every tensor through
#: shared memory, as PyTorch sends it
BY_VALUE_BYTES = 1 << 20


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    """(In the training process) the tensor, in pinned memory where this process uses CUDA: Fabric then moves it to
    the device without waiting (a copy from pageable memory waits for the GPU's queued work, which kept the host at most
    one iteration ahead of the GPU)."""
    pin = torch.cuda.is_available() and torch.cuda.is_initialized()
    out = torch.empty(shape, dtype=dtype, pin_memory=pin)
    if data:
        out.reshape(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return out


class _TensorBytes:
    """A CPU tensor pickled as its bytes (see :data:`BY_VALUE_BYTES`); unpickled as a tensor."""

    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __reduce__(self) -> tuple:
        t = self.t.detach().contiguous()
        return _tensor_from_bytes, (t.reshape(-1).view(torch.uint8).numpy().tobytes(), t.dtype, tuple(t.shape))


def _by_value(v: Any) -> Any:
    if type(v) is torch.Tensor and v.device.type == "cpu" and v.numel() * v.element_size() <= BY_VALUE_BYTES:
        return _TensorBytes(v)
    if type(v) is dict:
        return {k: _by_value(x) for k, x in v.items()}
    if type(v) in (list, tuple):
        return type(v)(_by_value(x) for x in v)
    if type(v) is _HostOnly:
        return _HostOnly(_by_value(v.value))
    return v


def _plain(batch: dict) -> dict:
    return batch


class _Batch(dict):
    """A collated batch, a plain ``dict`` once it reaches the training process: pickled (from a data loader worker) with
    its small CPU tensors by value (:data:`BY_VALUE_BYTES`)."""

    def __reduce__(self) -> tuple:
        return _plain, ({k: _by_value(v) for k, v in self.items()},)


class HostPrep:
    """What :class:`LigerCollate` adds to a collated batch of litgpt's SFT collate while it is on the host: with
    ``pack``, its packed layout; its per-sample token counts boxed so that they stay on the host."""

    def __init__(self, pack: bool, bucketed: bool, ignore_index: int = -100, tops: tuple[int, ...] = ()) -> None:
        self.pack, self.bucketed, self.ignore_index = pack, bucketed, ignore_index
        self.tops = tuple(tops)  # a fitted ladder for the packed lengths (lit_liger.swap.buckets.fit_packed_tops)

    def __call__(self, batch: Any) -> Any:
        if not isinstance(batch, dict):
            return batch
        if isinstance(batch.get("token_counts"), dict):
            batch["token_counts"] = _HostOnly(batch["token_counts"])
        idx, labels = batch.get("input_ids"), batch.get("labels")
        if self.pack and isinstance(idx, torch.Tensor):
            from ..swap.buckets import packed_bucket_length
            from ..swap.packing import BATCH_KEY, host_plan

            ladder = (functools.partial(packed_bucket_length, tops=self.tops) if self.tops else packed_bucket_length)
            entry = host_plan(idx, labels if isinstance(labels, torch.Tensor) else None,
                              ladder if self.bucketed else None, self.ignore_index)
            if entry is not None:
                batch[BATCH_KEY] = entry
        return batch


class LigerCollate:
    """litgpt's collate function, then :class:`HostPrep` (in the data loader's worker processes).
    :func:`after_move` undoes the token counts' box once the batch is on the device."""

    def __init__(self, inner: Callable, pack: bool, bucketed: bool, tops: tuple[int, ...] = ()) -> None:
        keywords = getattr(inner, "keywords", None) or {}  # (litgpt's collate is a functools.partial)
        self.inner, self.prep = inner, HostPrep(pack, bucketed, int(keywords.get("ignore_index", -100)), tops)

    @property
    def ignore_index(self) -> int:
        return self.prep.ignore_index

    def __call__(self, samples: Any) -> Any:
        batch = self.prep(self.inner(samples))
        return _Batch(batch) if type(batch) is dict and BY_VALUE_BYTES > 0 else batch


def after_move(batch: Any, unbox_counts: bool = True) -> None:
    """A batch that :class:`LigerCollate` made, now on the device: its token counts back to their (host) tensors
    (``unbox_counts``; else left to :func:`unbox`), its packed layout kept for the forward of its ``input_ids``."""
    from ..swap.packing import register

    if isinstance(batch, dict):
        if unbox_counts:
            unbox(batch)
        register(batch)


def unbox(batch: Any) -> None:
    """``batch["token_counts"]`` back to its host tensors, where :class:`HostPrep` boxed them. (Under
    ``DistributedDataParallel`` they stay boxed until its forward has moved the batch: it copies every CPU tensor of its
    inputs to the device, a copy from pageable memory that waits for the GPU to finish its queued work; measured: 1.5
    ms of host time per batch on rank 0, 2 x H200, ``benchmarks/results/h200x2-2026-11-27d``.)"""
    if isinstance(batch, dict) and isinstance(batch.get("token_counts"), _HostOnly):
        batch["token_counts"] = batch["token_counts"].value


class AfterMove:
    """A training loop's data loader (Fabric's: it moves each batch to the device), each batch then passed to
    :func:`after_move`. Everything else is the loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            after_move(batch)
            yield batch

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def prep_for(model: torch.nn.Module, loader: Any) -> HostPrep | None:
    """The :class:`HostPrep` for batches of ``loader`` (Fabric's wrapper or a DataLoader) trained by the swapped GPT
    inside ``model``, or None where it does not apply: no swapped GPT, not a DataLoader, a collate other than litgpt's
    SFT collate (its batch layout is the one known here), or one already wrapped."""
    from torch.utils.data import DataLoader

    gpt = next((m for m in model.modules() if hasattr(m, "_liger_packing")), None)
    inner = getattr(loader, "_dataloader", loader)
    if gpt is None or not isinstance(inner, DataLoader) or isinstance(inner.collate_fn, LigerCollate):
        return None
    func = getattr(inner.collate_fn, "func", None)
    if func is None or "sft_collate" not in getattr(func, "__name__", ""):
        return None
    keywords = getattr(inner.collate_fn, "keywords", None) or {}
    pack = bool(gpt._liger_packing) and getattr(gpt, "_liger_pack_why", None) is None
    bucketed = bool(getattr(gpt, "_liger_seq_buckets", False))
    tops = fitted_ladder(gpt, inner, int(keywords.get("max_seq_length", -1) or -1)) if pack and bucketed else ()
    return HostPrep(pack, bucketed, int(keywords.get("ignore_index", -100)), tops)


def fitted_ladder(gpt: torch.nn.Module, loader: Any, cap: int) -> tuple[int, ...]:
    """For one process: the packed lengths fitted to ``loader``'s data (:func:`lit_liger.swap.buckets.fit_packed_tops`
    on :func:`lit_liger.runtime.lengths.some_lengths` of its data set, micro-batches of its ``batch_size``, each sample
    at most ``cap`` tokens), set as the swapped ``gpt``'s ``_liger_packed_tops`` (its forward pads a batch the loader
    did not lay out to them too) and said in the log; ``()`` (the default ladder) under several processes (their
    pre-captures walk the default ladder), without a ``batch_size`` of 2 or more, or where the lengths cannot be read."""
    from .._dist import rank_zero
    from ..swap.buckets import fit_packed_tops
    from .lengths import some_lengths

    gpt.__dict__.pop("_liger_packed_tops", None)  # (an earlier fit's ladder, for other data)
    per_batch = getattr(loader, "batch_size", None)
    several = torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1
    if several or not isinstance(per_batch, int) or per_batch < 2:
        return ()
    t0 = time.perf_counter()
    try:
        lengths = some_lengths(getattr(loader, "dataset", None))
    except Exception:  # noqa: BLE001 - the data loader's own reads will say what is wrong with the data
        lengths = None
    if not lengths:
        return ()
    tops, fitted, default = fit_packed_tops(lengths, per_batch, cap)
    if not tops or fitted >= default:
        return ()
    gpt._liger_packed_tops = tops
    if rank_zero():
        print(f"lit-liger: packed micro-batches padded to {len(tops)} lengths fitted to {len(lengths):,} samples' "
              f"lengths ({', '.join(format(t, ',') for t in tops)} tokens): ~{fitted:.1%} padding expected, "
              f"{default:.1%} with the default ladder's as many lengths ({time.perf_counter() - t0:.2f} s)", flush=True)
    return tops


def install(model: torch.nn.Module, loader: Any) -> tuple[bool, Callable[[], None]] | None:
    """Put :class:`LigerCollate` into ``loader``'s DataLoader (before its iterator exists: an iterator keeps the
    collate it started with) for the swapped GPT inside ``model`` (see :func:`prep_for`): ``(packs, restore)``, whether
    batches are laid out packed and what puts litgpt's collate back; None where it does not apply."""
    prep = prep_for(model, loader)
    if prep is None:
        return None
    inner = getattr(loader, "_dataloader", loader)
    original = inner.collate_fn
    inner.collate_fn = LigerCollate(original, prep.pack, prep.bucketed, prep.tops)

    def restore() -> None:
        inner.collate_fn = original

    return prep.pack, restore
