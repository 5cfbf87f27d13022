"""Data-parallel plans of the ``lit-liger`` command on several devices (``LigerConfig.data_parallel``).

litgpt's recipes shard on several devices whatever the model's size: ``finetune_lora`` runs FSDP2 with every Block
recomputed in backward, ``finetune_full`` / ``finetune_adapter*`` FSDP1 (full sharding, every Block recomputed),
``pretrain`` FSDP1 hybrid sharding. For a model that fits one device that costs an all-gather of every weight in
every forward and backward, a second forward per Block, and it turns off what makes lit-liger fast on one device
(CUDA graphs, packing, the deferred log, the fused optimizer all step aside for sharded parameters).

:func:`choose` picks, before litgpt builds its ``Fabric``, the cheapest plan whose training state fits one device
with margin (:data:`MEMORY_FRACTION` of its memory), from the recipe's own arguments (its model config, trainable
parameters, precision, micro-batch and longest sequence):

* ``replicate``: :class:`ReplicaStrategy`, the whole model on every device, no wrapper around it. Each device runs
  exactly what one device runs (graphs, packing, the deferred log, the fused optimizer), and the strategy all-reduces
  the trainable parameters' gradients once per optimizer step, in the backward that litgpt's loop runs outside
  ``fabric.no_backward_sync`` (the accumulation micro-batches reduce nothing): each group of upper Blocks' gradients
  as soon as the backward has passed below them (the swapped GPT's ``grads_ready`` callbacks, on its
  ``lit_liger.swap.state.ModelState``), the rest when it ends, and the optimizer steps in chunks as those all-reduces
  finish;
* ``zero1``: the same replica, with the optimizer's state sharded (ZeRO-1): each device keeps Adam's moments of its
  share of the large parameters only, receives the other devices' gradients of those (point to point,
  :func:`start_owner_reduce`), steps them, and sends them to the others after the step (a clip combines the devices'
  norms).
  Chosen
  where a replica with the whole optimizer state does not fit and one with its share does (Llama-3.1-8B full
  fine-tuning on 80 GB cards). A checkpoint holds the whole optimizer state, as stock's (:meth:`get_optimizer_state`
  gathers it on rank 0);
* ``shard`` (the recipes whose strategy is FSDP1; asked for: ``auto`` names it where it would fit, see :func:`decide`):
  ``FSDPStrategy`` with ``SHARD_GRAD_OP`` (ZeRO-2: gradients and optimizer state sharded, the weights kept gathered
  from forward to backward), Blocks recomputed only where the estimate says they must be;
* ``litgpt``: the recipe's own strategy, unchanged.

The plan, why, and the flag that keeps litgpt's strategy are printed once. Checkpoints keep litgpt's format (the
replica's ``state_dict`` is the module's own; FSDP writes full state dicts as litgpt asks). Lightning launches the
processes and owns the process group; the replica calls ``torch.distributed`` collectives on it only.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..runtime.memplan import kept_bytes_per_token

__all__ = ["MEMORY_FRACTION", "Estimate", "Plan", "ReplicaStrategy", "choose", "decide", "estimate", "finish_reduce",
           "gather_optimizer_state", "grad_segments", "optimizer_owners", "reduce_gradients", "replica_class",
           "start_owner_reduce", "start_reduce", "strategy_factory"]

#: the share of a device's memory that a plan's estimated training state may fill (the rest: the CUDA context,
#: NCCL's buffers, the allocator's fragmentation, CUDA graphs' pools, the estimate's own error)
MEMORY_FRACTION = 0.8
#: fixed overhead per device beside the estimate's terms (bytes)
OVERHEAD = 1.5 * 2**30
#: litgpt's recipe modules -> the name of the strategy class their ``setup`` builds for several devices
STRATEGY_NAMES = {
    "litgpt.finetune.lora": "ModelParallelStrategy",
    "litgpt.finetune.adapter": "FSDPStrategy",
    "litgpt.finetune.adapter_v2": "FSDPStrategy",
    "litgpt.finetune.full": "FSDPStrategy",
    "litgpt.pretrain": "FSDPStrategy",
}
KEEP = "--liger.data_parallel litgpt"
#: the sequence length a plan assumes where the recipe sets no ``--train.max_seq_length`` (litgpt then trains on the
#: data's longest sample, known only once the data is prepared in each process); said in the log
ASSUMED_SEQ = 2048


@dataclass
class Estimate:
    """Bytes per device of one training state: the terms a plan divides differently."""

    weights: float  # every parameter, in its training dtype
    grads: float  # the trainable parameters' gradients
    optimizer: float  # Adam's two moments of the trainable parameters
    activations: float  # what one micro-batch keeps for backward (and the fused loss's buffers)
    recompute: float  # activations with every Block recomputed in backward (one Block's and the Block inputs)
    device: float  # the device's memory

    def replicated(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + OVERHEAD

    def zero1(self, world: int) -> float:
        """A replica whose optimizer state is split between the ``world`` devices (``zero1``), with the buffers that
        receive the other ranks' gradients of the parameters this rank steps (:func:`start_owner_reduce`): at most
        two groups of them at once (the segment whose backward just ended and the one before; the last group, the
        embedding, lm_head and lowest Blocks, until the step), counted as half of them."""
        recv = self.grads * (world - 1) / world / 2
        return self.weights + self.grads + self.optimizer / world + recv + self.activations + OVERHEAD

    def zero2(self, world: int, checkpoint: bool, accumulating: bool = True) -> float:
        """FSDP ``SHARD_GRAD_OP``: the weights gathered through forward and backward beside this rank's shard,
        optimizer state sharded; gradients sharded, but whole while micro-batches accumulate (litgpt's loop runs them
        in ``no_backward_sync``: FSDP1 keeps unsharded gradients until the synchronizing backward)."""
        act = self.recompute if checkpoint else self.activations
        grads = self.grads if accumulating else self.grads / world
        return self.weights * (1 + 1 / world) + grads + self.optimizer / world + act + OVERHEAD

    @property
    def budget(self) -> float:
        return MEMORY_FRACTION * self.device


@dataclass
class Plan:
    name: str  # "replicate" | "zero1" | "shard" | "litgpt"
    why: str
    checkpoint: bool = False  # ("shard") every Block recomputed in backward
    estimate: Estimate | None = field(default=None, repr=False)

    def line(self, recipe: str, devices: int) -> str:
        what = {"replicate": "the whole model on every device (lit-liger's ReplicaStrategy: graphs, packing and the "
                             "fused optimizer on each; gradients all-reduced once per optimizer step)",
                "zero1": "the whole model on every device, the optimizer's state sharded across them (ZeRO-1: "
                         "lit-liger's ReplicaStrategy, graphs, packing and the fused optimizer on each; gradients "
                         "sent once per optimizer step to the device that steps them; each device steps its share "
                         "of the parameters and sends it to the others)",
                "shard": "FSDP SHARD_GRAD_OP (ZeRO-2: gradients and optimizer state sharded, weights gathered from "
                         "forward to backward" + (", every Block recomputed" if self.checkpoint else
                                                  ", no Block recomputed") + ")",
                "litgpt": "litgpt's own strategy"}[self.name]
        return f"lit-liger: data parallel on {devices} devices, {recipe}: {what}; {self.why}. {KEEP} keeps litgpt's"


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"


def estimate(config: Any, n_params: int, n_trainable: int, param_bytes: int, micro_batch: int, seq_len: int,
             device_bytes: float, trains_head: bool) -> Estimate:
    """The terms of :class:`Estimate` for a LitGPT ``config`` (its widths), ``n_params`` parameters of which
    ``n_trainable`` train, stored in ``param_bytes`` bytes each, ``micro_batch`` x ``seq_len`` tokens per step."""
    tokens = micro_batch * seq_len
    per_layer = kept_bytes_per_token(config, 2)  # (lit_liger.runtime.memplan: the one estimate of a Block's activations)
    act = tokens * config.n_layer * per_layer
    # the fused loss: a chunk of logits in fp32 and, where lm_head trains, its fp32 weight-gradient buffer
    vocab = getattr(config, "padded_vocab_size", None) or config.vocab_size
    loss = min(tokens, 8192) * vocab * 4 + (vocab * config.n_embd * 4 if trains_head else 0)
    recompute = tokens * config.n_embd * 2 * config.n_layer + tokens * per_layer
    return Estimate(weights=n_params * param_bytes, grads=n_trainable * param_bytes,
                    optimizer=2 * n_trainable * param_bytes, activations=act + loss, recompute=recompute + loss,
                    device=device_bytes)


def decide(est: Estimate, world: int, can_shard: bool) -> Plan:
    """The plan for a training state ``est`` on ``world`` devices (``can_shard``: the recipe's strategy is FSDP1,
    which ``shard`` replaces).

    Where a replica does not fit and ZeRO-2 would, ``auto`` keeps litgpt's strategy and names ``--liger.data_parallel
    shard`` in the log: that plan is CPU-tested (its strategy, its estimate) and has run on GPUs once, at a size where
    a replica fits (Llama-3.2-1B full fine-tuning on 2 x H200, no Block recomputed: it trains, 0.29x the replica's
    speed, ``benchmarks/results/h200x2-2026-11-27g``), never where ``auto`` would pick it (Llama-3.1-8B-class full
    fine-tuning on 80 GB cards, Blocks recomputed)."""
    need = est.replicated()
    if need <= est.budget:
        return Plan("replicate", f"its training state fits one device (estimated {_gib(need)} of {_gib(est.device)})",
                    estimate=est)
    over = f"a replica needs about {_gib(need)} of {_gib(est.device)}"
    z1 = est.zero1(world)
    if z1 <= est.budget:
        return Plan("zero1", f"{over}; with the optimizer state sharded {_gib(z1)}", estimate=est)
    if can_shard:
        for checkpoint in (False, True):
            z2 = est.zero2(world, checkpoint)
            if z2 <= est.budget:
                how = "with" if checkpoint else "without"
                return Plan("litgpt", f"{over}; ZeRO-2 {how} recomputed Blocks would fit ({_gib(z2)}: "
                                      "--liger.data_parallel shard, not yet measured on GPUs at this size)",
                            estimate=est)
    return Plan("litgpt", f"{over}, and no lighter plan fits", estimate=est)


def _device_bytes(accelerator: str) -> float:
    """The memory of one device of this run: the GPU's (the first visible one; the devices of a run are alike),
    else the host's split between ``LOCAL_WORLD_SIZE`` processes (CPU runs, tests)."""
    if accelerator != "cpu" and torch.cuda.is_available():
        from ..runtime.memplan import _total_memory

        return float(_total_memory(torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))))
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no sysconf
        host = 64 * 2**30
    return float(host)


