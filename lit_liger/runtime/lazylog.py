"""litgpt's per-iteration log line without its device syncs (``LigerConfig.defer_loss_sync``, the ``lit-liger`` command).

At ``--train.log_interval 1`` (litgpt's default) every iteration of litgpt's fine-tuning loops waits for the GPU
three times: ``running_loss.update(loss)`` (torchmetrics' NaN check, ``if nans.any()``), ``running_loss.compute().item()``
and ``fabric.log_dict`` (the CSV logger's ``.item()`` of the token-count tensors). Each wait empties the GPU's queue: the
host then prepares the next iteration (data, the packed plan, launching the replays) while the GPU idles.

Here, for one training process:

* :class:`RunningMean` (made by :class:`RunningMeans`, which the recipe's ``RunningMean`` name points to while the
  command runs it, for the ``fit`` whose :class:`DeferredLog` it holds) keeps the window on the device and
  computes the same float32 mean in the same order (NaN values left out, as torchmetrics' ``nan_strategy="warn"``
  does, the warning given when the value is read). ``compute()`` starts a copy of the mean to the host and returns it
  as a :class:`_Pending` value, whose ``item()`` waits only for the value :data:`LAG` logs back: the host runs at most
  that many logging intervals ahead of the GPU.
* :class:`DeferredLog` stands in for ``fabric.print`` and ``fabric.log_dict`` during ``fit``: a line or a metrics dict
  that holds such a value (or a device tensor, copied as it is at that point), and any metrics dict logged while
  something is kept, is kept and emitted in order, with the values filled in, once the log :data:`LAG` logs later
  has waited for them, when a line without such a value is printed, and at the end of ``fit``.

The numbers printed and logged are those of the synchronous loop (the test compares them); each line appears up to
:data:`LAG` logging intervals later. What changes is litgpt's ``iter_time``: measured on the host, which now waits for
the GPU :data:`LAG` iterations behind, it is the iteration's period in the running loop, not one iteration's latency.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["LAG", "DeferredLog", "RunningMean", "RunningMeans", "running_mean_factory"]

#: how many logs the host may run ahead of the GPU: a log's ``item()`` waits for the value this many logs back (the
#: lines are printed that many iterations late, all of them at the end of ``fit`` or before any other line). More than
#: one was meant to let the host build a lead of queued GPU work, beside which a new shape's capture is recorded
#: (the captures run without a device synchronize first). Measured at 8 on an H200 (Llama-3.2-1B LoRA and full fine-tuning,
#: litgpt's CLI, 200 iterations, ``benchmarks/results/h200-2026-11-29c``): the GPU waited 0-15% less for the captures
#: and the runs were no faster (tokens/s 1-3% lower, the fit's wall time within its spread): at micro-batch 4 the
#: replayed iteration's host work (~8 ms) is close to its GPU time (~12 ms), so little lead builds, and the captures
#: come in the run's first iterations, before any has
LAG = 1

_TOKEN = re.compile("\ue000(\\d+)\ue001")


class _Pending:
    """A float32 scalar on its way to the host: the copy and the event recorded after it."""

    def __init__(self, value: torch.Tensor, log: DeferredLog, nan_seen: torch.Tensor | None = None) -> None:
        self.host = torch.empty((), dtype=value.dtype, pin_memory=value.is_cuda)
        self.host.copy_(value, non_blocking=True)
        self.nan_host = None
        if nan_seen is not None:
            self.nan_host = torch.empty((), dtype=torch.bool, pin_memory=value.is_cuda)
            self.nan_host.copy_(nan_seen, non_blocking=True)
        self.event = torch.cuda.Event() if value.is_cuda else None
        if self.event is not None:
            self.event.record()
        self.log = log

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        if self.nan_host is not None and bool(self.nan_host):
            warnings.warn("Encountered `nan` values in tensor. Will be removed.", UserWarning, stacklevel=3)
        self.nan_host = None

    def item(self) -> _LazyFloat:
        """The value, to be read later: waits for the previous log's value (and emits what waited for it)."""
        self.log.advance(self)
        return _LazyFloat(self)


class _LazyFloat:
    """A logged float not read yet: formatted as a token that :class:`DeferredLog` fills in; ``float()`` reads it."""

    def __init__(self, pending: _Pending) -> None:
        self.pending, self.id = pending, next(pending.log.ids)

    def value(self) -> float:
        self.pending.wait()
        return self.pending.host.item()

    def __float__(self) -> float:
        return self.value()

    def __format__(self, spec: str) -> str:
        self.pending.log.formats[self.id] = (self, spec)
        return f"\ue000{self.id}\ue001"

    def __repr__(self) -> str:
        return repr(self.value())


