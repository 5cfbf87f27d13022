"""``apply_liger``: the library's entry point. ``lit_liger.swap`` swaps a LitGPT model's modules for the kernels;
``lit_liger.runtime.attach`` gives each swapped GPT what makes its steps fast (CUDA graphs, the memory plan,
generation graphs). The layers below import nothing from here."""

from __future__ import annotations

from torch import nn

from .config import LigerConfig
from .runtime.attach import attach
from .swap.adapter import swap_model
from .swap.report import LigerReport

__all__ = ["apply_liger"]


def apply_liger(model: nn.Module, config: LigerConfig | dict | bool | None = None) -> LigerReport:
    """Swap LitGPT modules inside ``model`` for lit-liger kernels, in place, and give each swapped GPT the runtime.
    Idempotent.

    ``model`` is a ``litgpt.GPT`` (also the LoRA / adapter / adapter_v2 subclasses), a ``litgpt.LLM``, or any module
    that holds one (a LightningModule). Meta-device and GPU models both work (only classes change). Calling it again
    first restores the original classes, then applies ``config``; ``apply_liger(model, False)`` undoes everything.
    Returns a report of what was swapped and what was left alone (and why).
    """
    return swap_model(model, config, attach)