def _param_bytes(precision: str | None) -> int:
    if precision is None:
        from litgpt.utils import get_default_supported_precision

        precision = get_default_supported_precision(training=True)
    return 2 if precision in ("bf16-true", "16-true") else 4


def _recipe_config(module: Any, args: dict) -> Any:
    """The model config the recipe's ``setup`` builds from its arguments."""
    if module.__name__ == "litgpt.pretrain":
        cfg = args.get("model_config")
        if cfg is None:
            cfg = module.Config.from_name(args["model_name"])
        return cfg
    ckpt = Path(args["checkpoint_dir"])
    if not (ckpt / "model_config.yaml").is_file() and (Path("checkpoints") / ckpt / "model_config.yaml").is_file():
        ckpt = Path("checkpoints") / ckpt  # (a model name: litgpt's auto_download_checkpoint resolves it so)
    extra = {k: v for k, v in args.items() if k.startswith("lora_")}
    return module.Config.from_file(ckpt / "model_config.yaml", **extra)


def _count(module: Any, gpt_class: type, config: Any) -> tuple[int, int, bool]:
    """(parameters, trainable parameters, whether lm_head trains) of the recipe's model, built on the meta device."""
    with torch.device("meta"):
        model = gpt_class(config)
    mark = next((f for n, f in vars(module).items() if n.startswith("mark_only_") and callable(f)), None)
    if mark is not None:
        mark(model)
    seen, total, trained = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trained += p.numel() if p.requires_grad else 0
    head = getattr(model, "lm_head", None)
    # the (V, C) weight trains (not only a LoRA update on it, whose gradients are (r, C) and (V, r))
    weight = getattr(getattr(head, "linear", head), "weight", None)
    trains_head = bool(weight is not None and weight.requires_grad)
    return total, trained, trains_head


