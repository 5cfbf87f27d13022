"""Activation memory, planned per micro-batch (``LigerConfig.activation_checkpointing=None``, the default).

Long documents change what a training step needs: at a few hundred tokens per micro-batch the Blocks' activations
are small next to the weights, at 16k tokens an 8B model's outgrow an 80 GB card. Before each training forward the
swapped GPT asks :func:`decide` what this micro-batch can keep, from its token count, the model's widths and the
device's memory now (what is allocated, and the gradients the backward will allocate):

* keep every Block's activations (no added time) where they fit;
* else the least added compute that fits, of: recompute the lowest ``k`` Blocks in backward (each keeps only its
  ``(B, T, C)`` input; each costs one more forward of one Block, attention included), and, in ``m`` of the Blocks
  above them, keep neither of the GLU MLP's two ``(B, T, I)`` inputs (``glu_mlp`` for a frozen MLP,
  ``LigerConfig.recompute_mlp``'s fused function for a trained one: two more GEMMs each, the MLP's up-projections;
  more bytes per added FLOP than a whole Block, the more so at long lengths, where attention is a large part of a
  Block's forward). The MLP level applies where the Blocks' MLPs read ``norm_2`` through plain Linears (LoRA on
  attention only, full training; not LoRA on the MLP, 4-bit or float8 weights);
* else recompute every Block and keep their inputs in pinned host memory (``offload``): copied out on a side stream
  as the forward passes each Block, back when its backward needs it. A Block's compute at such lengths (seconds)
  hides the copy (a ``(T, C)`` bf16 tensor: 1 GiB at 128k tokens of width 4096, ~40 ms over PCIe 4).

:func:`kept_bytes_per_token` is the one estimate of a Block's activations (``lit_liger.parallel.dataparallel``'s plans use it
too). The estimate is calibrated on what lit-liger's Blocks keep (the residual stream, q/k/v, the attention output,
the GLU's two inputs; the norms' outputs and the GLU product are recomputed, see ``recompute_norm``); on an
H100 it was 4-5% under the measured bytes at 16k tokens (``benchmarks/results/h100-2026-11-26f``; ``python -m
benchmarks diag graph-gain`` prints them next to it), which :data:`MEMORY_FRACTION`'s margin covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..swap.state import state_of

__all__ = ["ACT_N_EMBD", "ACT_INTERMEDIATE", "MEMORY_FRACTION", "MemPlan", "available_bytes", "grads_to_come",
           "block_forward_flops", "decide", "kept_bytes_per_token", "mlp_recompute_flops", "offloaded",
           "optimizer_state_ahead", "plan_for", "state_ahead"]

#: the values (of the activations' dtype) a Block keeps per token for backward, per unit of ``n_embd`` and of
#: ``intermediate_size``
ACT_N_EMBD, ACT_INTERMEDIATE = 6, 2
#: the share of the device's memory a step may fill (the rest: the CUDA context, cuBLAS workspaces, the allocator's
#: fragmentation, the estimate's error, and what runs beside or after training: validation, litgpt's merge and
#: generation). At 0.9 an 8B LoRA micro-batch of 16k tokens kept every Block on an 80 GB H100 and peaked at 73.1 GB
#: (benchmarks/results/h100-2026-11-26f), over issue 47's 64 GB (half of stock's). At 0.75 the plan recomputes the MLP
#: inputs of 15 of 32 Blocks there (the fewest whole Blocks that fit, 9, would add 12% of step FLOPs): 12,014 tok/s
#: (5.9% under keeping everything) at a 61.0 GB peak (benchmarks/results/h100-2026-11-27b).
MEMORY_FRACTION = 0.75
#: the fused loss's working memory beside the hidden states: its fp32 logits chunk (bytes)
LOSS_CHUNK = 2**30

#: ``ModelState.state_ahead`` (``lit_liger.swap.state``), on the model: what its run will allocate after its first
#: micro-batches beside their activations: callables, each returning the bytes still to come (the ``lit-liger`` command adds the optimizer's state, which PyTorch's optimizers make at their first
#: step, for litgpt's ``fit``, and ``LigerCallback`` the Trainer's for its loop: :func:`optimizer_state_ahead`). :func:`available_bytes` leaves them free, so the first
#: step's plans and CUDA graphs do not take the memory the state needs. Without it Llama-3.1-8B full fine-tuning zero1
#: on 2 x H100 ran out of memory at its first optimizer step: 18.5 GiB of graphs had been captured beside the weights
#: and gradients while the plan still counted the 16 GB of Adam's moments (this device's share) as free
#: (``benchmarks/results/h100x2-2026-11-27``, s4)


def state_ahead(gpt: Any) -> int:
    """The bytes ``gpt``'s ``ModelState.state_ahead`` says are still to come."""
    return sum(int(f()) for f in state_of(gpt).state_ahead)


