"""The one test for "this run has several processes" (FSDP / DeepSpeed / DDP), which several features step aside for,
and the one for "these processes replicate the model" (DDP), where they need not."""

from __future__ import annotations

import torch

__all__ = ["replicated", "several_processes", "sharded_processes"]


def several_processes() -> bool:
    """A ``torch.distributed`` process group of more than one process is initialized."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1)


def replicated() -> bool:
    """This call runs inside the forward of a ``DistributedDataParallel`` module: every process holds the whole model,
    and DDP all-reduces the gradients that autograd accumulates (its hooks sit on the parameters' gradient
    accumulators). Lightning's ``DDPStrategy`` (and ``lit-liger``'s ``replicate_frozen_base``) wrap the model so."""
    if not torch.distributed.is_available():
        return False
    ddp = getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None)
    return ddp is not None


def sharded_processes() -> bool:
    """Several processes, and this call is not inside a DDP forward (FSDP, DeepSpeed, or code of its own)."""
    return several_processes() and not replicated()
