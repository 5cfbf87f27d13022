"""Adam / AdamW stepped by one kernel pass (``LigerConfig.fused_optimizer``).

``torch.optim.AdamW(params)`` on CUDA tensors defaults to its ``foreach`` implementation: a dozen passes over the
parameters and their state per step, each an op over lists of tensors (lerp, mul, addcmul, sqrt, div, add, addcdiv,
...), every intermediate rounded to the parameters' dtype. litgpt's recipes build the optimizer with neither ``fused``
nor ``foreach`` set, so at a 1B model's full fine-tuning the step is a memory-bound pass of tens of GB, once every
``gradient_accumulation_iters`` iterations.

:func:`fuse_optimizer` switches such an optimizer, in place, to one pass that reads each parameter, gradient and moment
once and writes them once, computing in fp32:

* lit-liger's multi-tensor kernel (``lit_liger.kernels.adam``, :data:`OWN_KERNEL`): one launch over every tensor of a
  dtype. PyTorch's ``fused=True`` kernel is the same algorithm in launches of a few hundred blocks each.
  The optimizer's class becomes lit-liger's subclass of the same name (:class:`Adam`, :class:`AdamW`: ``isinstance``
  holds, and names built from the class name, such as Lightning's ``lr-AdamW`` metric, are unchanged). Parameters
  may be DTensors (FSDP2, ``ModelParallelStrategy``): each rank steps its local shards. Where a step cannot take the
  kernel (``amsgrad``, ``capturable``, a tensor ``lr`` on the device, a gradient scaler's ``grad_scale``, a gradient
  placed unlike its DTensor parameter) the class's own step runs, with ``fused=True``;
* with :data:`OWN_KERNEL` off, PyTorch's fused kernel (``fused=True``, which takes DTensors too).

On an H100 (``python -m benchmarks diag adam-step``, bf16): the step of Llama-3.2-1B's weights takes the same time
either way (0.72 of the device's copy rate); at Llama-3.1-8B's widths lit-liger's kernel streams at 0.80-0.86 of it
against PyTorch's 0.72.

Either way the class's hyperparameters and ``state_dict`` keys stay; the step count lives on the parameter's device as
a float32 tensor, as PyTorch's fused and capturable optimizers keep it (existing state is moved there), and
``state_dict()`` hands it out on the host, as the default implementation keeps it, so that a checkpoint is the same
as stock's. Only where the user chose nothing: an optimizer built with ``fused`` or ``foreach`` set,
``differentiable``, or holding parameters that are not floating tensors on a supported device is left as it is, with
the reason returned.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .adapter import _is_dtensor

__all__ = ["DEVICES", "OWN_KERNEL", "Adam", "AdamW", "fuse_and_report", "fuse_optimizer"]

#: the device types whose parameters :func:`fuse_optimizer` switches by default (the kernels also run on CPU, where
#: lit-liger's speed does not matter; the CPU tests add it)
DEVICES: tuple[str, ...] = ("cuda",)
#: switched optimizers step with lit-liger's multi-tensor kernel (``lit_liger.kernels.adam``); False: PyTorch's fused
#: kernel (``fused=True``), which takes plain tensors only. Read at each step.
OWN_KERNEL = True


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise): the elements this rank steps."""
    return t._local_tensor if _is_dtensor(t) else t


def _unhooked(fn: Any) -> Any:
    """A class's ``step`` without the hook wrapper ``torch.optim.Optimizer`` puts around it (the wrapper runs the step
    hooks; :class:`_OwnStep`'s own ``step`` is wrapped the same way, so the fallback must not run them twice)."""
    return fn.__wrapped__ if getattr(fn, "hooked", False) and hasattr(fn, "__wrapped__") else fn


