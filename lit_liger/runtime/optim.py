"""Adam / AdamW stepped by PyTorch's fused kernel (``LigerConfig.fused_optimizer``).

``torch.optim.AdamW(params)`` on CUDA tensors defaults to its ``foreach`` implementation: a dozen passes over the
parameters and their state per step, each an op over lists of tensors (lerp, mul, addcmul, sqrt, div, add, addcdiv,
...), every intermediate rounded to the parameters' dtype. ``fused=True`` is the same algorithm in one kernel that
reads each parameter, gradient and moment once and writes them once, computing in fp32. litgpt's recipes build the
optimizer with neither option set, so at a 1B model's full fine-tuning the step is a memory-bound pass of
tens of GB, once every ``gradient_accumulation_iters`` iterations.

:func:`fuse_optimizer` switches such an optimizer to the fused kernel in place: the same class, param groups,
hyperparameters and ``state_dict`` keys; the step count lives on the parameter's device as a float32 tensor, as
PyTorch's fused and capturable optimizers keep it (existing state is moved there), and ``state_dict()`` hands it out
on the host, as the default implementation keeps it, so that a checkpoint is the same as stock's. Parameters may be
DTensors (FSDP2: ``fully_shard``, ``ModelParallelStrategy``, litgpt's ``finetune_lora`` on several devices): PyTorch's
fused kernel takes them, each rank stepping its local shards. Only where the user chose nothing: an optimizer built
with ``fused`` or ``foreach`` set, ``differentiable``, or holding parameters that are not plain or DTensor floating
tensors on a supported device (FSDP1's flat parameters) is left as it is, with the reason returned.
"""

from __future__ import annotations

import torch

from ..swap._common import _is_dtensor

__all__ = ["DEVICES", "fuse_and_report", "fuse_optimizer"]

#: the device types whose parameters :func:`fuse_optimizer` switches by default (the fused kernel also runs on CPU,
#: where lit-liger's speed does not matter; the CPU tests add it)
DEVICES: tuple[str, ...] = ("cuda",)


def fuse_optimizer(optimizer: object, devices: tuple[str, ...] | None = None) -> str | None:
    """Switch ``optimizer`` (``torch.optim.Adam`` or ``AdamW``, built with ``fused`` and ``foreach`` unset) to
    PyTorch's fused kernel, in place. Returns None where it did, else why not (nothing changed). ``devices``: the
    device types whose parameters qualify (default :data:`DEVICES`)."""
    devices = DEVICES if devices is None else devices
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"{type(optimizer).__name__} is not torch.optim.Adam or AdamW"
    groups = optimizer.param_groups
    for g in groups:
        if g.get("fused"):
            return "the optimizer is fused already"
        if g.get("foreach") is not None:
            return f"the optimizer was built with foreach={g['foreach']}"
        if g.get("differentiable"):
            return "the optimizer is differentiable (the fused kernel is not)"
        for p in g["params"]:
            plain = type(p) in (torch.Tensor, torch.nn.Parameter)
            if not (plain or _is_dtensor(p)) or not torch.is_floating_point(p):
                return (f"a parameter is a {type(p).__name__} of {p.dtype} (the fused kernel takes plain or DTensor "
                        "floating tensors)")
            if p.device.type not in devices:
                return f"a parameter is on {p.device.type}"
    if not any(g["params"] for g in groups):
        return "the optimizer has no parameters"
    for g in groups:
        g["fused"] = True
        for p in g["params"]:
            state = optimizer.state.get(p)
            if state and "step" in state:  # (resumed: the fused kernel reads the step count on the device)
                state["step"] = torch.as_tensor(float(state["step"]), dtype=torch.float32, device=p.device)
    optimizer.defaults["fused"] = True
    if not getattr(optimizer, "_liger_steps_on_host", False):
        optimizer.register_state_dict_post_hook(_steps_on_host)
        optimizer._liger_steps_on_host = True
    return None


def fuse_and_report(optimizer: object, keep_it: str) -> str | None:
    """:func:`fuse_optimizer` on an Adam / AdamW (AdamW is an Adam), and the log line that says what happened
    (``keep_it``: how the user turns it off there); None for any other optimizer (nothing done)."""
    if not isinstance(optimizer, torch.optim.Adam):
        return None
    why, name = fuse_optimizer(optimizer), type(optimizer).__name__
    if why is not None:
        return f"lit-liger: {name} keeps its implementation: {why}"
    return (f"lit-liger: {name} steps with PyTorch's fused kernel (fused=True: one pass over each parameter and its "
            f"state, in fp32, instead of PyTorch's default foreach); {keep_it} keeps it")


def _steps_on_host(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """``state_dict()`` of a fused optimizer with its step counts as the default implementation keeps them (float32
    tensors on the host): a checkpoint as stock's, which a foreach optimizer resumes without reading each count back
    from the device at every step. The optimizer's own state is not touched (each parameter's entry is copied)."""
    for key, entry in state_dict.get("state", {}).items():
        step = entry.get("step") if isinstance(entry, dict) else None
        if isinstance(step, torch.Tensor) and step.device.type != "cpu":
            state_dict["state"][key] = {**entry, "step": step.detach().to("cpu", torch.float32)}
    return state_dict