class DeferredLog:
    """``fabric.print`` / ``fabric.log_dict`` of one ``fit`` (see the module docstring)."""

    def __init__(self, print_fn: Callable[..., Any], log_dict_fn: Callable[..., Any]) -> None:
        self.print_fn, self.log_dict_fn = print_fn, log_dict_fn
        # (kind, args, kwargs, pendings to wait for, the logs advanced before it was kept)
        self.queue: list[tuple[str, tuple, dict, list, int]] = []
        self.formats: dict[int, tuple[_LazyFloat, str]] = {}
        self.ids = itertools.count()  # the numbers of this log's lazy values (their tokens in the kept lines)
        self.ahead: list[_Pending] = []  # the logs' values not waited for, oldest first
        self.advanced = 0

    def advance(self, pending: _Pending) -> None:
        """A new log's value: wait for the one :data:`LAG` logs back, emit what was kept up to it."""
        self.advanced += 1
        pending.number = self.advanced
        self.ahead.append(pending)
        while len(self.ahead) > max(1, LAG):
            old = self.ahead.pop(0)
            old.wait()
            # (what was kept before the next log's value refers to values recorded before that one)
            self.flush(upto=old.number)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if any(isinstance(a, str) and _TOKEN.search(a) for a in args):
            self.queue.append(("print", args, kwargs, [], self.advanced))
            return
        self.flush()
        self.print_fn(*args, **kwargs)

    def log_dict(self, metrics: Any, *args: Any, **kwargs: Any) -> None:
        # a dict with a value still to come is kept; so is any other dict while something is kept before it (litgpt's
        # throughput metrics, logged every iteration between the loss's item() and its line: emitting them would
        # first emit, so wait for, everything kept, the host's lead gone)
        if isinstance(metrics, dict) and (self.queue or any(
                isinstance(v, _LazyFloat) or (isinstance(v, torch.Tensor) and v.is_cuda) for v in metrics.values())):
            kept, waits = {}, []
            for k, v in metrics.items():
                if isinstance(v, torch.Tensor):  # its value now (litgpt adds to its token counts in place)
                    if v.is_cuda and v.numel() == 1:
                        v = _Pending(v.detach().reshape(()), self)
                        waits.append(v)
                    else:
                        v = v.detach().clone()
                kept[k] = v
            self.queue.append(("log", (kept, *args), kwargs, waits, self.advanced))
            return
        self.flush()
        self.log_dict_fn(metrics, *args, **kwargs)

    def flush(self, upto: int | None = None) -> None:
        """Emit what was kept (``upto``: only what was kept before log ``upto + 1``'s value), in order."""
        n = len(self.queue) if upto is None else next(
            (i for i, e in enumerate(self.queue) if e[4] > upto), len(self.queue))
        queue, self.queue = self.queue[:n], self.queue[n:]
        for kind, args, kwargs, waits, _ in queue:
            for p in waits:
                p.wait()
            if kind == "print":
                self.print_fn(*(_TOKEN.sub(self._fill, a) if isinstance(a, str) else a for a in args), **kwargs)
            else:
                metrics = {k: (v.value() if isinstance(v, _LazyFloat) else v.host if isinstance(v, _Pending) else v)
                           for k, v in args[0].items()}
                self.log_dict_fn(metrics, *args[1:], **kwargs)
        if not self.queue:
            self.formats.clear()

    def _fill(self, m: re.Match) -> str:
        lazy, spec = self.formats[int(m.group(1))]
        return format(lazy.value(), spec)

    def close(self) -> None:
        for p in self.ahead:
            p.wait()
        self.ahead.clear()
        self.flush()


class RunningMean:
    """torchmetrics' ``RunningMean(window, nan_strategy="warn")`` as litgpt's loops use it (``update`` with a scalar
    tensor, ``compute``), on the device and without reading anything back: ``compute`` gives a :class:`_Pending`
    value. The same float32 arithmetic in the same order as torchmetrics (each window slot holds ``x * 1`` or, for a
    NaN, nothing; the slots summed from the first to the last, then divided by the summed weights)."""

    def __init__(self, window: int, log: DeferredLog) -> None:
        self.window, self.log, self.seen = int(window), log, 0
        self.vals = self.weights = self.nan_seen = None

    def to(self, device: Any) -> RunningMean:
        self.vals = torch.zeros(self.window, dtype=torch.float32, device=device)
        self.weights = torch.zeros(self.window, dtype=torch.float32, device=device)
        self.nan_seen = torch.zeros((), dtype=torch.bool, device=device)
        return self

    def update(self, value: torch.Tensor) -> None:
        if self.vals is None:
            self.to(value.device)
        x = value.detach().to(self.vals.device, torch.float32).reshape(())
        nan = torch.isnan(x)
        slot = self.seen % self.window
        self.vals[slot] = torch.where(nan, torch.zeros_like(x), x * 1.0)
        self.weights[slot] = (~nan).to(torch.float32)
        self.nan_seen = self.nan_seen | nan
        self.seen += 1

    def compute(self) -> _Pending:
        total = torch.zeros((), dtype=torch.float32, device=self.vals.device)
        weight = torch.zeros((), dtype=torch.float32, device=self.vals.device)
        for i in range(self.window):
            total = total + self.vals[i]
            weight = weight + self.weights[i]
        pending = _Pending(total / weight, self.log, self.nan_seen)
        self.nan_seen = torch.zeros_like(self.nan_seen)
        return pending


class RunningMeans:
    """What a recipe's ``RunningMean`` name points to while the ``lit-liger`` command runs it: called as litgpt calls
    torchmetrics' class, a :class:`RunningMean` feeding :attr:`log` while a ``fit`` defers its log (:meth:`deferring`)
    and the arguments are litgpt's (a window, ``sync_on_compute``), else torchmetrics' own (``real``)."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.log: DeferredLog | None = None  # the DeferredLog of the fit running now, else None

    def __call__(self, window: int = 5, sync_on_compute: bool = True, **kwargs: Any) -> Any:
        log = self.log
        if log is None or kwargs.get("nan_strategy", "warn") != "warn" or set(kwargs) - {"nan_strategy"}:
            return self.real(window=window, sync_on_compute=sync_on_compute, **kwargs)
        return RunningMean(window, log)

    @contextlib.contextmanager
    def deferring(self, log: DeferredLog) -> Iterator[DeferredLog]:
        """For the block (litgpt's ``fit``), the running means made feed ``log``."""
        before, self.log = self.log, log
        try:
            yield log
        finally:
            self.log = before


def running_mean_factory(real: Callable[..., Any]) -> RunningMeans:
    """:class:`RunningMeans` over torchmetrics' ``RunningMean`` (``real``)."""
    return RunningMeans(real)
