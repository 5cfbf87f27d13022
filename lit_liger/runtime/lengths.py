"""litgpt's pass over the data before training, in parallel (the ``lit-liger`` command).

litgpt's fine-tuning ``fit`` first finds the longest sample of the training and validation sets
(``get_longest_seq_length``, which sets the model's ``max_seq_length``). It reads every sample through its
``SFTDataset``, which tokenizes it three times, in the main process, while the GPU waits. On the H200 machine's CPU that
took 34.8 s for Alpaca's size (52,000 Alpaca-shaped samples, a byte-level BPE of 8,192 tokens), against ~2.7 minutes
for an epoch of Llama-3.2-1B LoRA there at lit-liger's speed; with 16 worker processes, 3.6 s
(``benchmarks/results/h200-2026-11-29d/NOTES.md``).

:func:`sample_lengths` reads the same samples with the same ``__getitem__`` in worker processes (a ``DataLoader`` of
:func:`workers` processes, each returning its chunk's lengths, in order), so the result is the same, sample by sample.
Small data sets stay in the main process (:data:`PARALLEL_MIN`), and so does a platform without the ``fork`` start
method; where the workers fail, litgpt's own pass runs (with a warning).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Sized
from typing import Any

import torch

__all__ = ["LADDER_SAMPLES", "PARALLEL_MIN", "MAX_WORKERS", "longest_seq_length", "sample_lengths", "some_lengths",
           "usable_cpus", "workers"]

#: fewer samples than this are read in the main process, as litgpt does (starting the workers costs ~0.1 s)
PARALLEL_MIN = 2048
#: the most worker processes one training process starts (0 or 1: litgpt's pass, in the main process)
MAX_WORKERS = 16


def _lengths(samples: list[dict]) -> list[int]:
    """(In a worker) the ``input_ids`` lengths of a chunk of samples."""
    return [len(s["input_ids"]) for s in samples]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1


def workers() -> int:
    """The worker processes for this training process: its usable CPUs shared among the node's training processes,
    at most :data:`MAX_WORKERS`."""
    cpus = usable_cpus()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if not local and torch.distributed.is_available() and torch.distributed.is_initialized():
        local = min(torch.distributed.get_world_size(), max(1, torch.cuda.device_count()))
    return max(1, min(MAX_WORKERS, cpus // max(1, local)))


def sample_lengths(data: Any, n_workers: int | None = None) -> list[int] | None:
    """Every sample's ``len(data[i]["input_ids"])``, in order, read by ``n_workers`` worker processes (None:
    :func:`workers`); None where the data stays in the main process (fewer than :data:`PARALLEL_MIN` samples, one
    worker, no ``len``, or no ``fork`` start method). A failure in the workers raises, as it would in the main
    process."""
    n_workers = workers() if n_workers is None else n_workers
    if not isinstance(data, Sized) or len(data) < max(PARALLEL_MIN, 2) or n_workers < 2:
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None  # (the workers would need the data set pickled)
    n = len(data)
    chunk = max(1, math.ceil(n / (4 * n_workers)))  # (4 chunks a worker: the slower ones are waited for less)
    # fork: the workers inherit the data set (nothing pickled), as litgpt's own DataLoaders on Linux
    context = multiprocessing.get_context("fork")
    loader = torch.utils.data.DataLoader(data, batch_size=chunk, num_workers=n_workers, collate_fn=_lengths,
                                         multiprocessing_context=context)
    out: list[int] = []
    for part in loader:
        out.extend(part)
    if len(out) != n:
        raise RuntimeError(f"read {len(out)} lengths of {n} samples")
    return out


#: the samples :func:`some_lengths` reads to fit a packed ladder (``lit_liger.swap.buckets.fit_packed_tops``): ~0.7 s
#: through litgpt's ``SFTDataset`` (~0.7 ms a sample, the measure in this module's docstring)
LADDER_SAMPLES = 1024


def some_lengths(data: Any, n: int = LADDER_SAMPLES, seed: int = 0) -> list[int] | None:
    """``len(data[i]["input_ids"])`` of ``n`` samples drawn at random without replacement (every sample of a smaller
    data set), read in this process; None where ``data`` has no length or a sample is not a mapping with
    ``input_ids``."""
    import random

    if not isinstance(data, Sized) or len(data) == 0:
        return None
    picks = random.Random(seed).sample(range(len(data)), min(n, len(data)))
    out = []
    for i in picks:
        sample = data[i]
        ids = sample.get("input_ids") if isinstance(sample, dict) else None
        if ids is None:
            return None
        out.append(len(ids))
    return out


def _last_line(e: Exception) -> str:
    """An exception in one line: a worker's error re-raised by the DataLoader ends with the original one."""
    lines = str(e).strip().splitlines()
    return (lines[-1] if lines else type(e).__name__)[:200]


def longest_seq_length(fallback: Callable[[Any], tuple[int, int]]) -> Callable[[Any], tuple[int, int]]:
    """litgpt's ``get_longest_seq_length(data) -> (longest, index of its first sample)`` with the samples read by
    :func:`sample_lengths` (said by the first process); ``fallback`` (litgpt's own) where that does not apply or
    fails."""
    from .._dist import rank_zero

    def run(data: Any) -> tuple[int, int]:
        t0, n_workers = time.perf_counter(), workers()
        try:
            lengths = sample_lengths(data, n_workers)
        except Exception as e:  # noqa: BLE001 - litgpt's pass then runs (and raises what the data raises)
            warnings.warn(f"lit-liger: reading the samples' lengths in {n_workers} worker processes failed "
                          f"({_last_line(e)}); litgpt reads them in this process", stacklevel=2)
            lengths = None
        if lengths is None:
            return fallback(data)
        longest = max(lengths)
        if rank_zero():
            print(f"lit-liger: read the lengths of {len(lengths):,} samples (litgpt's pass for the longest) in "
                  f"{time.perf_counter() - t0:.2f} s with {n_workers} worker processes", flush=True)
        return longest, lengths.index(longest)

    return run
