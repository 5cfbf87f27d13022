"""What the swaps read about a module before calling a kernel in its place: plain Linears, frozen weights,
hooks, DTensors, the Block scopes a checkpoint or the memory plan opens."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from litgpt import lora as litgpt_lora
from torch import nn
from torch.nn.modules import module as _nn_module


def _stock_under_compile(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` runs LitGPT's own forward: under ``torch.compile``, for inputs of fewer than
    ``LigerConfig.compile_min_tokens`` tokens (compared as elements, ``tokens * n_embd``, so a per-head
    qk-norm's ``(B, nh, T, hs)`` input counts like its ``(B, T, C)`` source). Such steps are bound
    by the host: each lit-liger op costs the custom-op dispatcher and Python launch work, while
    inductor fuses LitGPT's code into a few kernels launched from generated code (measured in the
    README, "Small micro-batches"). Decided while tracing (a guard on the shape), free at run time;
    in eager mode ``is_compiling()`` is False."""
    return torch.compiler.is_compiling() and x.numel() < getattr(module, "_liger_compile_min_elems", 0)


#: a Block (and its MLP) runs under LigerConfig.activation_checkpointing (its forward and its recompute in backward)
_CHECKPOINTED = "_liger_in_checkpoint"


#: a Block (and its MLP) runs whose MLP inputs the memory plan has recomputed in backward
#: (``lit_liger.runtime.memplan.MemPlan.mlp``): a frozen MLP runs as ``glu_mlp``, a trained one as ``recompute_mlp`` does
_MLP_RECOMPUTED = "_liger_mlp_recomputed"


#: tokens per sequence tile of a Block's MLP while the Block runs under ``activation_checkpointing`` (its forward and
#: its recompute; ``lit_liger.runtime.memplan.MemPlan.tile``; 0: whole): an attribute of the Block, set by
#: :func:`_tiled`, read by :func:`mlp_tile`
_MLP_TILE = "_liger_mlp_tile"


def mlp_tile(block: nn.Module) -> int:
    """Tokens per tile of ``block``'s MLP in this call (:data:`_MLP_TILE`; 0: untiled)."""
    return block.__dict__.get(_MLP_TILE, 0)


@contextlib.contextmanager
def _tiled(block: nn.Module, tile: int) -> Iterator[None]:
    """While ``block`` runs, its MLP runs over sequence tiles of ``tile`` tokens (0: whole; nested: the inner wins)."""
    before = block.__dict__.get(_MLP_TILE, 0)
    block.__dict__[_MLP_TILE] = int(tile)
    try:
        yield
    finally:
        block.__dict__[_MLP_TILE] = before


#: a Block's attention keeps its output for the Block's rerun in backward while the Block runs under
#: ``activation_checkpointing`` (``lit_liger.runtime.memplan.MemPlan.attn``): an attribute of the attention module, the
#: ``lit_liger.swap.attend.KeptAttention`` of this micro-batch, set by :func:`_keeping`
_KEPT_ATTENTION = "_liger_kept"


@contextlib.contextmanager
def _keeping(block: nn.Module, kept: object | None) -> Iterator[None]:
    """While ``block`` runs, its attention keeps its output in ``kept`` (None: it does not)."""
    attn = getattr(block, "attn", None)
    if kept is None or not isinstance(attn, nn.Module):
        yield
        return
    before = attn.__dict__.get(_KEPT_ATTENTION)
    attn.__dict__[_KEPT_ATTENTION] = kept
    try:
        yield
    finally:
        attn.__dict__[_KEPT_ATTENTION] = before


def _in_scope(module: nn.Module, scope: str) -> bool:
    """``module`` runs inside :func:`_scoped` ``scope`` (a count on the module itself: each model its own)."""
    return module.__dict__.get(scope, 0) > 0


@contextlib.contextmanager
def _scoped(block: nn.Module, scope: str) -> Iterator[None]:
    """While ``block`` (and its MLP) run, :func:`_in_scope` ``scope`` holds for them."""
    mods = [block] + ([block.mlp] if isinstance(getattr(block, "mlp", None), nn.Module) else [])
    for m in mods:
        m.__dict__[scope] = m.__dict__.get(scope, 0) + 1
    try:
        yield
    finally:
        for m in mods:
            m.__dict__[scope] -= 1


def _frozen_linear(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of a plain ``nn.Linear``, or of a LitGPT ``LoRALinear`` with r = 0 (whose forward is its
    inner Linear's), where neither requires grad; else None."""
    if not _plain_linear(m):
        if not (_is_lora_linear(m) and m.r == 0 and _plain_linear(m.linear)):
            return None
        m = m.linear
    w, b = m.weight, m.bias
    if w.requires_grad or (b is not None and b.requires_grad):
        return None
    return w, b


def _fresh_outputs(*modules: nn.Module) -> bool:
    """These modules return new tensors that nothing else keeps: plain ``nn.Linear`` or LitGPT ``LoRALinear``
    layers (swapped or not, r = 0 included: their output is a new sum, or the inner Linear's), with no hooks
    on them or their inner Linear (a forward hook may keep the output it sees)."""
    inner = []
    for m in modules:
        if type(m) is nn.Linear:
            continue
        if not _is_lora_linear(m) or type(m.linear) is not nn.Linear:
            return False
        inner.append(m.linear)
    return _called_plainly(*modules, *inner)


def _is_lora_linear(m: nn.Module) -> bool:
    """LitGPT's ``LoRALinear``, swapped or not."""
    return getattr(type(m), "_liger_lora_mixin", False) or type(m) is litgpt_lora.LoRALinear


def _plain_linear(m: nn.Module) -> bool:
    """A plain ``nn.Linear`` whose weight the fused norm + Linear function may read directly (not LoRA
    or another subclass, not a DeepSpeed ZeRO-3 partition gathered by its own module hooks, not a
    DTensor of a module sharded or parallelized on its own)."""
    return type(m) is nn.Linear and not hasattr(m.weight, "ds_id") and not _is_dtensor(m.weight)


def _is_dtensor(t: torch.Tensor) -> bool:
    """``isinstance(t, DTensor)`` without importing torch.distributed where it is not built (traceable
    by torch.compile, unlike walking the type's MRO)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _called_plainly(*modules: nn.Module) -> bool:
    """No hooks on these modules (nor global module hooks): calling their math directly instead of
    through ``module(...)`` skips nothing (FSDP2 ``fully_shard`` or composable checkpointing applied
    to them, weight re-parametrizing pre-hooks, a user's activation hooks)."""
    if _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks:
        return False
    return not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks for m in modules
    )
