"""What the runtime gives a swapped GPT: :data:`RUNTIME`, the entry points its forward calls (``ModelState.runtime``),
and :func:`attach`, which hands them to a GPT that ``lit_liger.swap`` has just swapped and adds the runtime's lines to
the report.

The swap layer imports nothing above it: a swapped GPT's forward reaches the CUDA graphs, the memory plan and the
generation graphs only through the object on its state. A GPT swapped without it (``lit_liger.swap.adapter.
swap_model`` alone) trains eagerly on the kernels: no graphs, no memory plan, no decode graphs.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config import LigerConfig
from ..swap.state import state_of
from . import decode, graphs, memplan

__all__ = ["RUNTIME", "Runtime", "attach"]


class Runtime:
    """The runtime's entry points for a swapped GPT's forward (stateless: what a model keeps is on its
    ``ModelState``). Pickled by reference (a model's state pickles without its runner)."""

    def runner(self, gpt: nn.Module) -> graphs.GraphRunner:
        """``gpt``'s CUDA-graph runner (``lit_liger.runtime.graphs``)."""
        return graphs.runner_for(gpt)

    def decode_step(self, gpt: nn.Module, forward: Any, *args: Any) -> Any:
        """A one-token KV-cache step from a CUDA graph, or None (``lit_liger.runtime.decode.step``)."""
        return decode.step(gpt, forward, *args)

    def decode_drop(self, gpt: nn.Module) -> None:
        decode.drop(gpt)

    def memory_plan(self, gpt: nn.Module, tokens: int, device: Any, elt: int, allow_offload: bool,
                    mlp: Any, tile: Any = False, attend: Any = False) -> memplan.MemPlan | None:
        """The memory plan of a training micro-batch (``lit_liger.runtime.memplan.plan_for``; it raises
        ``memplan.MemoryPlanError`` where nothing fits)."""
        return memplan.plan_for(gpt, tokens, device, elt, allow_offload=allow_offload, mlp=mlp, tile=tile,
                                attend=attend)

    def offloaded(self, width: int) -> Any:
        """Saved activations of at least ``width`` columns go to pinned host memory (``memplan.offloaded``)."""
        return memplan.offloaded(width)

    def to_host(self, t: Any) -> Any:
        """``t`` copied to pinned host memory off the compute stream (``memplan.to_host``)."""
        return memplan.to_host(t)

    def from_host(self, saved: Any) -> Any:
        """What :meth:`to_host` copied out, back on its device (``memplan.from_host``)."""
        return memplan.from_host(saved)

    def __reduce__(self) -> str:
        return "RUNTIME"


RUNTIME = Runtime()


def attach(prefix: str, gpt: nn.Module, cfg: LigerConfig, report: Any) -> None:
    """Give the swapped ``gpt`` the runtime (CUDA graphs, memory plan, generation graphs) as ``cfg`` asks, and say
    so in ``report``."""
    state_of(gpt).runtime = RUNTIME
    if cfg.cuda_graphs_max_tokens is None:
        gpt._liger_graphs_max_tokens = graphs.auto_max_tokens(gpt)
    if cfg.cuda_graphs is not False:
        when = "one CUDA device"
        if cfg.cuda_graphs is None:
            when += " (automatic)"
        report.add(prefix, gpt, f"training forward+backward captured as CUDA graphs per (batch, bucket) shape on "
                                f"{when}, up to {gpt._liger_graphs_max_tokens:,} tokens per micro-batch (cuda_graphs, "
                                "cuda_graphs_max_tokens)")
    if cfg.activation_checkpointing is None:
        report.add(prefix, gpt, "activations planned per micro-batch from its tokens, the device's free memory and "
                                "the host's: every Block's kept where they fit, else the fewest Blocks rerun in "
                                "backward (their MLP over sequence tiles where that fits sooner), else every Block "
                                "rerun with as many inputs on the GPU as fit and the rest in pinned host memory; an "
                                "error before the step where neither memory suffices (one CUDA process or a "
                                "replica; activation_checkpointing automatic)")
    elif cfg.activation_checkpointing:
        graphs_note = "steps run without CUDA graphs; " if graphs.checkpointed_capture_why() else ""
        report.add(prefix, gpt, "each Block's forward recomputed in backward, only its input kept; the loss's logits "
                                "chunk capped at their size; a frozen MLP runs in chunks of rows, recomputed in its "
                                f"backward (single process; {graphs_note}activation_checkpointing)")
    if cfg.cuda_graphs is not False:
        report.add(prefix, gpt, "generation's one-token KV-cache steps replayed from CUDA graphs, one per key length "
                                "(the cache's filled length rounded up to a power of two, masked; one CUDA process; "
                                "lit_liger.runtime.decode)")
