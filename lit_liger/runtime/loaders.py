"""Data loader worker processes stopped when the code that iterated over them returns, not by the garbage collector.

PyTorch stops the workers of a (non-persistent) ``DataLoader`` iterator in the iterator's ``__del__``: it puts a
``None`` on each worker's index queue and waits up to 5 s (``MP_STATUS_CHECK_INTERVAL``) for each worker to exit,
then terminates it. Where the iterator is freed by its reference count, that takes milliseconds. Where it is part of
a reference cycle, Python's collector frees it, and the collector calls the weak-reference callbacks of the garbage
before any ``__del__``: ``multiprocessing``'s finalizer of each index queue stops the queue's feeder thread first. The
``None`` is then never sent, and every worker costs its full 5 s before PyTorch terminates it. Measured on CPU
(``python -m benchmarks diag loader-cycle``): an iterator of 1, 2 and 4 workers in a cycle, 5.2, 10.2 and 20.3 s in
``gc.collect()``; stopped first by :func:`stop_workers`, 0.01-0.02 s, then 0.2 s to collect.

litgpt's ``fit`` makes exactly that cycle. Its ``save_hyperparameters`` (each intermediate save parses the command
line again with jsonargparse) leaves frames in a cycle that reaches ``fit``'s own frame, so when ``fit`` returns its
locals outlive it, among them the ``CycleIterator`` whose last ``next()`` (the one that found the epochs done) started
the training loader's workers again. The ``lit-liger`` command's end-of-training release collects garbage (the CUDA
graphs' memory) and paid 4 x 5 s there: 20.0 s at the end of every shipped LoRA recipe run with saves, on an H200
(``benchmarks/results/h200-2026-11-29d``). Stock litgpt pays it at whichever collection finds the cycle, or not at
all if the process exits first.

:func:`stop_workers` records the iterators that given loaders make inside a block and stops the workers of those
still running when the block ends, the way their ``__del__`` would have.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

__all__ = ["stop_workers", "torch_loader"]


def torch_loader(loader: Any) -> Any:
    """The ``torch.utils.data.DataLoader`` inside ``loader`` (Fabric's wrapper, lit-liger's ``AfterMove``), or None."""
    from torch.utils.data import DataLoader

    for _ in range(8):
        if isinstance(loader, DataLoader):
            return loader
        inner = vars(loader).get("_dataloader", vars(loader).get("_loader")) if hasattr(loader, "__dict__") else None
        if inner is None:
            return None
        loader = inner
    return None


@contextlib.contextmanager
def stop_workers(*loaders: Any) -> Iterator[list]:
    """For the block: every iterator that one of ``loaders`` (DataLoaders, or wrappers of one; None skipped) makes
    with worker processes is recorded; when the block ends, those still running have their workers stopped
    (PyTorch's own shutdown: each worker sent ``None``, then joined). Loaders with ``persistent_workers`` are left
    alone (their one iterator lives as long as the loader and is reused). Yields the list of the workers' counts
    stopped, filled when the block ends."""
    made: list[weakref.ref] = []
    patched = []
    for loader in {id(dl): dl for dl in map(torch_loader, loaders) if dl is not None}.values():
        if loader.num_workers <= 0 or loader.persistent_workers or "_get_iterator" in vars(loader):
            continue
        make = loader._get_iterator

        def recording(make: Any = make) -> Any:
            it = make()
            if hasattr(it, "_shutdown_workers"):
                made.append(weakref.ref(it))
            return it

        loader._get_iterator = recording  # (an instance attribute over the method: DataLoader.__iter__ calls it)
        patched.append(loader)
    stopped: list[int] = []
    try:
        yield stopped
    finally:
        for loader in patched:
            vars(loader).pop("_get_iterator", None)
        for ref in made:
            it = ref()
            if it is not None and not getattr(it, "_shutdown", True):
                stopped.append(len(getattr(it, "_workers", ())))
                it._shutdown_workers()
