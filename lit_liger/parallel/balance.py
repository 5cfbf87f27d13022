"""The devices' micro-batches dealt by length under lit-liger's replica plan (``LigerConfig.balance_ranks``).

With variable-length data each device's micro-batches take as long as their positions, and the devices meet once per
optimizer step (the gradients' all-reduce): the busiest device sets the step's time and the others wait. litgpt gives
each device its own shard of the data (a ``DistributedSampler`` per rank), so which device runs the long micro-batches
is chance. Measured on 2 x H200 (Llama-3.2-1B full fine-tuning, Alpaca-shaped lengths, two micro-batches per device and
step): 1.7-3.4 ms of each iteration were the faster device waiting (``benchmarks/results/h200x2-2026-11-27b``).

:class:`DealtBatches` is each device's batch sampler in place of litgpt's: it draws the index lists of *every* device
(the samplers litgpt's loaders would have had, one per rank, in lock step: round ``k`` is micro-batch ``k`` of each
device), estimates each micro-batch's positions from its samples' text (:class:`SampleCost`: characters, at a
tokens-per-character ratio measured on a few samples; no tokenization per round), and deals the round: the first round
of each optimizer step as litgpt would (so each step's first micro-batch on each device is litgpt's), each later one
longest first to the device with the fewest positions so far in the step (longest processing time first). Every device
computes the same deal without a collective, and loads only the micro-batch it was dealt (an earlier design that
loaded every device's batches and dealt them by their collated size cost ~1 ms of host time per extra batch: 11% on
LoRA's 12 ms iterations, ``benchmarks/results/h200x2-2026-11-27g``).

Round ``k`` runs at iteration ``k`` on every device, so the micro-batches of each optimizer step are the ones litgpt's
order gives it: the averaged gradient is the same sum of the same micro-batch gradients (only the order of the
floating-point additions changes), and so is every update. What a device logs is its own micro-batches' loss, as
before, of the micro-batches it was dealt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["DealtBatches", "ReplicaBatches", "SampleCost", "balanced_loader", "deal", "expect_lengths"]


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


class SampleCost:
    """The estimated positions of a micro-batch of litgpt's ``SFTDataset`` (its ``data``, ``prompt_style``,
    ``max_seq_length``, ``transform``): each sample's prompt and response characters over a characters-per-token ratio
    measured once on the first :data:`CALIBRATE` samples that litgpt's tokenization leaves whole (of at most 4 times as
    many), capped at ``max_seq_length``; a micro-batch's cost is the sum of its samples' (``packed``: the packed row
    runs them all) or its size times the longest (padded)."""

    CALIBRATE = 32

    def __init__(self, dataset: Any, packed: bool) -> None:
        self.dataset, self.packed = dataset, packed
        self.cap = getattr(dataset, "max_seq_length", -1)
        self._chars_per_token: float | None = None

    @staticmethod
    def usable(dataset: Any) -> bool:
        data = getattr(dataset, "data", None)  # (a list, or random_split's Subset of one: litgpt's JSON data)
        return hasattr(data, "__getitem__") and hasattr(data, "__len__") and hasattr(dataset, "prompt_style")

    def chars(self, i: int) -> int:
        example = self.dataset.data[i]
        if getattr(self.dataset, "transform", None) is not None:
            example = self.dataset.transform(example)
        prompt = self.dataset.prompt_style.apply(prompt=example["instruction"], **example)
        return len(prompt) + len(example["output"])

    def _ratio(self) -> float:
        if self._chars_per_token is None:
            chars = tokens = whole = 0
            for i in range(min(len(self.dataset), 4 * self.CALIBRATE)):  # (the first samples; the data is shuffled)
                n = len(self.dataset[i]["input_ids"])
                if self.cap > 0 and n >= self.cap:
                    continue  # (cut at max_seq_length: its characters overstate it)
                chars, tokens, whole = chars + self.chars(i), tokens + n, whole + 1
                if whole == self.CALIBRATE:
                    break
            self._chars_per_token = chars / tokens if tokens else 4.0
        return self._chars_per_token

    def tokens(self, i: int) -> float:
        n = self.chars(i) / self._ratio()
        return min(n, float(self.cap)) if self.cap > 0 else n

    def __call__(self, indices: list[int]) -> float:
        sizes = [self.tokens(i) for i in indices]
        if not sizes:
            return 0.0
        return sum(sizes) if self.packed else len(sizes) * max(sizes)


class _EpochFanout:
    """A sampler stand-in whose ``set_epoch`` reaches every rank's sampler (Fabric calls it on each new pass)."""

    def __init__(self, samplers: list) -> None:
        self.samplers = samplers

    def set_epoch(self, epoch: int) -> None:
        for s in self.samplers:
            s.set_epoch(epoch)


