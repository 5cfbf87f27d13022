"""Python's garbage collector during a training loop (the ``lit-liger`` command's ``fit``).

A training process holds a few hundred thousand Python objects before its first step (torch, Lightning, litgpt, the
model's modules and parameters, the data): a collection of the oldest generation walks them all, 120-150 ms on this
project's CPU machine for a Llama-3.2-1B LoRA model built on the meta device. Python runs one when enough objects have
survived since the last, which in a training loop happens after a few dozen iterations. On several GPUs the process
that collects holds up the others at the next all-reduce: measured on 2 x H200 (Llama-3.2-1B LoRA, litgpt's recipe),
one full collection of 415 ms at iteration 89, every shape already captured; with the objects frozen it took 2.5 ms
(``benchmarks/results/h200x2-2026-11-27g``).

:func:`quiet` collects once and freezes what is alive (``gc.freeze``: later collections skip those objects, which
live for the run anyway) for the loop, unfreezes after it, and times every collection meanwhile
(``gc.callbacks``); :func:`report` says what they cost (rank 0's, and the longest of any process).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

__all__ = ["GcWatch", "quiet", "report"]


class GcWatch:
    """A ``gc.callbacks`` entry: the duration of each collection, by generation."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.frozen = 0  # objects frozen at the start
        self._t0: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.pauses.setdefault(int(info.get("generation", 2)), []).append(time.perf_counter() - self._t0)
            self._t0 = None


@contextlib.contextmanager
def quiet() -> Iterator[GcWatch]:
    """For the block: one collection first, then the surviving objects frozen until the block ends, and every
    collection meanwhile timed."""
    watch = GcWatch()
    gc.collect()
    gc.freeze()
    watch.frozen = gc.get_freeze_count()
    gc.callbacks.append(watch)
    try:
        yield watch
    finally:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(watch)
        gc.unfreeze()


def report(watch: GcWatch, anywhere: float | None = None) -> str | None:
    """One line on the collections the block saw (None where there were none); ``anywhere``: the longest full
    collection of any process (seconds), where several ran."""
    if not any(watch.pauses.values()):
        return None
    full = watch.pauses.get(2, [])
    every = [p for ps in watch.pauses.values() for p in ps]
    how = f"{watch.frozen:,} objects alive at the start frozen (gc.freeze)"
    other = "" if anywhere is None else f"; the longest full collection of any process {anywhere * 1e3:.1f} ms"
    return (f"lit-liger: Python's garbage collector in the training loop: {len(every):,} collections, "
            f"{sum(every) * 1e3:.0f} ms in all; {len(full)} of the oldest generation, the longest "
            f"{max(full, default=0.0) * 1e3:.1f} ms ({how}{other})")
