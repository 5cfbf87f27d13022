"""The devices' micro-batches dealt by length under lit-liger's replica plan (``LigerConfig.balance_ranks``).

With variable-length data each device's micro-batches take as long as their positions, and the devices meet once per
optimizer step (the gradients' all-reduce): the busiest device sets the step's time and the others wait. litgpt gives
each device its own shard of the data (a ``DistributedSampler`` per rank), so which device runs the long micro-batches
is chance. Measured on 2 x H200 (Llama-3.2-1B full fine-tuning, Alpaca-shaped lengths, two micro-batches per device and
step): 1.7-3.4 ms of each iteration were the faster device waiting (``benchmarks/results/h200x2-2026-11-27b``).

:class:`Balanced` replaces, on every device, the training loader with one that reads the micro-batches of *every*
device (the same samplers litgpt's would have had, one per rank, in lock step: round ``k`` is micro-batch ``k`` of each
device), and deals each round's micro-batches to the devices: the first round after an optimizer step as litgpt would
(so each step's first micro-batch on each device is litgpt's), each later one longest first to the device with the
fewest positions so far in this step (longest processing time first). Every device computes the same deal from the same
batches, without a collective.

Round ``k`` runs at iteration ``k`` on every device, so the micro-batches of each optimizer step are the ones litgpt's
order gives it: the averaged gradient is the same sum of the same micro-batch gradients (only the order of the
floating-point additions changes), and so is every update. What a device logs is its own micro-batches' loss, as
before, of the micro-batches it was dealt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["Balanced", "RoundSampler", "balanced_loader", "deal", "positions"]


def deal(costs: list[float], loads: list[float], first: bool) -> list[int]:
    """Which micro-batch of a round each device runs: ``out[rank]`` is an index into ``costs`` (one per device).
    ``first``: litgpt's own (micro-batch ``r`` to device ``r``). Else the costliest micro-batch to the device with the
    least ``loads`` so far, and so on; where two devices' loads are equal, or two micro-batches' costs, their own
    micro-batches stay with them (the loads come out the same). The same on every device."""
    world = len(costs)
    if first or world < 2:
        return list(range(world))
    batches = sorted(range(world), key=lambda i: (-costs[i], i))
    ranks = sorted(range(world), key=lambda r: (loads[r], r))
    out = [0] * world
    for r, i in zip(ranks, batches):
        out[r] = i
    for r in range(world):  # (each swap gives rank r its own micro-batch and leaves every load as it was)
        s = out.index(r)
        if s != r and (loads[s] == loads[r] or costs[out[r]] == costs[r]):
            out[r], out[s] = r, out[r]
    return out


def positions(batch: Any) -> int:
    """The token positions the GPU runs for a collated batch: its packed length where the data loader laid it out
    packed (``lit_liger.packing.host_plan``), else its ``input_ids``' size; 0 where it has none."""
    from .packing import BATCH_KEY

    if isinstance(batch, dict):
        entry = batch.get(BATCH_KEY)
        if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], tuple) and len(entry[1]) > 3:
            return int(entry[1][3])
        idx = batch.get("input_ids")
        if isinstance(idx, torch.Tensor):
            return idx.numel()
    return 0


class _EpochFanout:
    """A sampler stand-in whose ``set_epoch`` reaches every rank's sampler (Fabric calls it on each new pass)."""

    def __init__(self, samplers: list) -> None:
        self.samplers = samplers

    def set_epoch(self, epoch: int) -> None:
        for s in self.samplers:
            s.set_epoch(epoch)


class RoundSampler:
    """A batch sampler over every rank's ``DistributedSampler``: round ``k`` yields micro-batch ``k`` of rank 0, then
    of rank 1, ... (each as ``BatchSampler`` would batch that rank's indices)."""

    def __init__(self, samplers: list, batch_size: int, drop_last: bool) -> None:
        self.samplers, self.batch_size, self.drop_last = samplers, batch_size, drop_last
        self.sampler = _EpochFanout(samplers)

    def _batches(self) -> list:
        from torch.utils.data import BatchSampler

        return [BatchSampler(s, self.batch_size, self.drop_last) for s in self.samplers]

    def __iter__(self) -> Iterator[list[int]]:
        for row in zip(*self._batches()):
            yield from row

    def __len__(self) -> int:
        return min(len(b) for b in self._batches()) * len(self.samplers)


