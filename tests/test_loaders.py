"""Data loader workers stopped when a block ends (``lit_liger.runtime.loaders``), so that an iterator left in a reference cycle
(as litgpt's ``fit`` leaves its training iterator) never reaches PyTorch's shutdown through the garbage collector,
where each running worker is waited for 5 s and then terminated."""

from __future__ import annotations

import gc
import inspect
import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader

from lit_liger import cli

from lit_liger.runtime import loaders
from lit_liger.runtime.batches import AfterMove

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="forked workers")


class _Range(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        return i


def _loader(workers: int = 2, **kw) -> DataLoader:
    context = multiprocessing.get_context("fork") if workers else None
    return DataLoader(_Range(), batch_size=4, num_workers=workers, multiprocessing_context=context, **kw)


def _exited(it) -> bool:
    return all(not w.is_alive() for w in it._workers)


def test_an_iterator_in_a_cycle_has_its_workers_stopped_cleanly_when_the_block_ends(terminated):
    dl = _loader(2)
    with loaders.stop_workers(dl) as stopped:
        it = iter(dl)
        assert int(next(it)[0]) == 0
        box = {"it": it}
        box["self"] = box  # (what litgpt's fit frame is: alive until a collection)
    assert stopped == [2]
    assert it._shutdown
    # each worker exited on the None it was sent, none terminated after PyTorch's 5 s join timeout
    assert _exited(it) and terminated == []
    assert "_get_iterator" not in vars(dl)  # (the loader as it was)
    del it, box
    gc.collect()


def test_iterators_already_done_or_made_after_the_block_are_left_alone():
    dl = _loader(2)
    with loaders.stop_workers(dl) as stopped:
        assert [int(b[0]) for b in dl] == list(range(0, 64, 4))  # exhausted: PyTorch stopped its workers
    assert stopped == []
    it = iter(dl)
    assert int(next(it)[0]) == 0
    assert not it._shutdown  # (made after the block: not recorded)
    it._shutdown_workers()


def test_persistent_or_workerless_loaders_are_not_touched():
    persistent, inline = _loader(1, persistent_workers=True), _loader(0)
    with loaders.stop_workers(persistent, inline, None) as stopped:
        it = iter(persistent)
        next(it)
        assert "_get_iterator" not in vars(persistent) and "_get_iterator" not in vars(inline)
        assert [int(b[0]) for b in inline][:2] == [0, 4]
    assert stopped == [] and not it._shutdown  # (the loader reuses its one iterator)
    it._shutdown_workers()


def test_the_dataloader_is_found_inside_fabric_and_lit_liger_wrappers():
    from lightning.fabric.wrappers import _FabricDataLoader

    dl = _loader(1)
    assert loaders.torch_loader(AfterMove(_FabricDataLoader(dl))) is dl
    assert loaders.torch_loader(_FabricDataLoader(dl)) is dl
    assert loaders.torch_loader(dl) is dl
    assert loaders.torch_loader([1, 2]) is None and loaders.torch_loader(None) is None
    with loaders.stop_workers(AfterMove(_FabricDataLoader(dl))) as stopped:
        it = iter(AfterMove(_FabricDataLoader(dl)))
        assert int(next(it)[0]) == 0
    assert stopped == [1]
    it.close()


def test_the_cli_fit_wrapper_stops_the_workers_litgpt_s_fit_leaves_running(terminated):
    """litgpt's fit, as the ``lit-liger`` command wraps it: its training iterator's workers, started again by the
    ``next()`` that found the epochs done and kept alive past ``fit`` by a reference cycle, are stopped as it
    returns."""
    from litgpt.utils import CycleIterator

    left: list = []

    def fit(fabric, model, optimizer, train_dataloader, val_dataloader):
        train_iterator = CycleIterator(train_dataloader)
        for _ in range(len(train_dataloader) + 1):  # (one epoch, then the next one's first batch)
            next(train_iterator)
        assert train_iterator.epoch == 1
        for _ in val_dataloader:  # (litgpt's validate: stops after a few batches)
            break
        frame = inspect.currentframe()
        left.append((train_iterator._iterator, frame))  # (a cycle: the frame holds `left`, which holds the frame)
        return {"done": True}

    train, val = _loader(2), _loader(1)
    out = cli._fit_freezing_unoptimized(fit)(None, None, None, train, val)
    assert out == {"done": True}
    it = left[0][0]
    assert it._shutdown and _exited(it) and terminated == []
    assert "_get_iterator" not in vars(train) and "_get_iterator" not in vars(val)
    left.clear()
    gc.collect()