def choose(module: Any, args: dict, setting: str) -> tuple[Plan, int] | None:
    """The plan for a run of the recipe ``module`` with the bound ``setup`` arguments ``args`` and
    ``LigerConfig.data_parallel`` = ``setting``, and its number of devices; None for a one-device run or a module
    that is not one of litgpt's recipes."""
    from litgpt.utils import parse_devices

    if module.__name__ not in STRATEGY_NAMES:
        return None
    devices = parse_devices(args.get("devices", 1)) * int(args.get("num_nodes", 1) or 1)
    if devices <= 1:
        return None
    if setting == "litgpt":
        return Plan("litgpt", "as asked (--liger.data_parallel litgpt)"), devices
    if args.get("quantize"):
        return Plan("litgpt", "a quantized model (litgpt stops there on several devices)"), devices
    can_shard = STRATEGY_NAMES[module.__name__] == "FSDPStrategy"
    try:
        config = _recipe_config(module, args)
        train = args.get("train")
        mb = int(getattr(train, "micro_batch_size", 1) or 1)
        asked = getattr(train, "max_seq_length", None)
        seq = min(int(asked or ASSUMED_SEQ), config.block_size)
        n, trained, head = _count(module, module.GPT, config)
        accelerator = "cpu" if not torch.cuda.is_available() else "cuda"
        est = estimate(config, n, trained, _param_bytes(args.get("precision")), mb, seq, _device_bytes(accelerator),
                       head)
    except Exception as err:  # noqa: BLE001 - any failure to size the model keeps litgpt's plan, said in the log
        if setting in ("replicate", "zero1"):
            return Plan(setting, f"as asked (the model could not be sized: {err})"), devices
        return Plan("litgpt", f"the model could not be sized ({type(err).__name__}: {err})"), devices
    if setting == "replicate":
        return Plan("replicate", f"as asked (estimated {_gib(est.replicated())} of {_gib(est.device)})",
                    estimate=est), devices
    if setting == "zero1":
        return Plan("zero1", f"as asked (estimated {_gib(est.zero1(devices))} of {_gib(est.device)})",
                    estimate=est), devices
    if setting == "shard":
        if not can_shard:
            return Plan("litgpt", "shard: this recipe's own strategy already shards (FSDP2)", estimate=est), devices
        checkpoint = est.zero2(devices, False) > est.budget
        return Plan("shard", "as asked", checkpoint=checkpoint, estimate=est), devices
    plan = decide(est, devices, can_shard)
    plan.why += f" at micro-batch {mb} x {seq} tokens" + ("" if asked else
                                                          f" (no --train.max_seq_length: {ASSUMED_SEQ} assumed)")
    return plan, devices


def strategy_factory(module_name: str, original: type, plan: Plan) -> type:
    """What the recipe's strategy class name points to for ``plan``: a class (litgpt's ``pretrain`` checks
    ``isinstance(fabric.strategy, FSDPStrategy)``) whose construction returns the plan's strategy, whatever
    arguments litgpt passes; ``isinstance`` against it means ``isinstance`` against ``original``."""

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if plan.name in ("replicate", "zero1"):
            return replica_class()(shard_optimizer=plan.name == "zero1")
        if plan.name == "shard":
            from lightning.fabric.strategies import FSDPStrategy

            from litgpt.model import Block

            return FSDPStrategy(auto_wrap_policy={Block}, sharding_strategy="SHARD_GRAD_OP", state_dict_type="full",
                                limit_all_gathers=True, cpu_offload=False,
                                **({"activation_checkpointing_policy": {Block}} if plan.checkpoint else {}))
        return original(*args, **kwargs)

    class _Meta(type):  # (not a subclass of litgpt's class: Lightning's strategies are ABCs, whose subclass
        def __instancecheck__(cls, obj: Any) -> bool:  # checks would come back here)
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, original)

    return _Meta(original.__name__, (), {"__new__": __new__, "__module__": module_name,
                                         "__qualname__": original.__qualname__, "__doc__": original.__doc__})