class DealtBatches:
    """This device's batch sampler: every rank's ``BatchSampler`` in lock step, each round dealt by :func:`deal` on
    ``cost`` (see the module's doc); every ``accumulation``-th round, from the first, opens an optimizer step (litgpt's
    loops count iterations from the first batch of the data: a resumed run reads the batches it had trained on again
    first). Keeps the estimated positions each device ran per step, dealt and in
    litgpt's order, for :meth:`report`."""

    def __init__(self, samplers: list, batch_size: int, drop_last: bool, rank: int, cost: Any,
                 accumulation: int) -> None:
        self.samplers, self.batch_size, self.drop_last, self.rank = samplers, batch_size, drop_last, rank
        self.cost, self.accumulation = cost, max(1, accumulation)
        self.sampler = _EpochFanout(samplers)  # (Fabric's set_epoch finds it)
        self.world = len(samplers)
        self.rounds = 0  # rounds dealt (all passes over the data)
        self.steps = 0  # optimizer steps closed
        self.dealt = 0  # rounds not dealt as litgpt would
        self.busiest = [0.0, 0.0]  # sum over steps of the busiest device's positions: dealt, litgpt's
        self.mean = 0.0  # ... of the devices' mean positions
        self.mine = 0.0  # this device's positions, dealt
        self.total = 0.0  # every device's positions
        self._loads = [0.0] * self.world  # this step's positions per device so far: dealt, litgpt's
        self._natural = [0.0] * self.world

    def _batches(self) -> list:
        from torch.utils.data import BatchSampler

        return [BatchSampler(s, self.batch_size, self.drop_last) for s in self.samplers]

    def __len__(self) -> int:
        return min(len(b) for b in self._batches())

    def _close(self) -> None:
        """Count the step whose rounds were dealt so far (none: nothing), and start the next one's."""
        loads, natural = self._loads, self._natural
        if any(loads):
            self.steps += 1
            self.busiest[0] += max(loads)
            self.busiest[1] += max(natural)
            self.mean += sum(loads) / len(loads)
        self._loads, self._natural = [0.0] * self.world, [0.0] * self.world

    def __iter__(self) -> Iterator[list[int]]:
        for row in zip(*self._batches()):
            first = self.rounds % self.accumulation == 0
            if first:
                self._close()
            costs = [float(self.cost(b)) for b in row]
            pick = deal(costs, self._loads, first)
            for r, i in enumerate(pick):
                self._loads[r] += costs[i]
                self._natural[r] += costs[r]
            self.dealt += pick != list(range(self.world))
            self.mine += costs[pick[self.rank]]
            self.total += sum(costs)
            self.rounds += 1
            yield row[pick[self.rank]]

    def estimated_sizes(self, rounds: int) -> Iterator[list[list[float]]]:
        """Every device's micro-batch of each of the first ``rounds`` rounds of this pass over the data, as its samples'
        estimated tokens (:meth:`SampleCost.tokens`); nothing is dealt or counted (the samplers' order depends on
        their seed and epoch only). For ``lit_liger.runtime.graphs.expected_lengths``."""
        for k, row in enumerate(zip(*self._batches())):
            if k >= rounds:
                return
            yield [[self.cost.tokens(i) for i in batch] for batch in row]

    def report(self) -> str | None:
        """One line on the deal (None before any step): the busiest device's estimated positions per optimizer step
        over the devices' mean, dealt and in litgpt's order, and this device's share."""
        self._close()
        if not self.steps or not self.mean:
            return None
        dealt, litgpt = self.busiest[0] / self.mean - 1, self.busiest[1] / self.mean - 1
        return (f"lit-liger: the devices' micro-batches were dealt by length ({self.dealt:,} of {self.rounds:,} rounds "
                f"changed): per optimizer step the busiest device ran {dealt:.1%} more positions than the devices' "
                f"mean, against {litgpt:.1%} in litgpt's order (estimated from the samples' characters; this device: "
                f"{self.mine / max(self.total, 1):.1%} of them; --liger.balance_ranks false keeps litgpt's order)")