class Balanced:
    """The training data of one device under the replica plan: every device's micro-batches read in rounds, each
    round dealt by :func:`deal` (see the module's doc). ``window()`` counts the optimizer steps' synchronizing
    backwards so far (``ReplicaStrategy.reductions``): a change starts a new step's deal. Keeps the positions each
    device ran per step, dealt and as litgpt would have dealt them, for :meth:`report`."""

    def __init__(self, loader: Any, rank: int, world: int, window: Callable[[], int]) -> None:
        self.loader, self.rank, self.world, self.window = loader, rank, world, window
        self.sampler = loader.batch_sampler.sampler  # (Fabric's set_epoch finds it)
        self.batch_sampler = None
        self.steps = 0  # optimizer steps seen (windows)
        self.dealt = 0  # rounds not dealt as litgpt would
        self.busiest = [0.0, 0.0]  # sum over steps of the busiest device's positions: dealt, litgpt's
        self.mean = 0.0  # ... of the devices' mean positions
        self.mine = 0.0  # this device's positions, dealt
        self.total = 0.0  # every device's positions
        self._loads = [0.0] * world  # this step's positions per device so far: dealt, litgpt's
        self._natural = [0.0] * world
        self._seen: int | None = None  # window() at this step's first round

    def __len__(self) -> int:
        return len(self.loader) // self.world

    def _close(self) -> None:
        """Count the step whose rounds were dealt so far (none: nothing), and start the next one's."""
        loads, natural = self._loads, self._natural
        if any(loads):
            self.steps += 1
            self.busiest[0] += max(loads)
            self.busiest[1] += max(natural)
            self.mean += sum(loads) / len(loads)
        self._loads, self._natural = [0.0] * self.world, [0.0] * self.world

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        while True:
            try:
                batches = [next(it) for _ in range(self.world)]
            except StopIteration:
                return
            now = self.window()
            first = now != self._seen  # (a new pass over the data inside a step goes on with the step's deal)
            if first:
                self._close()
                self._seen = now
            costs = [float(positions(b)) for b in batches]
            pick = deal(costs, self._loads, first)
            for r, i in enumerate(pick):
                self._loads[r] += costs[i]
                self._natural[r] += costs[r]
            self.dealt += pick != list(range(self.world))
            self.mine += costs[pick[self.rank]]
            self.total += sum(costs)
            yield batches[pick[self.rank]]

    def report(self) -> str | None:
        """One line on the deal (None before any step): the busiest device's positions per optimizer step over the
        devices' mean, dealt and in litgpt's order, and this device's share."""
        self._close()
        if not self.steps or not self.mean:
            return None
        dealt, litgpt = self.busiest[0] / self.mean - 1, self.busiest[1] / self.mean - 1
        return (f"lit-liger: the devices' micro-batches were dealt by length ({self.dealt:,} rounds changed): per "
                f"optimizer step the busiest device ran {dealt:.1%} more positions than the devices' mean, against "
                f"{litgpt:.1%} in litgpt's order (this device: {self.mine / max(self.total, 1):.1%} of all positions; "
                "--liger.balance_ranks false keeps litgpt's order)")


def balanced_loader(loader: Any, rank: int, world: int, window: Callable[[], int]) -> tuple[Balanced | None, str]:
    """A :class:`Balanced` for Fabric's training loader ``loader`` (its DataLoader: a ``BatchSampler`` over
    torch's ``DistributedSampler`` of ``world`` ranks, as Fabric sets it up), put in place of that DataLoader; and
    why not (None) where that is not the loader's shape. The caller puts ``loader._dataloader`` back after the run."""
    from torch.utils.data import BatchSampler, DataLoader
    from torch.utils.data.distributed import DistributedSampler

    inner = getattr(loader, "_dataloader", None)
    if not isinstance(inner, DataLoader):
        return None, "the training loader is not Fabric's wrapper of a DataLoader"
    sampler, batches = inner.sampler, inner.batch_sampler
    if type(sampler) is not DistributedSampler or type(batches) is not BatchSampler or \
            sampler.num_replicas != world or sampler.rank != rank:
        return None, "the training DataLoader's sampler is not the DistributedSampler Fabric puts in"
    samplers = [sampler if r == rank else DistributedSampler(inner.dataset, num_replicas=world, rank=r,
                                                             shuffle=sampler.shuffle, seed=sampler.seed,
                                                             drop_last=sampler.drop_last)
                for r in range(world)]
    for s in samplers:
        s.set_epoch(sampler.epoch)
    extra = {}
    if inner.num_workers > 0:  # (as many rounds ahead as litgpt's loader had micro-batches ahead)
        extra = {"prefetch_factor": (inner.prefetch_factor or 2) * world,
                 "persistent_workers": inner.persistent_workers}
    rounds = DataLoader(inner.dataset, batch_sampler=RoundSampler(samplers, batches.batch_size, batches.drop_last),
                        collate_fn=inner.collate_fn, num_workers=inner.num_workers, pin_memory=inner.pin_memory,
                        timeout=inner.timeout, worker_init_fn=inner.worker_init_fn, generator=inner.generator,
                        multiprocessing_context=inner.multiprocessing_context, **extra)
    out = Balanced(rounds, rank, world, window)
    loader._dataloader = out
    return out, ""