# ----------------------------------------------------------------------------------------------
# The replica
# ----------------------------------------------------------------------------------------------
def _unique_trainable(modules: list[torch.nn.Module]) -> list[torch.nn.Parameter]:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


#: gradients smaller than this (elements) are all-reduced together, through one flat buffer per dtype
SMALL = 1 << 16


def start_reduce(params: list[torch.nn.Parameter], group: Any = None) -> list:
    """Start averaging the ``.grad`` of ``params`` over the processes of ``group`` (default: the world), in place and
    asynchronously (NCCL runs beside the work queued after); :func:`finish_reduce` waits for it. A parameter without a
    gradient gets zeros first, so that every rank issues the same collectives in the same order (the parameters'
    order). Large gradients are reduced in place, one collective each; small ones through one flat buffer per dtype.
    Returns the pending work: ``(work, flat buffer or None, its gradients, the parameters)`` per collective, in the
    order issued."""
    import torch.distributed as dist

    if not params or dist.get_world_size(group) == 1:
        return []
    world = dist.get_world_size(group)
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    nccl = dist.get_backend(group) == "nccl"
    op = dist.ReduceOp.AVG if nccl else dist.ReduceOp.SUM
    if not nccl:  # (gloo has no average: divide first, as DDP's default hook does)
        torch._foreach_div_(grads, float(world))
    pending = []
    small: dict[torch.dtype, list[tuple[torch.Tensor, torch.nn.Parameter]]] = {}
    for p, g in zip(params, grads):
        if g.numel() < SMALL or not g.is_contiguous():
            small.setdefault(g.dtype, []).append((g, p))
        else:
            pending.append((dist.all_reduce(g, op=op, group=group, async_op=True), None, None, [p]))
    for pairs in small.values():
        tensors = [g for g, _ in pairs]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        pending.append((dist.all_reduce(flat, op=op, group=group, async_op=True), flat, tensors,
                        [p for _, p in pairs]))
    return pending


def start_owner_reduce(params: list[torch.nn.Parameter], owners: dict[int, int], group: Any = None) -> list:
    """``zero1``: start averaging each of ``params``' ``.grad`` into the rank that steps it (``owners``: ``id(p)`` ->
    rank) by point-to-point sends: each rank sends the gradients it does not step to their owner and receives the
    other ranks' gradients of those it steps into new buffers, every send and receive of the call in one batch (on 2
    GPUs both directions of the link carry half of the gradients at once, where an all-reduce moves each byte twice).
    The other ranks' gradients of a parameter are then stale here: only its owner steps it. A parameter without a
    gradient gets zeros first (the same messages on every rank). Returns the pending work, one entry for
    :func:`finish_reduce`: ``(works, "owner", [(gradient, receive buffers)], params)``."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if not params or world == 1:
        return []
    ops, mine = [], []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        owner = owners[id(p)]
        if owner == rank:
            bufs = [torch.empty_like(p.grad) for _ in range(world - 1)]
            peers = [r for r in range(world) if r != rank]
            ops += [dist.P2POp(dist.irecv, b, peer, group) for b, peer in zip(bufs, peers)]
            mine.append((p.grad, bufs))
        else:
            ops.append(dist.P2POp(dist.isend, p.grad, owner, group))
    if dist.get_backend(group) == "nccl":
        works = dist.batch_isend_irecv(ops)
    else:  # (gloo: one by one; each rank's sends and receives to a peer are in the same order)
        works = [op.op(op.tensor, op.peer, op.group) for op in ops]
    return [(works, "owner", mine, list(params))]


def _finish_owner(works: list, mine: list) -> None:
    for work in works:
        work.wait()
    if not mine:
        return
    grads, peers = [g for g, _ in mine], len(mine[0][1])
    if peers == 1:  # (2 ranks: the mean of two in one pass over them, rounded once)
        torch._foreach_lerp_(grads, [bufs[0] for _, bufs in mine], 0.5)
    else:
        for j in range(peers):
            torch._foreach_add_(grads, [bufs[j] for _, bufs in mine])
        torch._foreach_div_(grads, float(peers + 1))
    for _, bufs in mine:
        bufs.clear()  # (their memory goes back once the stream has read them)


def finish_reduce(pending: list) -> int:
    """Wait for :func:`start_reduce`'s (and :func:`start_owner_reduce`'s) work (the current stream waits; the host
    does not), copy the flat buffers back and add the received gradients. Returns the number of collectives."""
    for work, flat, tensors, _ in pending:
        if flat == "owner":
            _finish_owner(work, tensors)
            continue
        work.wait()
        if flat is not None:
            pieces = torch.split(flat, [t.numel() for t in tensors])
            torch._foreach_copy_(tensors, [piece.view(t.shape) for piece, t in zip(pieces, tensors)])
    return len(pending)


def reduce_gradients(params: list[torch.nn.Parameter], group: Any = None) -> int:
    """Average the ``.grad`` of ``params`` over the processes of ``group`` (:func:`start_reduce` then
    :func:`finish_reduce`). Returns the number of collectives."""
    return finish_reduce(start_reduce(params, group))


def optimizer_owners(params: list[torch.Tensor], world: int, min_numel: int = SMALL) -> dict[int, int]:
    """``zero1``: which rank steps each parameter (``id(p)`` -> rank): the parameters of at least ``min_numel``
    elements, largest first, each to the rank with the fewest elements so far (ties: the lowest rank). Smaller ones
    are left out: every rank steps them (their state is small, and a broadcast each would cost more than it saves).
    The same on every rank for the same parameters."""
    load = [0] * world
    out: dict[int, int] = {}
    order = sorted(range(len(params)), key=lambda i: (-params[i].numel(), i))
    for i in order:
        p = params[i]
        if id(p) in out or p.numel() < min_numel or not p.is_contiguous():
            continue
        rank = min(range(world), key=lambda r: (load[r], r))
        out[id(p)] = rank
        load[rank] += p.numel()
    return out


def _optimizer_params(optimizer: Any) -> list[torch.Tensor]:
    seen, out = set(), []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


#: the replica's optimizer step runs in this many chunks of the parameters (by elements; in the order of the last
#: backward's reductions, else the optimizer's), each chunk once its gradients are reduced; zero1: each chunk's
#: parameters sent to the other devices beside the next chunk's step
ZERO1_CHUNKS = 4
#: the optimizers ``zero1`` shards: each parameter's update reads its own gradient and state only, so that hiding the
#: other ranks' gradients for a step (and stepping in chunks) leaves every update as it was
PER_PARAMETER = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "Adadelta")


def _chunks(params: list[torch.Tensor], n: int) -> list[list[torch.Tensor]]:
    """``params`` in order, cut into at most ``n`` runs of about equal elements."""
    total = sum(p.numel() for p in params) or 1
    out: list[list[torch.Tensor]] = [[]]
    seen = 0
    for p in params:
        if out[-1] and seen >= total * len(out) / n:
            out.append([])
        out[-1].append(p)
        seen += p.numel()
    return out


def _per_parameter(optimizer: Any) -> bool:
    """``optimizer`` is one of ``torch.optim``'s :data:`PER_PARAMETER` optimizers."""
    return type(optimizer).__module__.startswith("torch.optim") and type(optimizer).__name__ in PER_PARAMETER


