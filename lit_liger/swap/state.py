"""What one swapped GPT keeps for itself: :class:`ModelState`, on the model as ``gpt._liger_state``.

The counters its forward, its loss and its CUDA graphs add to (what a run reports: tokens, captures, replays), its
graph runner, the plans its run hands it (the optimizer state still to come, the lengths expected), the gradient
callbacks of a data-parallel plan and the warnings it has given. Two swapped models in one process (a policy and its
frozen reference, a teacher and a student, a model and its EMA copy) share the kernels and the process's caches of
compiled code, nothing of this: each run reads its own model's numbers.

``apply_liger`` makes it, ``remove_liger`` drops it with the other ``_liger_`` attributes; a deep copy or a pickle
of the model gets a fresh one with the same runtime (a captured CUDA graph can be neither copied nor pickled; the
copy captures its own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from torch import nn

__all__ = ["CAPTURE_COUNTERS", "ModelState", "state_of", "states_in"]

#: the CUDA graphs' counters and timings (seconds), their meaning in ``lit_liger.runtime.graphs``
CAPTURE_COUNTERS = {"captures": 0, "replays": 0, "release": 0.0, "warmup": 0.0, "forward": 0.0, "backward": 0.0,
                    "first_replay": 0.0, "long": 0, "released": 0, "precaptured": 0, "warmed": 0, "rewarmed": 0,
                    "left_out": 0, "deferred": 0, "first_warmup": 0.0, "gpu_wait": 0.0, "eager_first": 0}


@dataclass(eq=False)
class ModelState:
    """One swapped GPT's own state (see the module's docstring)."""

    #: training tokens: ``collated`` as the loader made them, ``processed`` as the step ran them (bucket padding
    #: included), ``packed`` of them run end to end (``LigerConfig.packing``)
    tokens: dict[str, int] = field(default_factory=lambda: {"collated": 0, "processed": 0, "packed": 0})
    #: the CUDA graphs' counters (:data:`CAPTURE_COUNTERS`)
    captures: dict[str, float] = field(default_factory=lambda: dict(CAPTURE_COUNTERS))
    #: generation's one-token graphs (``lit_liger.runtime.decode``)
    decode: dict[str, int] = field(default_factory=lambda: {"captures": 0, "replays": 0, "failed": 0})
    #: the packed loss's checks that every target was counted: on the host (lengths known) or on the device
    loss_checks: dict[str, int] = field(default_factory=lambda: {"host": 0, "device": 0})
    #: the once-a-model warnings given (their keys)
    warned: set[str] = field(default_factory=set)
    #: the ``lit_liger.runtime.graphs.GraphRunner`` (made on the first captured step)
    runner: Any = None
    #: the generation graphs (``lit_liger.runtime.decode``)
    decoder: Any = None
    #: the runtime's entry points for this model's forward (``lit_liger.runtime.attach``): the swap layer calls
    #: them and imports nothing above it
    runtime: Any = None
    #: callables returning the bytes of optimizer state not made yet (``lit_liger.runtime.memplan.state_ahead``)
    state_ahead: list[Callable[[], int]] = field(default_factory=list)
    #: the packed lengths the run's batches are expected to take (``lit_liger.runtime.graphs.expected_lengths``)
    expected_lengths: Any = None
    #: callbacks ``fn(gpt, segment)`` run when a segment's gradients are ready (``lit_liger._dist.segment_cuts``)
    grads_ready: list[Callable[[nn.Module, int], None]] = field(default_factory=list)
    #: this process holds the whole model under lit-liger's replica plan (``lit_liger.parallel.dataparallel``)
    replica: bool = False
    #: inside ``fused_loss_without_grad``: the forward without grad returns the fused loss's input
    fused_loss_without_grad: bool = False
    #: called with a one-line message when the frozen head starts sharing the embedding's storage
    #: (``lit_liger.swap.tied``)
    on_share: list[Callable[[str], None]] = field(default_factory=list)

    def warn_once(self, key: str) -> bool:
        """True the first time ``key`` is asked for (then the caller warns), False after."""
        if key in self.warned:
            return False
        self.warned.add(key)
        return True

    def __deepcopy__(self, memo: dict) -> ModelState:
        return ModelState(runtime=self.runtime)  # (the runtime's entry points are stateless: shared)

    def __reduce__(self) -> tuple:
        return ModelState, (), {"runtime": self.runtime}

    def counters(self) -> dict[str, dict]:
        """A copy of every counter (for a run's before / after)."""
        return {f.name: dict(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name in ("tokens", "captures", "decode", "loss_checks")}


def state_of(gpt: nn.Module) -> ModelState:
    """``gpt``'s :class:`ModelState` (made on first use)."""
    state = gpt.__dict__.get("_liger_state")
    if state is None:
        state = gpt.__dict__["_liger_state"] = ModelState()
    return state


def states_in(model: nn.Module) -> Iterator[ModelState]:
    """The states of the swapped GPTs inside ``model`` (itself, or under a wrapper: DDP, FSDP, a LightningModule)."""
    for m in model.modules():
        state = m.__dict__.get("_liger_state")
        if state is not None:
            yield state
