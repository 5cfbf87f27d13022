"""One copy of a frozen lm_head that equals the frozen token embedding (``LigerConfig.tied_weights``).

Hugging Face models with ``tie_word_embeddings`` (Llama-3.2-1B/3B, Qwen2.5 up to 3B, Gemma ...) keep one matrix for
the token embedding and the output head. LitGPT 0.5.13 has no tied weights: its checkpoint conversion writes the
embedding into ``lm_head.weight`` as well, so a converted checkpoint holds two equal ``(V, C)`` matrices and a
fine-tuning run holds both on the GPU (501 MiB of Llama-3.2-1B's 2,928 MiB of bf16 weights).

Where both are frozen (LoRA, adapter fine-tuning) and bit-for-bit equal, the swapped model's forward points the
head's parameter at the embedding's storage (``lm_head.weight.data = wte.weight.data``): the same parameter
objects, the same values, the same ``state_dict`` keys; the head's own copy is freed. Nothing changes for a model
whose head and embedding differ, train, are sharded, or live in several processes.

Never silently wrong afterwards: every forward checks the share again and undoes it (the head gets its own copy
back) when either parameter starts to train or was moved; a ``load_state_dict`` into the model, its head or its
embedding undoes it first (a checkpoint may hold two different matrices), and the next forward compares again.
The comparison itself (one device sync) runs once per state of the two parameters (storage and version).
"""

from __future__ import annotations


import torch
from torch import nn

from .._dist import whole_model
from ..kernels._checks import owns_storage
from .loss import _unwrap_linear
from .state import state_of

__all__ = ["head_weight", "install", "own_copy", "share_if_tied", "unshare"]



def head_weight(gpt: nn.Module) -> nn.Parameter | None:
    """The output head's weight parameter (the fused loss's :func:`lit_liger.swap.loss._unwrap_linear`), where it belongs to
    a plain ``nn.Linear``: the head itself, or the frozen base of LitGPT's ``LoRALinear``. With a LoRA update
    (``lora_head: true``, litgpt's gemma, gemma-2, phi and tiny-llama recipes) only where lit-liger swapped the layer
    and its update is not merged: the swapped layer's ``merge`` gives the base its own copy first
    (:func:`own_copy`; merging writes into the base weight in place). None for anything else (a merged or
    unswapped LoRA head, an adapter's per-output scale, a quantized or other Linear subclass)."""
    head = gpt.lm_head
    if type(getattr(head, "linear", head)) is not nn.Linear:
        return None  # (checked first: a quantized head's weight would be dequantized to be read)
    if getattr(head, "r", 0) > 0 and (getattr(head, "merged", False) or not getattr(head, "_liger_merge_owns", False)):
        return None  # a merged update, or a merge that would write into the shared storage
    try:
        weight, _, scale = _unwrap_linear(head)
    except NotImplementedError:
        return None
    return None if scale is not None else weight


def _why_not(gpt: nn.Module, head: nn.Parameter | None, emb: nn.Parameter) -> str | None:
    if head is None:
        return "the head is not a plain Linear"
    if head.requires_grad or emb.requires_grad:
        return "trained"
    if head.shape != emb.shape or head.dtype != emb.dtype or head.device != emb.device or head.is_meta:
        return "different shape, dtype or device"
    if hasattr(head, "ds_id") or hasattr(emb, "ds_id") or type(head.data) is not torch.Tensor \
            or type(emb.data) is not torch.Tensor:
        return "sharded"
    if not (owns_storage(head) and owns_storage(emb)):  # (FSDP's original parameters view a flat buffer)
        return "part of a larger buffer (FSDP's flat parameters)"
    if not whole_model(gpt):
        return "several processes (sharded or a DDP replica)"
    return None


def _state(head: nn.Parameter, emb: nn.Parameter) -> tuple:
    return head.data_ptr(), emb.data_ptr(), head._version, emb._version


class _Tie:
    """Held by both parameters (``_liger_tied``) while the head shares the embedding's storage."""

    def __init__(self) -> None:
        self.active = True


def _tie(p: nn.Parameter) -> _Tie | None:
    tie = getattr(p, "_liger_tied", None)
    return tie if isinstance(tie, _Tie) and tie.active else None