def _step_chunks(params: list[torch.Tensor], pending: list, n: int) -> list[tuple[list, list[torch.Tensor]]]:
    """The optimizer step's chunks, ``(the all-reduces to wait for, the parameters to step)``: :func:`start_reduce`'s
    ``pending`` work in the order issued, cut into at most ``n`` runs of about equal elements of ``params`` (the
    optimizer's), each with the parameters its work reduced; the parameters no work covers step in the first chunk.
    With nothing pending, ``params`` in order, cut the same way (:func:`_chunks`)."""
    if not pending:
        return [([], chunk) for chunk in _chunks(params, n)]
    wanted = {id(p): p for p in params}
    covered: set[int] = set()
    sizes = []
    for entry in pending:
        mine = [p for p in entry[3] if id(p) in wanted and id(p) not in covered]
        covered.update(id(p) for p in mine)
        sizes.append((entry, mine))
    rest = [p for p in params if id(p) not in covered]
    total = sum(p.numel() for _, mine in sizes for p in mine) or 1
    out: list[tuple[list, list[torch.Tensor]]] = [([], rest)]
    seen = 0
    for entry, mine in sizes:
        if out[-1][0] and seen >= total * len(out) / n:
            out.append(([], []))
        out[-1][0].append(entry)
        out[-1][1].extend(mine)
        seen += sum(p.numel() for p in mine)
    return out


def _drop_others_state(optimizer: Any, owners: dict[int, int], rank: int) -> None:
    """Forget the optimizer state of the parameters another rank steps (after a checkpoint's whole state loads)."""
    for p in _optimizer_params(optimizer):
        if owners.get(id(p), rank) != rank:
            optimizer.state.pop(p, None)


