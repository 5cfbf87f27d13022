"""Input validation shared by the kernel wrappers: clear ``TypeError``/``ValueError`` before any launch."""

from __future__ import annotations

import torch

from ._launch import check_dtype_supported

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    check_dtype_supported(t.dtype, t.device)


def check_same_device(**tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    dev = items[0][1].device
    for k, v in items[1:]:
        if v.device != dev:
            raise ValueError(f"{k} is on {v.device} but {items[0][0]} is on {dev}; move them to one device")


def check_same_dtype(**tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    for k, v in items[1:]:
        if v.dtype != items[0][1].dtype:
            raise TypeError(f"{k} has dtype {v.dtype} but {items[0][0]} has {items[0][1].dtype}; they must match")


def check_last_dim(name: str, t: torch.Tensor, size: int, what: str) -> None:
    if t.dim() < 1 or t.shape[-1] != size:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; its last dimension must be {size} ({what})")


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``(..., H)`` -> ``(N, H)`` with unit stride on the last dim (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def owns_storage(t: torch.Tensor) -> bool:
    """``t`` is the whole of its storage (not a view into a larger buffer): writing over it touches nothing else's."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
