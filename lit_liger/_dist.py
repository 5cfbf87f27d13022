"""The one test for "this run has several processes" (FSDP / DeepSpeed / DDP), which several features step aside for,
the one for "these processes replicate the model" (DDP, or lit-liger's own replica plan), where they need not, the one
for "every process holds the whole model and lit-liger reduces its gradients" (:func:`whole_model`: the single-process
machinery applies as is), and the one for "they all run on this host" (``LigerConfig.fp8_all_gather``'s automatic
choice)."""

from __future__ import annotations

import os

import torch

__all__ = ["grads_ready", "liger_replica", "segment_cuts", "segment_of", "one_host", "rank_zero", "replicated",
           "several_processes", "sharded_processes", "whole_model"]


def _state(gpt: torch.nn.Module | None) -> object | None:
    """``gpt``'s ``lit_liger.swap.state.ModelState`` (read as an attribute: this module imports nothing of the
    package), or None."""
    return None if gpt is None else gpt.__dict__.get("_liger_state")


def _replica(gpt: torch.nn.Module | None) -> bool:
    """``ModelState.replica``: set by ``lit_liger.parallel.dataparallel.ReplicaStrategy`` on the model it sets up:
    this process holds the whole model, which no DDP wrapper holds, and the strategy all-reduces the gradients after
    each synchronizing backward (so nothing hooks the parameters' gradient accumulators: the CUDA graphs may add
    gradients straight into ``.grad``)."""
    return bool(getattr(_state(gpt), "replica", False))


def several_processes() -> bool:
    """A ``torch.distributed`` process group of more than one process is initialized."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1)


#: ``ModelState.grads_ready``: callbacks ``fn(gpt, segment)`` that a swapped GPT's backward runs when the trainable parameters of ``segment`` have
#: their gradients for this backward: segment ``j`` >= 1 = the Blocks from :func:`segment_cuts` ``[j - 1]`` up (``ln_f``
#: with them), at the gradient of that Block's input (the CUDA graphs' backward then replays as one graph per
#: segment). The lowest Blocks, the embedding and the parameters outside the Blocks (the lm_head) have none: backward
#: ends there. (The lm_head's gradient was seen to arrive after the final hidden states' gradient on CUDA: an early
#: all-reduce there reduced a zero gradient, on 2 GPUs.)
#: ``lit_liger.parallel.dataparallel.ReplicaStrategy`` starts each segment's all-reduce there, under the backward that follows.
#: Empty (one process): no hook, one backward graph.
#: the number of segments a GPT's Blocks are split into for its ``grads_ready`` callbacks
SEGMENTS = 4


def segment_cuts(gpt: torch.nn.Module) -> list[int]:
    """The Block indices where the segments of ``gpt``'s ``grads_ready`` callbacks start, from the top: ``[12, 8, 4]``
    for 16 layers (segment 1 = Blocks 12-15, 2 = 8-11, 3 = 4-7; Blocks 0-3 and the embedding finish the backward);
    ``[]`` where no callback is registered."""
    if not getattr(_state(gpt), "grads_ready", None):
        return []
    n_layer = gpt.config.n_layer
    k = min(SEGMENTS, n_layer)
    return [n_layer * j // k for j in range(k - 1, 0, -1)]


def segment_of(name: str, cuts: list[int]) -> int:
    """The segment of the parameter ``name`` (a GPT's ``named_parameters``) for :func:`segment_cuts` ``cuts``: a Block's
    ``1 +`` the number of cuts above it (``ln_f``: 1), the embedding's and any other ``transformer.`` one's the last
    (``len(cuts) + 1``), one outside the transformer (the lm_head) 0."""
    if name.startswith("transformer.h."):
        block = int(name.split(".")[2])
        return 1 + sum(1 for c in cuts if block < c)
    if name.startswith("transformer.ln_f."):
        return 1
    return len(cuts) + 1 if name.startswith("transformer.") else 0


def grads_ready(gpt: torch.nn.Module, segment: int) -> None:
    for fn in list(getattr(_state(gpt), "grads_ready", ())):
        fn(gpt, segment)


def liger_replica(gpt: torch.nn.Module | None) -> bool:
    """Several processes, each holding the whole of ``gpt`` under ``lit_liger.parallel.dataparallel.ReplicaStrategy``."""
    return _replica(gpt) and several_processes()


def whole_model(gpt: torch.nn.Module | None) -> bool:
    """One process, or several holding ``gpt`` under lit-liger's replica plan: what runs on one device runs on each as
    it is (the gradients are all-reduced by the strategy after backward, outside the model). ``gpt`` None: a model
    outside that plan."""
    return not several_processes() or _replica(gpt)


def one_host() -> bool:
    """Every process of the initialized group runs on this host, as far as can be told without a collective:
    torchrun's ``LOCAL_WORLD_SIZE`` covers the world or, without it, the world fits in this host's visible GPUs. A
    launcher that shows each process only its own GPU makes a one-host run look like several hosts (``False``)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return False
    world = torch.distributed.get_world_size()
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit():
        return int(local) >= world
    return world <= torch.cuda.device_count()


def replicated(gpt: torch.nn.Module | None) -> bool:
    """This call runs inside the forward of a ``DistributedDataParallel`` module: every process holds the whole model,
    and DDP all-reduces the gradients that autograd accumulates (its hooks sit on the parameters' gradient
    accumulators; Lightning's ``DDPStrategy`` wraps the model so); or lit-liger's replica plan is set up
    for ``gpt`` (``ModelState.replica``)."""
    if not torch.distributed.is_available():
        return False
    if liger_replica(gpt):
        return True
    ddp = getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None)
    return ddp is not None


def sharded_processes(gpt: torch.nn.Module | None) -> bool:
    """Several processes, and this call is not inside a DDP forward nor ``gpt`` under lit-liger's replica plan (FSDP,
    DeepSpeed, or code of its own)."""
    return several_processes() and not replicated(gpt)


def rank_zero() -> bool:
    """This process is the first of its process group (or the only one): the one that prints a run's notes."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
        torch.distributed.get_rank() == 0