def _state_slots(optimizer: Any) -> int:
    """Tensors of a parameter's shape and dtype that ``optimizer`` keeps per parameter: 2 for the Adam family (3 with
    ``amsgrad``), SGD 1 with momentum (else 0), RMSprop 1 + momentum + centered, Adagrad 1, Adadelta 2; 2 for any other
    (an upper bound for most; 8-bit optimizers keep less)."""
    name = type(optimizer).__name__.lower()
    groups = getattr(optimizer, "param_groups", [])

    def any_(key: str) -> bool:
        return any(bool(g.get(key)) for g in groups)

    if "adam" in name:
        return 2 + any_("amsgrad")
    if name == "sgd":
        return int(any_("momentum"))
    if name == "rmsprop":
        return 1 + any_("momentum") + any_("centered")
    if name == "adagrad":
        return 1
    return 2


def optimizer_state_ahead(optimizer: Any, mine: Any = None) -> Any:
    """For ``ModelState.state_ahead``: a callable that returns the bytes of ``optimizer``'s state not made yet, for the
    parameters ``mine(p)`` says this process steps (None: all; lit-liger's zero1 steps its share), from
    :func:`_state_slots` and each parameter's size and dtype. 0 once every such parameter has its state."""
    slots = _state_slots(optimizer)
    params = [p for g in getattr(optimizer, "param_groups", []) for p in g["params"] if mine is None or mine(p)]

    def ahead() -> int:
        state = optimizer.state
        return sum(slots * p.numel() * p.element_size() for p in params if not state.get(p))

    return ahead


def block_forward_flops(config: Any, tokens: int) -> float:
    """FLOPs per token of one Block's forward: its matrix multiplies and causal attention over a sequence of
    ``tokens`` (an upper bound for a packed micro-batch of shorter documents)."""
    C, hs = config.n_embd, config.head_size
    intermediate = getattr(config, "intermediate_size", None) or 4 * C
    qkv = C * (config.n_head + 2 * config.n_query_groups) * hs
    return 2 * (qkv + config.n_head * hs * C + 3 * C * intermediate) + 2 * tokens * config.n_head * hs


def mlp_recompute_flops(config: Any) -> float:
    """FLOPs per token that recomputing one Block's ``fc_1`` and ``fc_2`` outputs adds."""
    return 4 * config.n_embd * (getattr(config, "intermediate_size", None) or 4 * config.n_embd)


def kept_bytes_per_token(config: Any, elt: int = 2) -> int:
    """Bytes one Block of a LitGPT ``config`` keeps per token for its backward, activations of ``elt`` bytes."""
    intermediate = getattr(config, "intermediate_size", None) or 4 * config.n_embd
    return elt * (ACT_N_EMBD * config.n_embd + ACT_INTERMEDIATE * intermediate)


@dataclass(frozen=True)
class MemPlan:
    """What one micro-batch keeps: ``recompute`` lowest Blocks recomputed in backward; ``offload``: their inputs
    kept in host memory; ``need``: the estimated bytes of this plan; ``available``: what the device had for it."""

    recompute: int
    offload: bool
    need: float
    available: float
    mlp: int = 0  # Blocks above the recomputed ones whose fc_1 / fc_2 outputs are recomputed in backward

    def line(self, tokens: int, n_layer: int) -> str:
        gib = 2**30
        if not self.recompute and not self.mlp:
            what = "every Block's activations kept"
        elif self.offload:
            what = f"all {n_layer} Blocks recomputed in backward, their inputs kept in pinned host memory"
        else:
            what = f"{self.recompute} of {n_layer} Blocks recomputed in backward"
            if self.mlp:
                what = (f"{self.mlp} of {n_layer} Blocks' MLP inputs recomputed in backward (recompute_mlp)"
                        + (f", {what}" if self.recompute else ""))
        fits = "" if self.need <= self.available else " (does not fit: the run may run out of memory)"
        return (f"lit-liger: memory plan at {tokens:,} tokens per micro-batch: {what}; estimated "
                f"{self.need / gib:.1f} GiB for {self.available / gib:.1f} GiB free{fits} "
                "(--liger.activation_checkpointing true|false overrides)")