def gather_optimizer_state(optimizer: Any, owners: dict[int, int], group: Any = None) -> dict:
    """``zero1``: ``optimizer.state_dict()`` with every parameter's state, on rank 0 (``{}`` on the others): each
    owner's entries are broadcast tensor by tensor (on the parameter's device, which the process group's backend
    reaches) and held on the host for the state dict, then forgotten again. A collective: every rank calls it."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    params = _optimizer_params(optimizer)
    mine = {}
    for i, p in enumerate(params):
        if owners.get(id(p)) == rank and optimizer.state.get(p):
            mine[i] = {k: ("tensor", tuple(v.shape), v.dtype, v.device.type) if isinstance(v, torch.Tensor)
                       else ("value", v) for k, v in optimizer.state[p].items()}
    metas: list = [None] * world
    dist.all_gather_object(metas, mine, group=group)
    added = []
    for i, p in enumerate(params):
        owner = owners.get(id(p))
        if owner is None or i not in metas[owner]:
            continue
        entry = {}
        for key, meta in metas[owner][i].items():
            if meta[0] == "value":
                entry[key] = meta[1]
                continue
            _, shape, dtype, where = meta
            if rank == owner:
                t = optimizer.state[p][key].to(p.device)
            else:
                t = torch.empty(shape, dtype=dtype, device=p.device)
            dist.broadcast(t, src=owner, group=group)
            entry[key] = t.to("cpu") if where == "cpu" or rank == 0 else t
        if rank == 0 and owner != 0:
            optimizer.state[p] = entry
            added.append(p)
    if rank != 0:
        return {}
    try:
        return optimizer.state_dict()
    finally:
        for p in added:
            optimizer.state.pop(p, None)


def grad_segments(gpt: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """The trainable parameters of a swapped GPT by segment of its ``grads_ready`` callbacks: ``[0]`` outside the
    Blocks, embedding and ``ln_f`` (the lm_head: no callback, reduced when backward ends); ``[j]`` the Blocks from
    ``segment_cuts[j - 1]`` up to the previous cut (``ln_f`` in ``[1]``); the last, the lowest Blocks and the
    embedding (reduced when backward ends). A parameter under several names (a tied lm_head) belongs to the latest of
    its segments."""
    from .. import _dist

    cuts = _dist.segment_cuts(gpt)
    last = len(cuts) + 1
    where: dict[int, int] = {}
    params: dict[int, torch.nn.Parameter] = {}
    for name, p in gpt.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            where[id(p)] = max(where.get(id(p), -1), _dist.segment_of(name, cuts))
            params[id(p)] = p
    out: list[list[torch.nn.Parameter]] = [[] for _ in range(last + 1)]
    for key, p in params.items():
        out[where[key]].append(p)
    return out


def _swapped_gpts(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The GPTs inside ``module`` that ``apply_liger`` swapped (their backward calls the ``grads_ready`` callbacks)."""
    from litgpt.model import GPT

    from ..swap.adapter import is_swapped

    return [m for m in module.modules() if isinstance(m, GPT) and is_swapped(m)]


def _strategy_base() -> type:
    from lightning.fabric.strategies import DDPStrategy

    return DDPStrategy