def _untie(p: nn.Parameter) -> None:
    """Give ``p`` its own copy of the shared storage and end the share (both parameters)."""
    tie = _tie(p)
    if tie is not None:
        p.data = p.data.clone()
        tie.active = False


def own_copy(p: nn.Parameter) -> None:
    """``p`` gets its own storage back if it shares the other's (before anything writes into it in place: LoRA's
    ``merge``); nothing otherwise."""
    _untie(p)


#: bytes of one block of rows compared at a time by _bit_equal (tests lower it)
COMPARE_BYTES = 16 << 20
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` (same shape, dtype and device) hold the same bits (so ``-0.0`` differs from ``0.0``), compared a
    block of rows at a time with one device sync: ``torch.equal`` makes one bool per element at once, 250 MiB for
    Llama-3.2-1B's head, which would set the run's peak."""
    it = _INT_OF_SIZE[a.element_size()]
    a2, b2 = a.view(it).reshape(a.shape[0], -1), b.view(it).reshape(b.shape[0], -1)  # (V, C) integer views
    rows = max(1, COMPARE_BYTES // max(1, a2.shape[1]))
    differ = torch.zeros((), dtype=torch.bool, device=a.device)
    for r0 in range(0, a2.shape[0], rows):
        differ |= (a2[r0:r0 + rows] != b2[r0:r0 + rows]).any()
    return not differ.item()


def share_if_tied(gpt: nn.Module) -> None:
    """Called at the start of the swapped GPT's forward (eager mode): share, keep, or undo (module docstring).
    Costs a few attribute reads per call; the one comparison of the two matrices (a device sync) runs again only
    after either one's storage or version changed."""
    emb = gpt.transformer.wte.weight
    head = head_weight(gpt)
    why = _why_not(gpt, head, emb)
    tie = _tie(head) if head is not None else None
    if tie is not None:
        if head.data_ptr() != emb.data_ptr():
            tie.active = False  # moved apart already (``.to``, ``.data = ...``)
        elif why is None:
            return
        else:
            _untie(head)  # one of them trains now: the head gets its own copy back
    if why is not None or head.data_ptr() == emb.data_ptr():  # (already one storage: the user tied them)
        return
    state = _state(head, emb)
    if getattr(gpt, "_liger_tied_checked", None) == state:
        return  # compared at this state before: not equal
    if _bit_equal(head, emb):
        freed = head.numel() * head.element_size()
        head.data = emb.data
        head._liger_tied = emb._liger_tied = _Tie()
        gpt._liger_tied_checked = None
        for announce in state_of(gpt).on_share:  # (the CLI prints it on rank 0)
            announce(f"lit-liger: lm_head.weight equals transformer.wte.weight and both are frozen: one copy kept "
                     f"({freed / 2**20:,.1f} MiB freed)")
    else:
        gpt._liger_tied_checked = state


def unshare(gpt: nn.Module) -> None:
    """Give the head its own copy again (``remove_liger``)."""
    head = head_weight(gpt)
    if head is not None:
        _untie(head)
    gpt._liger_tied_checked = None


def _unshare_before_load(module: nn.Module, *_args) -> None:
    """``load_state_dict`` pre-hook of the head's and the embedding's modules: a shared parameter gets its own
    storage before the load writes into it (the checkpoint may hold two different matrices)."""
    for p in module.parameters(recurse=False):
        _untie(p)


def install(gpt: nn.Module) -> None:
    """Register :func:`_unshare_before_load` on the modules that own the two parameters (once; a module-level
    function, so that the model still pickles and deep-copies)."""
    owners = [gpt.transformer.wte]
    head = gpt.lm_head
    owners.append(head.linear if type(getattr(head, "linear", None)) is nn.Linear else head)
    for m in owners:
        if getattr(m, "_liger_tied_hooked", False):
            continue
        if hasattr(m, "register_load_state_dict_pre_hook"):  # public from torch 2.5: hook(module, state_dict, ...)
            m.register_load_state_dict_pre_hook(_unshare_before_load)
        else:
            m._register_load_state_dict_pre_hook(_unshare_before_load, with_module=True)
        m._liger_tied_hooked = True
