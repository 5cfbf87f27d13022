"""The one test for "this run has several processes" (FSDP / DeepSpeed / DDP), which several features step aside for."""

from __future__ import annotations

import torch

__all__ = ["several_processes"]


def several_processes() -> bool:
    """A ``torch.distributed`` process group of more than one process is initialized."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1)