class _ReplicaSync:
    """Fabric's backward-sync control for :class:`ReplicaStrategy`: ``fabric.no_backward_sync(model, enabled)``
    marks the backward inside as an accumulation micro-batch (its gradients are not reduced)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    @contextlib.contextmanager
    def no_backward_sync(self, module: torch.nn.Module, enabled: bool) -> Iterator[None]:
        before = self.strategy.accumulating
        self.strategy.accumulating = bool(enabled)
        try:
            yield
        finally:
            self.strategy.accumulating = before


def _make_replica_class() -> type:
    DDPStrategy = _strategy_base()

    class ReplicaStrategy(DDPStrategy):
        """Lightning Fabric's ``DDPStrategy`` without the ``DistributedDataParallel`` wrapper: every process holds the
        whole model (built with real initialization, then broadcast from rank 0, as DDP does), runs it as one
        device would, and after each backward outside ``fabric.no_backward_sync`` the trainable parameters'
        gradients are averaged over the processes (:func:`reduce_gradients`). The processes, the process group,
        ``all_reduce`` / ``barrier`` / ``broadcast`` and checkpoints (rank 0 writes the module's own
        ``state_dict``) are DDPStrategy's."""

        def __init__(self, shard_optimizer: bool = False, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.shard_optimizer = shard_optimizer  # ``zero1``: each rank steps (and keeps the state of) its share
            self.own_min = SMALL  # (zero1) parameters smaller than this are stepped by every rank
            self.owners: dict[int, int] = {}  # (zero1) id(parameter) -> the rank that steps it
            self.broadcasts = 0  # (zero1) optimizer steps followed by the owners' broadcast
            self.accumulating = False
            self._backward_sync_control = _ReplicaSync(self)
            self._modules: list[torch.nn.Module] = []
            self.reductions = 0  # synchronizing backwards
            self.early = 0  # segments whose all-reduce started during a backward
            self._pending: list = []  # all-reduces started in this backward
            self._unfinished: list = []  # ... and left to the optimizer step (after the backward)
            self.split_steps = 0  # optimizer steps taken in chunks
            self._started: set[int] = set()
            self._segments: dict[int, list] = {}
            self._marked: list = []  # the ModelStates of the swapped GPTs set up here (marked as replicas)

        def module_init_context(self, empty_init: bool | None = None) -> Any:
            # litgpt asks for empty_init on several devices (FSDP materializes its meta tensors later); a replica's
            # parameters that the checkpoint does not hold (LoRA, adapters) need their initialization
            return super().module_init_context(empty_init=False)

        def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
            """Rank 0's parameters and buffers broadcast to the others; each swapped GPT inside marked as a replica
            (``ModelState.replica``: what runs on one device runs on each as it is) with :meth:`_ready` among its
            ``grads_ready`` callbacks (its upper segments' all-reduces start under its backward)."""
            import torch.distributed as dist

            from ..swap.state import state_of

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                with torch.no_grad():
                    seen = set()
                    for t in [*module.parameters(), *module.buffers()]:
                        if id(t) in seen or t.device.type == "meta":
                            continue
                        seen.add(id(t))
                        dist.broadcast(t.data, src=0)
            self._modules.append(module)
            for gpt in _swapped_gpts(module):
                state = state_of(gpt)
                state.replica = True
                if self._ready not in state.grads_ready:
                    state.grads_ready.append(self._ready)
                if state not in self._marked:
                    self._marked.append(state)
            return module

        def _rank_world(self) -> tuple[int, int]:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
            return 0, 1

        def setup_optimizer(self, optimizer: Any) -> Any:
            """``zero1``: decide which rank steps each parameter of ``optimizer``; a checkpoint's optimizer state loaded
            into it later keeps only this rank's share."""
            optimizer = super().setup_optimizer(optimizer)
            rank, world = self._rank_world()
            inner = getattr(optimizer, "optimizer", optimizer)
            why = None
            if not _per_parameter(inner):
                why = (f"{type(inner).__name__} is not one of torch.optim's optimizers known to update each parameter "
                       "from its own gradient alone")
            elif getattr(self.precision, "scaler", None) is not None:
                why = "a gradient scaler (16-mixed) skips steps by every gradient, which one device no longer sees"
            if self.shard_optimizer and world > 1 and why is not None:
                if rank == 0:
                    print(f"lit-liger: zero1: {why}; the optimizer's state stays whole on every device", flush=True)
            elif self.shard_optimizer and world > 1:
                params = _optimizer_params(optimizer)
                # (a model so small that every parameter is under own_min still shards its larger ones: tests)
                least = min(self.own_min, max(1, sum(p.numel() for p in params) // 64))
                owners = optimizer_owners(params, world, least)
                self.owners.update(owners)
                if rank == 0:
                    share = [sum(p.numel() for p in params if owners.get(id(p)) == r) for r in range(world)]
                    total = sum(p.numel() for p in params)
                    print(f"lit-liger: zero1: {len(owners)} of {len(params)} parameters stepped by one device each "
                          f"(elements per device {', '.join(f'{n / total:.0%}' for n in share)} of {total:,}); the "
                          f"other {len(params) - len(owners)} (small) by every device", flush=True)
                optimizer.register_load_state_dict_post_hook(
                    lambda opt: _drop_others_state(opt, self.owners, self._rank_world()[0]))
                _drop_others_state(optimizer, self.owners, rank)
            return optimizer

        def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
            """The step of the gradients the last synchronizing backward reduced, in :data:`ZERO1_CHUNKS` chunks in
            the order their all-reduces were issued: each chunk steps once its own all-reduces are done, so the step
            of the Blocks reduced under the backward runs beside the all-reduce of the gradients that are final only
            when backward ends (the lm_head, the lowest Blocks, the embedding). That needs an optimizer
            :data:`PER_PARAMETER` of ``torch.optim`` without a closure; otherwise the gradients are all reduced first
            and the optimizer steps once. ``zero1``: each chunk steps this rank's share only (the other parameters'
            gradients are hidden from it for the step), then sends each of its parameters from the rank that stepped
            it to the others (:meth:`_share_stepped`), beside the next chunk's step."""
            pending, self._unfinished = self._unfinished, []
            inner = getattr(optimizer, "optimizer", optimizer)
            split = not kwargs and _per_parameter(inner) and (bool(self.owners) or bool(pending))
            if not split:
                finish_reduce(pending)
                if not self.owners or kwargs:  # (a closure runs once: zero1 then steps every parameter)
                    return super().optimizer_step(optimizer, **kwargs)
            rank, _ = self._rank_world()
            params = _optimizer_params(inner)
            grads = {id(p): p.grad for p in params}
            for p in params:
                if self.owners.get(id(p), rank) != rank:
                    inner.state.pop(p, None)
            works, out = [], None
            try:
                for entries, chunk in _step_chunks(params, pending, ZERO1_CHUNKS):
                    finish_reduce(entries)
                    mine = {id(p) for p in chunk if self.owners.get(id(p), rank) == rank}
                    for p in params:
                        p.grad = grads[id(p)] if id(p) in mine else None
                    if mine:
                        out = super().optimizer_step(optimizer, **kwargs)
                    works += self._share_stepped([p for p in chunk if id(p) in self.owners])
            finally:
                for p in params:
                    p.grad = grads[id(p)]
            for work in works:
                work.wait()
            self.broadcasts += bool(self.owners)
            self.split_steps += 1
            return out

        def _share_stepped(self, params: list[torch.Tensor]) -> list:
            """zero1: each of ``params`` (stepped by its owner) from its owner to every other rank, asynchronously:
            point-to-point sends and receives in one batch (on 2 GPUs both directions of the link at once; one
            broadcast per parameter moved twice the bytes, one direction at a time, ``docs/performance-trail.md``)."""
            import torch.distributed as dist

            if not params:
                return []
            rank, world = self._rank_world()
            ops = []
            for p in params:
                owner = self.owners[id(p)]
                if owner == rank:
                    ops += [dist.P2POp(dist.isend, p.data, peer) for peer in range(world) if peer != rank]
                else:
                    ops.append(dist.P2POp(dist.irecv, p.data, owner))
            if dist.get_backend() == "nccl":
                return dist.batch_isend_irecv(ops)
            return [op.op(op.tensor, op.peer, op.group) for op in ops]

        def finish_gradients(self) -> None:
            """Wait for the all-reduces the last synchronizing backward left to :meth:`optimizer_step` (the current
            stream waits): before anything but the step reads or adds to the gradients."""
            pending, self._unfinished = self._unfinished, []
            finish_reduce(pending)

        def clip_gradients_norm(self, module: Any, optimizer: Any, max_norm: float | int, norm_type: float | int = 2.0,
                                error_if_nonfinite: bool = True) -> torch.Tensor:
            """Clip by the norm of the whole averaged gradient. zero1 (:func:`start_owner_reduce`): a parameter's
            averaged gradient is on its owner only, so each rank takes the norm of those it steps (and a share of
            those every rank steps) and the ranks combine them: the norm one process would see."""
            self.finish_gradients()
            if not (self.owners and self._rank_world()[1] > 1):
                return super().clip_gradients_norm(module, optimizer, max_norm, norm_type=norm_type,
                                                   error_if_nonfinite=error_if_nonfinite)
            import torch.distributed as dist

            self.precision.unscale_gradients(optimizer)
            rank, world = self._rank_world()
            params = [p for p in self.precision.main_params(optimizer) if p.grad is not None]
            mine = [p.grad for p in params if self.owners.get(id(p)) == rank]
            shared = [p.grad for p in params if id(p) not in self.owners]
            norm_type = float(norm_type)
            device = params[0].grad.device if params else torch.device("cpu")
            parts = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in mine + shared]
            if norm_type == float("inf"):
                local = torch.stack(parts).max() if parts else torch.zeros((), device=device)
                dist.all_reduce(local, op=dist.ReduceOp.MAX)
                total = local
            else:
                powered = [t.pow(norm_type) for t in parts]
                local = (torch.stack(powered[:len(mine)]).sum() if mine else torch.zeros((), device=device)) + \
                    (torch.stack(powered[len(mine):]).sum() / world if shared else torch.zeros((), device=device))
                dist.all_reduce(local)
                total = local.pow(1.0 / norm_type)
            if error_if_nonfinite and not torch.isfinite(total).item():
                raise RuntimeError(f"The total norm of order {norm_type} for gradients is non-finite, so it cannot "
                                   "be clipped (error_if_nonfinite=True)")
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            torch._foreach_mul_([p.grad for p in params], coef.to(params[0].grad.dtype) if params else coef)
            return total

        def clip_gradients_value(self, *args: Any, **kwargs: Any) -> None:
            self.finish_gradients()
            return super().clip_gradients_value(*args, **kwargs)

        def get_optimizer_state(self, optimizer: Any) -> dict:
            """``zero1``: the whole optimizer state, gathered on rank 0 (a checkpoint as stock's); ``{}`` on the
            other ranks, which write nothing."""
            if not self.owners:
                return super().get_optimizer_state(optimizer)
            return gather_optimizer_state(getattr(optimizer, "optimizer", optimizer), self.owners)

        def _ready(self, gpt: torch.nn.Module, segment: int) -> None:
            """A ``grads_ready`` callback of the swapped GPTs set up here: in a synchronizing backward, start the
            all-reduce of ``segment``'s gradients (the backward of the Blocks below runs meanwhile)."""
            if self.accumulating:
                return
            segments = self._segments.get(id(gpt))
            if segments is None:
                segments = self._segments[id(gpt)] = grad_segments(gpt)
            if segment <= 0 or segment >= len(segments) - 1:
                return  # (reduced when backward ends)
            params = [p for p in segments[segment] if id(p) not in self._started]
            self._started.update(id(p) for p in params)
            # (zero1: the received gradients of the segments before are added now, their buffers freed: by this
            # segment's end of backward their messages have long arrived, so the stream does not wait)
            owner = [e for e in self._pending if e[1] == "owner"]
            if owner:
                finish_reduce(owner)
                self._pending = [e for e in self._pending if e[1] != "owner"]
            self._pending += self._start(params)
            self.early += bool(params)

        def _start(self, params: list[torch.nn.Parameter]) -> list:
            """Start reducing ``params``' gradients: zero1 sends each stepped-by-one-rank parameter's gradient to
            that rank (:func:`start_owner_reduce`); the rest are all-reduced."""
            if not self.owners:
                return start_reduce(params)
            owned = [p for p in params if id(p) in self.owners]
            shared = [p for p in params if id(p) not in self.owners]
            return start_reduce(shared) + start_owner_reduce(owned, self.owners)

        def backward(self, tensor: torch.Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
            """The backward, then (outside ``no_backward_sync``) the all-reduce of the gradients its segments did not
            start, left running for :meth:`optimizer_step` (:meth:`finish_gradients`)."""
            self.finish_gradients()  # (a backward after a reducing one without a step between: its sums first)
            try:
                super().backward(tensor, module, *args, **kwargs)
                if not self.accumulating:
                    self.reductions += 1
                    rest = [p for p in _unique_trainable(self._modules) if id(p) not in self._started]
                    self._pending += self._start(rest)
                    self._unfinished, self._pending = self._pending, []
            finally:
                finish_reduce(self._pending)  # (a backward that failed: nothing left in flight)
                self._pending, self._started = [], set()

        def teardown(self) -> None:
            self.finish_gradients()
            for state in self._marked:  # (what setup_module marked, undone)
                state.replica = False
                if self._ready in state.grads_ready:
                    state.grads_ready.remove(self._ready)
            self._marked.clear()
            self._segments.clear()
            self._modules.clear()
            self.owners.clear()
            super().teardown()

    return ReplicaStrategy


@functools.cache
def replica_class() -> type:
    """:class:`ReplicaStrategy` (a subclass of Lightning's ``DDPStrategy``, made on first use and cached: importing
    lit-liger does not import Lightning)."""
    return _make_replica_class()


def __getattr__(name: str) -> Any:
    if name == "ReplicaStrategy":
        return replica_class()
    raise AttributeError(name)