def decide(config: Any, tokens: int, available: float, elt: int = 2, allow_offload: bool = True,
           mlp: bool = False) -> MemPlan:
    """The plan for a micro-batch of ``tokens`` tokens through the Blocks of ``config`` with ``available`` bytes for
    its activations: keep everything where it fits; else the recomputed Blocks (and with ``mlp``, Blocks whose MLP
    inputs are recomputed) that fit with the fewest added FLOPs; then host offload (``allow_offload``)."""
    n = config.n_layer
    kept = kept_bytes_per_token(config, elt) * tokens  # one Block, not recomputed
    inp = config.n_embd * elt * tokens  # one recomputed Block's input
    # an MLP-level Block keeps neither (B, T, I) input of its GLU; a frozen MLP (``glu_mlp``) keeps its (B, T, C) input
    # instead, so its saving is counted for both kinds
    glu = ((2 * (getattr(config, "intermediate_size", None) or 4 * config.n_embd) - config.n_embd) * elt * tokens
           if mlp else 0)
    loss = 3 * inp + LOSS_CHUNK  # the final hidden states, their gradient, the loss's chunk
    block_cost, mlp_cost = block_forward_flops(config, tokens), mlp_recompute_flops(config)
    best = None
    for k in range(n + 1):
        # the backward's transient beside what is kept: one Block's gradients (about its activations' size), and
        # with a recomputed Block its rerun's activations too
        need = (n - k) * kept + k * inp + loss + kept * (2 if k else 1)
        m = 0
        if need > available and glu > 0:  # (an MLP narrower than half the width saves nothing)
            m = min(n - k, -(-int(need - available) // glu))
        need -= m * glu
        if need <= available:
            cost = k * block_cost + m * mlp_cost
            if best is None or cost < best[0]:
                best = (cost, MemPlan(k, False, need, available, m))
            if not m:
                break  # (more recomputed Blocks only add time from here)
    if best is not None:
        return best[1]
    need = loss + 2 * kept
    if allow_offload:
        return MemPlan(n, True, need, available)
    return MemPlan(n, False, need + n * inp, available)


_TOTAL: dict[int, int] = {}


def _total_memory(device: Any) -> int:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _TOTAL:
        _TOTAL[index] = torch.cuda.get_device_properties(index).total_memory
    return _TOTAL[index]


def plan_for(gpt: Any, tokens: int, device: Any, elt: int = 2, allow_offload: bool = True,
             mlp: Any = False) -> MemPlan | None:
    """:func:`decide` for a training micro-batch of ``tokens`` through the swapped ``gpt`` on ``device``; None off
    CUDA (CPU runs: nothing to plan). Reading the allocator's statistics costs ~100 us of host time, a few percent of
    a short captured step, so a micro-batch whose activations fit by a wide margin what was free at the last reading
    (less room for everything that can have appeared since: the optimizer's state and gradients of every trainable
    parameter) is planned from that reading; it is taken again every :data:`REREAD_EVERY` calls. ``allow_offload``,
    ``mlp`` (or a function that says it, asked only where something must be recomputed): see :func:`decide`."""
    if getattr(device, "type", None) != "cuda":
        return None
    memo = gpt.__dict__.get("_liger_mem_memo")
    if memo is not None and memo[2] < REREAD_EVERY:
        available, trainable = memo[0], memo[1]
        memo[2] += 1
        plan = decide(gpt.config, tokens, available - 3 * trainable - 2**30, elt)
        if plan.recompute == 0 and plan.mlp == 0:
            return MemPlan(0, False, plan.need, available)
    available = available_bytes(gpt, device)
    trainable = sum(p.numel() * p.element_size() for p in gpt.parameters() if p.requires_grad)
    gpt.__dict__["_liger_mem_memo"] = [available, trainable, 0]
    plan = decide(gpt.config, tokens, available, elt, allow_offload)
    if plan.recompute and (mlp() if callable(mlp) else mlp):  # (the MLP level asked about only where it may help)
        plan = decide(gpt.config, tokens, available, elt, allow_offload, mlp=True)
    return plan


#: training forwards planned from one reading of the allocator (see :func:`plan_for`)
REREAD_EVERY = 64


def available_bytes(gpt: Any, device: Any, fraction: float | None = None) -> float:
    """The bytes a training micro-batch's activations may take on the CUDA ``device`` now: ``fraction`` (None:
    :data:`MEMORY_FRACTION`) of its memory less what is allocated, the gradients the backward will still allocate
    (:func:`grads_to_come`) and what the model's ``state_ahead`` says is still to come."""
    import torch

    share = MEMORY_FRACTION if fraction is None else fraction
    return share * _total_memory(device) - torch.cuda.memory_allocated(device) - grads_to_come(gpt) - state_ahead(gpt)


def grads_to_come(gpt: Any) -> int:
    """The bytes of the gradients the backward will still allocate: trainable parameters without a ``.grad``, less
    those whose gradient buffer the CUDA graphs made at a capture (``lit_liger.runtime.graphs``: allocated already, the
    parameter's ``.grad`` from the first replay on). Counted twice at the first step, the buffers of Llama-3.1-8B
    full fine-tuning (15 GiB) released every pre-captured graph as short of room on an 80 GB card
    (``benchmarks/results/h200x2-2026-11-27i``)."""
    runner = state_of(gpt).runner
    made = runner.buffers if runner is not None else {}
    return sum(p.numel() * p.element_size() for p in gpt.parameters()
               if p.requires_grad and p.grad is None and id(p) not in made)


#: tensors smaller than this stay on the device under :func:`offloaded` (bytes)
OFFLOAD_MIN_BYTES = 1 << 20
_SIDE: dict[int, Any] = {}


class _OnHost:
    """A saved ``(B, T, C)`` tensor moved to host memory by :func:`offloaded`: its copy, the event its copy-out
    recorded (None: a CPU tensor's copy), its device."""

    __slots__ = ("host", "event", "device")

    def __init__(self, host: Any, event: Any, device: Any) -> None:
        self.host, self.event, self.device = host, event, device


def offloaded(width: int, min_bytes: int | None = None) -> Any:
    """A ``saved_tensors_hooks`` context: each ``(B, T, width)`` tensor autograd saves inside it (a checkpointed
    Block's input) goes to pinned host memory, copied on a side stream after the work that made it, and comes back on
    the current stream when backward unpacks it. CPU tensors are copied (what the CPU tests check). (PyTorch's
    ``torch.autograd.graph.save_on_cpu`` moves every saved tensor, ``cos``/``sin`` once per Block included, with a copy
    the current stream waits for: this moves only the Block inputs, off the compute stream.)"""
    import torch

    floor = OFFLOAD_MIN_BYTES if min_bytes is None else min_bytes

    def pack(t: torch.Tensor) -> Any:
        if t.dim() != 3 or t.shape[-1] != width or t.numel() * t.element_size() < floor or t.layout != torch.strided:
            return t
        if not t.is_cuda:
            return _OnHost(t.detach().clone(), None, t.device)
        index = t.device.index
        side = _SIDE.get(index)
        if side is None:
            side = _SIDE[index] = torch.cuda.Stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(side):
            host.copy_(t.detach(), non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        t.record_stream(side)  # (its memory is not reused before the copy has read it)
        return _OnHost(host, event, t.device)

    def unpack(saved: Any) -> torch.Tensor:
        if not isinstance(saved, _OnHost):
            return saved
        if saved.event is None:
            return saved.host
        torch.cuda.current_stream(saved.device).wait_event(saved.event)
        return saved.host.to(saved.device, non_blocking=True)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