class ReplicaBatches:
    """Every rank's micro-batches of a data loader whose sampler is torch's own ``DistributedSampler`` (what Lightning's
    DDP gives each rank of a Trainer: not dealt), rebuilt from that sampler's seed, epoch and settings, each sample's
    tokens estimated by :class:`SampleCost` (litgpt's ``SFTDataset``): the replicas' expected lengths
    (:func:`expect_lengths`) as the command has them from :class:`DealtBatches`."""

    def __init__(self, loader: Any, world: int) -> None:
        from torch.utils.data import BatchSampler, DistributedSampler

        sampler, dataset = loader.sampler, loader.dataset
        self.cost = SampleCost(dataset, packed=True)
        self.batches = []
        for rank in range(world):
            s = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=sampler.shuffle, seed=sampler.seed,
                                   drop_last=sampler.drop_last)
            s.set_epoch(sampler.epoch)
            self.batches.append(BatchSampler(s, loader.batch_size, loader.drop_last))

    @classmethod
    def of(cls, loader: Any, world: int) -> ReplicaBatches | None:
        """For ``loader`` (a ``DataLoader``) of ``world`` ranks, or None where its sampler is not exactly torch's
        ``DistributedSampler`` of that many ranks (a wrapper of a custom sampler: its order is its own), it has no
        batch size, or its data set is not one :class:`SampleCost` can estimate."""
        from torch.utils.data import DistributedSampler

        sampler = getattr(loader, "sampler", None)
        if type(sampler) is not DistributedSampler or sampler.num_replicas != world or world < 2 \
                or not getattr(loader, "batch_size", None) or not SampleCost.usable(getattr(loader, "dataset", None)):
            return None
        return cls(loader, world)

    def __len__(self) -> int:
        return min(len(b) for b in self.batches)

    def estimated_sizes(self, rounds: int) -> Iterator[list[list[float]]]:
        """As :meth:`DealtBatches.estimated_sizes`: round ``k`` holds micro-batch ``k`` of every rank."""
        for k, row in enumerate(zip(*self.batches)):
            if k >= rounds:
                return
            yield [[self.cost.tokens(i) for i in batch] for batch in row]


def expect_lengths(batches: Any, rounds: float, limit: int) -> dict | None:
    """``ModelState.expected_lengths`` for a run of ``rounds`` micro-batches per process: the packed lengths that
    ``batches`` (:class:`DealtBatches` or :class:`ReplicaBatches`) give each process in their first pass, read for at
    most ``limit`` rounds and scaled to ``rounds``; None where nothing is read (``limit`` 0)."""
    from ..runtime import graphs

    rounds = int(rounds)
    sampled = min(rounds, len(batches), limit)
    if sampled <= 0:
        return None
    cap = batches.cost.cap if isinstance(batches.cost.cap, int) else -1
    return graphs.expected_lengths(batches.estimated_sizes(sampled), cap, rounds / sampled)


def balanced_loader(loader: Any, rank: int, world: int, accumulation: int,
                    packed: bool = True) -> tuple[DealtBatches | None, str]:
    """Fabric's training ``loader`` with its DataLoader (a ``BatchSampler`` over torch's ``DistributedSampler`` of
    ``world`` ranks, as Fabric sets it up, over litgpt's ``SFTDataset``) replaced by one whose batch sampler is a
    :class:`DealtBatches` (returned); None and why not where the loader is not of that shape. The caller puts
    ``loader._dataloader`` back after the run."""
    from torch.utils.data import BatchSampler, DataLoader
    from torch.utils.data.distributed import DistributedSampler

    inner = getattr(loader, "_dataloader", None)
    if not isinstance(inner, DataLoader):
        return None, "the training loader is not Fabric's wrapper of a DataLoader"
    sampler, batches = inner.sampler, inner.batch_sampler
    if type(sampler) is not DistributedSampler or type(batches) is not BatchSampler or \
            sampler.num_replicas != world or sampler.rank != rank:
        return None, "the training DataLoader's sampler is not the DistributedSampler Fabric puts in"
    if not SampleCost.usable(inner.dataset):
        return None, "the training data is not litgpt's SFTDataset (no text to estimate the lengths from)"
    samplers = [sampler if r == rank else DistributedSampler(inner.dataset, num_replicas=world, rank=r,
                                                             shuffle=sampler.shuffle, seed=sampler.seed,
                                                             drop_last=sampler.drop_last)
                for r in range(world)]
    for s in samplers:
        s.set_epoch(sampler.epoch)
    dealt = DealtBatches(samplers, batches.batch_size, batches.drop_last, rank, SampleCost(inner.dataset, packed),
                         accumulation)
    extra = {}
    if inner.num_workers > 0:
        extra = {"prefetch_factor": inner.prefetch_factor, "persistent_workers": inner.persistent_workers}
    loader._dataloader = DataLoader(inner.dataset, batch_sampler=dealt, collate_fn=inner.collate_fn,
                                    num_workers=inner.num_workers, pin_memory=inner.pin_memory, timeout=inner.timeout,
                                    worker_init_fn=inner.worker_init_fn, generator=inner.generator,
                                    multiprocessing_context=inner.multiprocessing_context, **extra)
    return dealt, ""