class _OwnStep:
    """``step`` on lit-liger's multi-tensor kernel (:mod:`lit_liger.kernels.adam`), mixed into ``torch.optim.Adam`` /
    ``AdamW`` (:class:`Adam`, :class:`AdamW`); the state, its initialization and every hyperparameter are the base
    class's. Where the kernel does not apply (:meth:`_kernel_refusal`), the base class's step."""

    _liger_base: type

    def _kernel_refusal(self) -> str | None:
        if not OWN_KERNEL:
            return "lit_liger.optim.OWN_KERNEL is off"
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            return "a gradient scaler's grad_scale / found_inf"
        for g in self.param_groups:
            for key in ("amsgrad", "capturable", "differentiable"):
                if g.get(key):
                    return f"{key}=True"
            lr = g["lr"]
            if isinstance(lr, torch.Tensor) and lr.device.type != "cpu":
                return "lr is a tensor on the device"
            for p in g["params"]:
                if p.grad is None:
                    continue
                if torch.is_complex(p) or p.grad.is_sparse:
                    return "a complex parameter or a sparse gradient"
                if _is_dtensor(p) and (not _is_dtensor(p.grad) or p.grad.placements != p.placements):
                    return "a gradient placed unlike its DTensor parameter"
        return None

    def step(self, closure: Any = None) -> Any:
        if self._kernel_refusal() is not None:
            return _unhooked(self._liger_base.step)(self, closure)
        from .kernels.adam import adam_step_

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                params: list = []
                grads: list = []
                exp_avgs: list = []
                exp_avg_sqs: list = []
                self._init_group(group, params, grads, exp_avgs, exp_avg_sqs, [], [])  # (the base class's state)
                if not params:
                    continue
                steps = []
                for p in params:
                    state = self.state[p]
                    if state["step"].device != _local(p).device:  # (a count the user's code put on the host)
                        state["step"] = state["step"].to(_local(p).device, torch.float32)
                    steps.append(state["step"])
                torch._foreach_add_(steps, 1.0)
                beta1, beta2 = group["betas"]
                adam_step_([_local(p) for p in params], [_local(g) for g in grads], [_local(m) for m in exp_avgs],
                           [_local(v) for v in exp_avg_sqs], steps, lr=float(group["lr"]), beta1=float(beta1),
                           beta2=float(beta2), eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                           decoupled=bool(group.get("decoupled_weight_decay", isinstance(self, torch.optim.AdamW))),
                           maximize=bool(group.get("maximize", False)))
        return loss


class Adam(_OwnStep, torch.optim.Adam):
    """``torch.optim.Adam`` stepped by lit-liger's kernel (made by :func:`fuse_optimizer` only)."""

    _liger_base = torch.optim.Adam


class AdamW(_OwnStep, torch.optim.AdamW):
    """``torch.optim.AdamW`` stepped by lit-liger's kernel (made by :func:`fuse_optimizer` only)."""

    _liger_base = torch.optim.AdamW


_OWN = {torch.optim.Adam: Adam, torch.optim.AdamW: AdamW}


def _repoint_lr_scheduler(optimizer: Any) -> None:
    """An LR scheduler built before the switch wrapped the optimizer's ``step`` (to notice it was called) around the
    class's function of that time: wrap the switched class's instead, with the same marks."""
    wrapped = vars(optimizer).get("step")
    if wrapped is None or not getattr(wrapped, "_wrapped_by_lr_sched", False):
        return
    ref = weakref.ref(optimizer)

    def step(*args: Any, **kwargs: Any) -> Any:
        opt = ref()
        opt._opt_called = True
        return type(opt).step(opt, *args, **kwargs)

    step._wrapped_by_lr_sched = True
    optimizer.step = step


def fuse_optimizer(optimizer: object, devices: tuple[str, ...] | None = None) -> str | None:
    """Switch ``optimizer`` (``torch.optim.Adam`` or ``AdamW``, built with ``fused`` and ``foreach`` unset) to one
    kernel pass per step, in place (see the module's docstring). Returns None where it did, else why not (nothing
    changed). ``devices``: the device types whose parameters qualify (default :data:`DEVICES`)."""
    devices = DEVICES if devices is None else devices
    if isinstance(optimizer, _OwnStep):
        return "the optimizer is fused already"
    if type(optimizer) not in _OWN:
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
                return f"a parameter is a {type(p).__name__} of {p.dtype} (the kernels take plain or DTensor floating tensors)"
            if p.device.type not in devices:
                return f"a parameter is on {p.device.type}"
    if not any(g["params"] for g in groups):
        return "the optimizer has no parameters"
    for g in groups:
        g["fused"] = True  # (the base class's step, where the kernel does not apply: PyTorch's fused kernel)
        for p in g["params"]:
            state = optimizer.state.get(p)
            if state and "step" in state:  # (resumed: the kernels read the step count on the device)
                state["step"] = torch.as_tensor(float(state["step"]), dtype=torch.float32, device=p.device)
    optimizer.defaults["fused"] = True
    if OWN_KERNEL:
        optimizer.__class__ = _OWN[type(optimizer)]
        optimizer._patch_step_function()  # (the step hooks, as torch wraps every optimizer class's step)
        _repoint_lr_scheduler(optimizer)
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
    if isinstance(optimizer, _OwnStep):
        return (f"lit-liger: {name} steps with lit-liger's multi-tensor kernel (one launch over every parameter, its "
                f"gradient and moments, in fp32, instead of PyTorch's default foreach); {keep_it} keeps it")
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
