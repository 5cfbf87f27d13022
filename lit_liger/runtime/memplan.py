"""Activation memory, planned per micro-batch (``LigerConfig.activation_checkpointing=None``, the default).

Long documents change what a training step needs: at a few hundred tokens per micro-batch the Blocks' activations
are small next to the weights, at 16k tokens an 8B model's outgrow an 80 GB card. Before each training forward the
swapped GPT asks :func:`decide` (through :func:`plan_for`) what this micro-batch can keep, from its token count, the
model's widths, the device's memory now (what is allocated, the gradients the backward will allocate, the optimizer
state still to come: :class:`Room`) and the host's (:func:`host_room`):

* keep every Block's activations (no added time) where they fit;
* else the least added compute that fits, of: recompute the lowest ``k`` Blocks in backward (each keeps only its
  ``(B, T, C)`` input; each costs one more forward of one Block, attention included), and, in ``m`` of the Blocks
  above them, keep neither of the GLU MLP's two ``(B, T, I)`` inputs (``glu_mlp`` for a frozen MLP,
  ``LigerConfig.recompute_mlp``'s fused function for a trained one: two more GEMMs each, the MLP's up-projections;
  more bytes per added FLOP than a whole Block, the more so at long lengths, where attention is a large part of a
  Block's forward). The MLP level applies where the Blocks' MLPs read ``norm_2`` through plain Linears (LoRA on
  attention only, full training; not LoRA on the MLP, 4-bit or float8 weights);
* else recompute every Block, keep as many of their inputs on the GPU as fit and the inputs of the lowest ``host``
  Blocks in pinned host memory (``MemPlan.host``): copied out on a side stream as the forward passes each Block,
  back when its backward needs it. A Block's compute at such lengths (seconds) hides the copy (a ``(T, C)`` bf16
  tensor: 1 GiB at 128k tokens of width 4096, ~40 ms over PCIe 4). The host's room is read once per model
  (:func:`host_room`);
* where the Blocks' MLPs can run over sequence tiles (``tile``: ``lit_liger.swap.mlp.tiled_mlp``), a recomputed
  Block whose rerun and backward would otherwise hold the MLP's ``(T, I)`` tensors whole runs them one tile of
  :func:`tile_tokens` tokens at a time (``MemPlan.tile``), where that lets the plan fit with fewer added FLOPs or
  fewer inputs on the host (it costs one more MLP forward per recomputed Block);
* where the host cannot pin every input the GPU cannot keep, the lowest offloaded Blocks go in pairs
  (``MemPlan.pairs``, ``lit_liger.swap.gpt._PairFirst`` / ``_PairSecond``): a pair keeps only its first Block's
  input on the host; its backward reruns the first Block without grad to make the second one's input, runs the
  second's backward, then the first's from its input brought back again: one more forward of the first Block, no
  more GPU memory than one offloaded Block's backward (:data:`PAIR_EXTRA_N_EMBD`);
* where neither memory suffices, :class:`MemoryPlanError` before the step's work, naming the bytes each memory lacks
  and the longest micro-batch that would fit.

:func:`kept_bytes_per_token` is the one estimate of a Block's activations (``lit_liger.parallel.dataparallel``'s plans use it
too). The estimate is calibrated on what lit-liger's Blocks keep (the residual stream, q/k/v, the attention output,
the GLU's two inputs; the norms' outputs and the GLU product are recomputed, see ``recompute_norm``); on an
H100 it was 4-5% under the measured bytes at 16k tokens (``benchmarks/results/h100-2026-11-26f``; ``python -m
benchmarks diag graph-gain`` prints them next to it), which :data:`MEMORY_FRACTION`'s margin covers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from ..kernels import _launch
from ..swap.state import state_of

__all__ = ["ACT_N_EMBD", "ACT_INTERMEDIATE", "HOST_FRACTION", "LIMIT_FRACTION", "MEMORY_FRACTION", "MemPlan",
           "MemoryPlanError", "OFFLOADED_EXTRA_N_EMBD", "Room", "TILED_N_EMBD", "TILE_BYTES", "attention_bytes",
           "available_bytes", "block_forward_flops", "decide", "from_host", "grads_to_come", "host_available",
           "host_bytes", "host_room", "keep_attention", "kept_bytes_per_token", "longest_tokens",
           "mlp_recompute_flops", "offloaded", "optimizer_state_ahead", "plan_for", "release_pinned", "room_now",
           "state_ahead", "tile_tokens", "tiled_mlp_flops", "to_host"]

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
#: the share of the device's memory past which a micro-batch truly does not fit: where no plan fits
#: :data:`MEMORY_FRACTION`, the plan may take up to this share (its line says so) before :class:`MemoryPlanError`. An
#: 8B LoRA micro-batch of 16k tokens planned at 0.9 of an 80 GB H100 ran, peaking at 73.1 GB
#: (benchmarks/results/h100-2026-11-26f); the rest holds the CUDA context, cuBLAS workspaces and the allocator's
#: fragmentation
LIMIT_FRACTION = 0.9
#: a tiled MLP's tile (:func:`tile_tokens`): the most bytes one ``(tile, intermediate_size)`` tensor may take, the
#: launch heuristics' (``kernels._launch.MLP_CHUNK_BYTES``, which caps a frozen GLU MLP's chunks too). One tile's working
#: set (:data:`TILE_WORKING` such tensors, 1 GiB) is small next to what a long sequence's Blocks keep (one ``(T, C)``
#: bf16 tensor: 2 GiB at 256k tokens of width 4096)
TILE_BYTES = _launch.MLP_CHUNK_BYTES
#: tiles are a multiple of this many tokens (whole tiles of the GEMMs' 64- and 128-row blocks)
TILE_MULTIPLE = 64
#: ``(tile, intermediate_size)`` tensors one tile's forward and backward hold at once: ``fc_1``'s and ``fc_2``'s
#: outputs and their gradients
TILE_WORKING = 4
#: a recomputed Block whose MLP runs over tiles: the ``(T, n_embd)`` tensors (of the activations' dtype) its rerun and
#: backward hold at their highest, beside its input and the hidden states' gradient. That moment was the attention's
#: backward, after the MLP's: the rerun's normed input, q / k / v, the attention's output, the gradients flowing into
#: and out of it (flash and cuDNN attention's backward add a float32 accumulator of the query's gradient), and the
#: final hidden states that the training loop's output holds; since that backward runs over slices of key/value groups
#: (``swap.attend.sliced_sdpa_backward``) it is the end of the rerun's forward (the norms' outputs, q / k / v, the
#: attention's output, the MLP's and the Block's outputs). Measured on an H200, Llama-3.1-8B LoRA (litgpt's loop,
#: an 80 GB card emulated), beside the weights and the GPU's kept inputs: 14.1 such tensors at 262,144 tokens
#: (benchmarks/results/h200-2026-12-02d, m1) and 15.1 at 131,072 (h200-2026-12-02c, l2), of which two since removed:
#: the embedding's output, which the lowest offloaded Block made a leaf that the graph held (1 tensor, both runs), and
#: the float32 copy of the hidden states under Fabric's output cast (2 tensors at 131k): 13.1 and 12.1. Counted as
#: 11 until the code since (the offloaded pair as two nodes, QLoRA's replaced embedding released, kept attention)
#: measured less, beside the weights, the GPU's inputs and the tile: 10.2 (T, C) tensors at 131,072 tokens and 10.6 at
#: 262,144 (LoRA, h200-2026-12-04b k3, k2), 10.8 at 393,216 (QLoRA, h200-2026-12-04c q1), the input back from the host
#: and the gradient flowing in included; the estimate at 11 (13 with those two) was 4.9%, 8.2% and 11.7% over those
#: peaks. Counted as 10 until the attention's backward ran over slices and the Block's forward let go of its qkv and
#: attention outputs once read (``swap.block``): 8.05 such tensors at 262,144 tokens, those two included (LoRA, 55.4 ->
#: 50.4 GiB, h200-2026-12-04d s1, s2; the same 5 GiB, 2.5 tensors, less at every length). Counted as 7, plus those
#: two (9), plus the tile's working set
TILED_N_EMBD = 7
#: ``(T, C)`` tensors an offloaded Block's backward (its input back from the host, rerun under a reentrant checkpoint)
#: holds beyond :data:`TILED_N_EMBD`, at a moment when the inputs the GPU keeps (the top Blocks', whose backward ran
#: first) are freed: the reentrant rerun's output, held through its backward, and the gradients of the attention's
#: output. Measured: 10.8 such tensors at 262,144 tokens of Llama-3.1-8B LoRA (with every input but two on the host,
#: 36.8 GiB, h200-2026-12-04d s4; with every input on the host and a 40 GiB card the run ran out of memory there, s3,
#: where the plan had counted 9), the input and the gradient flowing in included
OFFLOADED_EXTRA_N_EMBD = 2
#: the share of the host's available memory (:func:`host_available`) the plan may pin for Block inputs: the rest
#: for the data loader's workers, the page cache that reading data and checkpoints uses, the process's own growth.
#: Llama-3.1-8B LoRA at 262,144 tokens (benchmarks/results/h200-2026-12-02d, m1) peaked at 76.7 GiB of host memory
#: (max RSS) with 54 GiB of inputs pinned: 22.7 GiB beside them. At 0.8 of a 128 GB host's ~123 GiB available, a
#: 512k plan would pin 96 GiB (8 pairs), ~119 GiB with the rest, against issue 68's 100; at 0.6, 72 GiB (14 pairs,
#: ~95 GiB with the rest; 6 more Block forwards than at 0.8, ~5% of the step's FLOPs). Shorter runs are unchanged
#: where 0.6 holds their inputs (262k: 60 GiB at most)
HOST_FRACTION = 0.6

#: (T, C) tensors an offloaded pair's backward (``MemPlan.pairs``) holds on the GPU beyond an offloaded Block's: 1 as
#: measured with the pair as one autograd Function, which held the gradient flowing into the pair through its whole
#: backward (H200, 2 x 2048 tokens at Llama-3.2-1B's width: 16.7 MB over the unpaired peak, one such tensor being 16.8
#: MB; benchmarks/results/h200-2026-12-02e); 0 by construction with the pair as two nodes (``swap.gpt._PairFirst`` /
#: ``_PairSecond``), which autograd frees that gradient between; ``tests/test_memplan.py``'s GPU pair test checks it
PAIR_EXTRA_N_EMBD = 0
#: an offloaded Block input's pinned copy is made of pieces whose sizes are this many bytes times a power of two (the
#: binary digits of its size in these units): PyTorch's pinned-memory cache rounds each allocation up to a power of
#: two, which would cost up to twice the input (a 300k-token input of width 4096, 2.3 GiB, would take 4 GiB); pieces
#: take at most this much more than the input, and blocks of one size serve other lengths' inputs too
OFFLOAD_PIECE = 2 * 2**20

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
    parameters ``mine(p)`` says this process steps (None: all; lit-liger's zero1 steps its share) that require grad
    (at each call), from :func:`_state_slots` and each parameter's size and dtype. 0 once every such parameter has its
    state."""
    slots = _state_slots(optimizer)
    params = [p for g in getattr(optimizer, "param_groups", []) for p in g["params"] if mine is None or mine(p)]

    def ahead() -> int:
        # only trainable parameters: PyTorch's optimizers make no state for a parameter without a gradient, and
        # litgpt's LoRA recipes hand the optimizer every parameter, the frozen base included (counted, Llama-3.1-8B's
        # 15 GiB of bf16 weights made 30 GiB of Adam state that never comes: issue 68's "14.2 GiB free")
        state = optimizer.state
        return sum(slots * p.numel() * p.element_size() for p in params if p.requires_grad and not state.get(p))

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
    return 4 * config.n_embd * _intermediate(config)


def tiled_mlp_flops(config: Any) -> float:
    """FLOPs per token that running one recomputed Block's MLP over sequence tiles adds: one more forward of its
    projections (a GLU MLP's three; an upper bound for a two-projection MLP), in the backward's rerun of each tile."""
    return 6 * config.n_embd * _intermediate(config)


def _intermediate(config: Any) -> int:
    return getattr(config, "intermediate_size", None) or 4 * config.n_embd


def kept_bytes_per_token(config: Any, elt: int = 2) -> int:
    """Bytes one Block of a LitGPT ``config`` keeps per token for its backward, activations of ``elt`` bytes."""
    return elt * (ACT_N_EMBD * config.n_embd + ACT_INTERMEDIATE * _intermediate(config))


def tile_tokens(config: Any, tokens: int, elt: int = 2) -> int:
    """Tokens per sequence tile of a recomputed Block's MLP in a micro-batch of ``tokens``: the most multiples of
    :data:`TILE_MULTIPLE` whose ``(tile, intermediate_size)`` tensor of ``elt``-byte values fits :data:`TILE_BYTES`
    (one multiple at least); 0 where the micro-batch fits one tile (nothing to tile)."""
    tile = max(TILE_MULTIPLE, TILE_BYTES // (_intermediate(config) * elt) // TILE_MULTIPLE * TILE_MULTIPLE)
    return tile if tokens > tile else 0


def host_bytes(nbytes: float) -> int:
    """The pinned host memory one offloaded Block input of ``nbytes`` takes (:func:`offloaded`'s pieces)."""
    return -(-int(nbytes) // OFFLOAD_PIECE) * OFFLOAD_PIECE


@dataclass(frozen=True)
class Room:
    """What held a CUDA device's memory when a plan was made (bytes): ``total``, the device's; ``fraction``, the share a
    step may fill (:data:`MEMORY_FRACTION`); ``allocated``, by tensors now (the weights, the rope cache, what the
    loop holds); ``grads``, the gradients the backward will allocate (:func:`grads_to_come`); ``state``, the optimizer
    state still to come (:func:`state_ahead`)."""

    total: float
    fraction: float
    allocated: float
    grads: float
    state: float

    def free(self, fraction: float | None = None) -> float:
        """The bytes left for a micro-batch's activations within ``fraction`` (None: :attr:`fraction`) of the device."""
        share = self.fraction if fraction is None else fraction
        return share * self.total - self.allocated - self.grads - self.state


@dataclass(frozen=True)
class MemPlan:
    """What one micro-batch keeps: the lowest ``recompute`` Blocks are recomputed in backward and keep only their
    input, the lowest ``host`` of them in pinned host memory, the others on the GPU (``offload``: ``host > 0``; made
    with ``offload=True`` and no ``host``, every recomputed Block's); the ``mlp`` Blocks above them recompute their
    MLP inputs in backward; the recomputed Blocks run their MLP over sequence tiles of ``tile`` tokens (0: whole);
    the lowest ``2 * pairs`` of the offloaded Blocks run in pairs, each pair keeping its first Block's input only
    (``host - pairs`` inputs on the host); the lowest ``attn`` recomputed Blocks keep their attention's output and
    log-sum-exp from the forward, so their rerun skips the attention's forward (:func:`keep_attention`), the lowest
    ``attn_host`` of those in pinned host memory, the others on the GPU. ``need``: the estimated bytes of its activations on the GPU;
    ``available``: what the device had for them; ``host_need``: the pinned host memory of the offloaded inputs; ``host_room``: what the host could pin (None: not
    known); ``room``: what held the GPU's memory (None: not read)."""

    recompute: int
    offload: bool
    need: float
    available: float
    mlp: int = 0  # Blocks above the recomputed ones whose fc_1 / fc_2 outputs are recomputed in backward
    host: int = 0
    tile: int = 0
    pairs: int = 0  # the lowest 2 * pairs offloaded Blocks go in pairs: one input on the host per pair
    attn: int = 0  # the lowest attn recomputed Blocks keep their attention's output for the rerun (:func:`keep_attention`)
    attn_host: int = 0  # the lowest attn_host of those keep it in pinned host memory, the others on the GPU
    host_need: float = 0.0
    host_room: float | None = None
    room: Room | None = None

    def __post_init__(self) -> None:
        host = self.host if self.host or not self.offload else self.recompute
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "offload", host > 0)

    @property
    def expected_peak(self) -> float | None:
        """The GPU peak (bytes) the plan expects a step to reach: what is allocated now, the gradients and the optimizer
        state to come and the activations it estimates; None where the device was not read (:attr:`room`)."""
        room = self.room
        return None if room is None else room.allocated + room.grads + room.state + self.need

    def peak_line(self, tokens: int, peak: float, host_peak: float | None) -> str:
        """The log line that holds the plan against what its first step measured: ``peak``, the GPU's highest
        allocation (bytes, ``torch.cuda.max_memory_allocated``) when the next planned forward starts; ``host_peak``,
        the process's peak resident host memory (pinned copies included; None: not known)."""
        gib, expected = 2**30, self.expected_peak
        said = (f"lit-liger: memory plan at {tokens:,} tokens per micro-batch, measured: a GPU peak of "
                f"{peak / gib:.1f} GiB")
        if expected:
            said += f" (the plan expected {expected / gib:.1f} GiB: {peak / expected - 1:+.1%}"
            if self.room.state:  # (with several micro-batches a step, the optimizer may not have stepped yet)
                said += f", of which {self.room.state / gib:.1f} GiB of optimizer state, maybe not allocated yet"
            said += ")"
        if host_peak is not None:
            said += f", host memory at most {host_peak / gib:.1f} GiB"
            if self.host_need:
                said += f" ({self.host_need / gib:.1f} GiB of it pinned for Block inputs)"
        return said

    def line(self, tokens: int, n_layer: int) -> str:
        gib = 2**30
        tiles = f", their MLP in tiles of {self.tile:,} tokens" if self.tile else ""
        pinned = f"{self.host_need / gib:.1f} GiB" + (
            f" of the {self.host_room / gib:.1f} GiB the host can pin" if self.host_room is not None else "")
        if self.pairs:
            pinned += (f"; the lowest {2 * self.pairs} Blocks in pairs, one input kept per pair and the other rerun "
                       f"from it: {self.pairs} more Block forwards")
        if not self.recompute and not self.mlp:
            what = "every Block's activations kept"
        elif self.offload and self.host >= self.recompute == n_layer:
            what = (f"all {n_layer} Blocks recomputed in backward{tiles}, "
                    + (f"{self.host - self.pairs} of " if self.pairs else "")
                    + f"their inputs kept in pinned host memory ({pinned})")
        elif self.offload:
            what = (f"{self.recompute} of {n_layer} Blocks recomputed in backward{tiles}, {self.host - self.pairs} of "
                    f"their inputs kept in pinned host memory ({pinned}), the other {self.recompute - self.host} on "
                    "the GPU")
        else:
            what = f"{self.recompute} of {n_layer} Blocks recomputed in backward{tiles}, their inputs on the GPU"
            if self.mlp:
                what = (f"{self.mlp} of {n_layer} Blocks' MLP inputs recomputed in backward (recompute_mlp)"
                        + (f", {what}" if self.recompute else ""))
        if self.attn:
            where = ("in pinned host memory" if self.attn_host == self.attn else "on the GPU" if not self.attn_host
                     else f"{self.attn_host} in pinned host memory, {self.attn - self.attn_host} on the GPU")
            what += (f"; {self.attn} of them keep their attention's output for the backward's rerun ({where}): "
                     f"{self.attn} attention forwards fewer")
        room = self.room
        est = f"estimated {self.need / gib:.1f} GiB of activations for {self.available / gib:.1f} GiB free"
        if room is not None:
            used = room.allocated + room.grads + room.state
            est += (f" ({(self.available + used) / room.total:.0%} of the GPU's {room.total / gib:.1f} GiB less "
                    f"{room.allocated / gib:.1f} GiB allocated now, {room.grads / gib:.1f} GiB of gradients and "
                    f"{room.state / gib:.1f} GiB of optimizer state to come): a GPU peak of about "
                    f"{self.expected_peak / gib:.1f} GiB")
            share = room.free()
            if share < self.need <= self.available:
                est += (f" (over the {room.fraction:.0%} of the GPU the plan aims for, {share / gib:.1f} GiB: little "
                        "margin)")
        fits = self.need <= self.available and (self.host_room is None or self.host_need <= self.host_room)
        return (f"lit-liger: memory plan at {tokens:,} tokens per micro-batch: {what}; {est}"
                + ("" if fits else " (does not fit: the run may run out of memory)")
                + " (--liger.activation_checkpointing true|false overrides)")


class MemoryPlanError(ValueError):
    """No plan fits a micro-batch: the GPU lacks the room for its activations even with every Block input on the host,
    or the host lacks the room for the inputs the GPU cannot hold. Raised before the micro-batch's work, with
    ``tokens``, ``gpu_need`` / ``gpu_free`` and ``host_need`` / ``host_free`` (bytes; ``host_free`` None: no
    limit) of the plan that needs the least of the GPU, and ``longest``: the most tokens per micro-batch that fit (0:
    none)."""

    def __init__(self, message: str, tokens: int, gpu_need: float, gpu_free: float, host_need: float,
                 host_free: float | None, longest: int) -> None:
        super().__init__(message)
        self.tokens, self.gpu_need, self.gpu_free = tokens, gpu_need, gpu_free
        self.host_need, self.host_free, self.longest = host_need, host_free, longest


def _search(config: Any, tokens: int, available: float, elt: int, host: float | None, mlp: bool,
            tile: bool) -> tuple[MemPlan | None, MemPlan]:
    """``(plan, None)``: :func:`decide`'s plan; ``(None, nearest)``: none fits, ``nearest`` the plan with every Block
    recomputed (tiled where it can be) and as many inputs on the host as the GPU needs (all where even that does not
    fit the GPU) that asks least of the GPU."""
    n = config.n_layer
    C, inter = config.n_embd, _intermediate(config)
    kept = kept_bytes_per_token(config, elt) * tokens  # one Block, not recomputed
    inp = C * elt * tokens  # one recomputed Block's input
    # an MLP-level Block keeps neither (B, T, I) input of its GLU; a frozen MLP (``glu_mlp``) keeps its (B, T, C) input
    # instead, so its saving is counted for both kinds
    glu = (2 * inter - C) * elt * tokens if mlp else 0
    loss = 3 * inp + LOSS_CHUNK  # the final hidden states, their gradient, the loss's chunk
    # the backward's transient beside what is kept: one Block's gradients (about its activations' size), and with a
    # recomputed Block its rerun's activations too. A recomputed Block whose MLP runs over tiles holds no (T, I) tensor
    # whole in either: :data:`TILED_N_EMBD` (T, C) tensors (measured) and one tile's working set
    t = tile_tokens(config, tokens, elt) if tile else 0
    whole = 2 * kept
    tiled = TILED_N_EMBD * C * elt * tokens + TILE_WORKING * t * inter * elt
    if t and tiled >= whole:
        t = 0  # (an MLP so narrow that tiling saves nothing)

    def transient(k: int, tk: int) -> float:
        if not k:
            return kept
        return max(kept if k < n else 0, tiled) if tk else whole

    block_cost, mlp_cost, tile_cost = block_forward_flops(config, tokens), mlp_recompute_flops(config), \
        tiled_mlp_flops(config)
    best = None
    for k in range(n + 1):
        done = False
        for tk in ((0, t) if k and t else (0,)):
            need = (n - k) * kept + k * inp + loss + transient(k, tk)
            m = 0
            if need > available and glu > 0:  # (an MLP narrower than half the width saves nothing)
                m = min(n - k, -(-int(need - available) // glu))
            need -= m * glu
            if need <= available:
                cost = k * (block_cost + (tile_cost if tk else 0)) + m * mlp_cost
                if best is None or cost < best[0]:
                    best = (cost, MemPlan(k, False, need, available, m, tile=tk))
                done = done or not (m or tk)
        if done:
            break  # (more recomputed Blocks only add time from here)
    if best is not None:
        return best[1], None
    # every Block recomputed: as many inputs on the GPU as fit, the lowest Blocks' on the host; tiled where that puts
    # fewer of them there
    per_input = host_bytes(inp)
    chosen = least = None
    for tk in ((0, t) if t else (0,)):
        # every input on the host, then the larger of two moments: the loss (its working set beside the final hidden
        # states) and a Block's backward (its rerun and gradients, the hidden states' gradient flowing into it, its
        # input back from the host): the loss's chunk is freed before the Blocks' backward. Counting both at once
        # put the expected peak 11% over the measured one at 131k tokens of Llama-3.1-8B LoRA (59.1 against 53.2 GiB,
        # benchmarks/results/h200-2026-12-02c, l2); with the tiled transient of 14 (T, C) tensors, 13.5% over at 262k
        # (58.3 against 51.4 GiB, h200-2026-12-02d, m1), hence :data:`TILED_N_EMBD`: 52.2 GiB expected for that run's
        # placement, 5.8% over its peak less the embedding output the graph no longer holds (49.4; not re-measured)
        base = max(loss, transient(n, tk) + inp) + inp
        # an offloaded Block's backward holds more (OFFLOADED_EXTRA_N_EMBD), but the GPU's inputs (the top Blocks')
        # are freed by then: the larger of the two moments
        off = transient(n, tk) + OFFLOADED_EXTRA_N_EMBD * C * elt * tokens + 2 * inp
        h = max(1, min(n, -(-int(base + n * inp - available) // inp)))
        plan = MemPlan(n, False, max(base + (n - h) * inp, off), available, 0, host=h, tile=tk,
                       host_need=h * per_input, host_room=host)
        if host is not None and plan.host_need > host and plan.need <= available:
            # pairs: what their backward holds beyond an offloaded Block's (PAIR_EXTRA_N_EMBD); where that does not
            # fit beside the inputs the GPU keeps, more of them go to the host
            paired_base = max(loss, transient(n, tk) + (1 + PAIR_EXTRA_N_EMBD) * inp) + inp
            paired_off = off + PAIR_EXTRA_N_EMBD * inp
            for more in range(h, n + 1):
                plan = _paired(replace(plan, need=max(paired_base + (n - more) * inp, paired_off), host=more),
                               per_input, host)
                if plan.need <= available:
                    break
        least = plan if least is None or plan.need < least.need else least
        if plan.need <= available and (host is None or plan.host_need <= host) \
                and (chosen is None or (plan.pairs, plan.host) < (chosen.pairs, chosen.host)):
            chosen = plan
    return (chosen, None) if chosen is not None else (None, least)


def _paired(plan: MemPlan, per_input: int, host: float) -> MemPlan:
    """``plan`` (every Block recomputed, ``plan.host`` inputs on the host, more than ``host`` bytes of it) with the
    fewest pairs of offloaded Blocks that bring the host's share within ``host`` (a pair keeps one input there);
    where none does, every pair there can be (the least of the host it can ask). ``plan.need`` is the caller's, with
    what a pair's backward holds beyond an offloaded Block's (:data:`PAIR_EXTRA_N_EMBD`)."""
    pairs = min(plan.host // 2, -(-int(plan.host * per_input - host) // per_input))
    return replace(plan, pairs=pairs, host_need=(plan.host - pairs) * per_input)


def longest_tokens(config: Any, available: float, elt: int = 2, host: float | None = None, mlp: bool = False,
                   tile: bool = False, below: int | None = None) -> int:
    """The most tokens per micro-batch that :func:`decide` finds a plan for (fewer than ``below`` where given; 0:
    none). What a plan needs grows with the tokens, so a bisection finds it."""
    def fits(tokens: int) -> bool:
        return _search(config, tokens, available, elt, host, mlp, tile)[0] is not None

    if below is None:
        below = 1
        while fits(below):
            below *= 2
    lo, hi = 0, below - 1  # (lo fits, or is 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def decide(config: Any, tokens: int, available: float, elt: int = 2, allow_offload: bool = True,
           mlp: bool = False, host: float | None = None, tile: bool = False) -> MemPlan:
    """The plan for a micro-batch of ``tokens`` tokens through the Blocks of ``config`` with ``available`` bytes of the
    GPU for its activations: keep everything where it fits; else the recomputed Blocks (and with ``mlp``, Blocks whose
    MLP inputs are recomputed; with ``tile``, recomputed Blocks whose MLP runs over sequence tiles) that fit with the
    fewest added FLOPs; else every Block recomputed, as many of their inputs kept on the GPU as fit and the lowest
    Blocks' in pinned host memory, at most ``host`` bytes of it (None: no limit; nothing without
    ``allow_offload``). Where nothing fits, :class:`MemoryPlanError`."""
    room = host if allow_offload else 0
    plan, least = _search(config, tokens, available, elt, room, mlp, tile)
    if plan is not None:
        return plan
    gib = 2**30
    longest = longest_tokens(config, available, elt, room, mlp, tile, below=tokens)
    n = config.n_layer
    how = (f"all {n} Blocks recomputed in backward"
           + (f", their MLP in tiles of {least.tile:,} tokens" if least.tile else "")
           + (", all their inputs" if least.host == n and not least.pairs else
              f", {least.host - least.pairs} of their inputs")
           + " in pinned host memory"
           + (f", the lowest {2 * least.pairs} Blocks in pairs (one input kept per pair)" if least.pairs else ""))
    pinnable = ("host memory is not used here: several processes outside lit-liger's replica plan" if not allow_offload
                else "no limit known" if room is None else f"the host can pin {room / gib:.1f} GiB")
    fit = (f"The longest micro-batch that fits: {longest:,} tokens (batch size x sequence length); shorten the "
           "sequences (max_seq_length) or the micro-batch, or free memory." if longest else
           "No micro-batch fits: free memory on the GPU.")
    fit += (" (--liger.activation_checkpointing true, or LigerConfig(activation_checkpointing=True), runs without the "
            "plan: every Block recomputed, its input on the GPU.)")
    raise MemoryPlanError(
        f"lit-liger: no memory plan fits {tokens:,} tokens per micro-batch. The nearest plan ({how}) "
        f"needs {least.need / gib:.1f} GiB of the GPU for activations ({available / gib:.1f} GiB free for them) and "
        f"{least.host_need / gib:.1f} GiB of pinned host memory ({pinnable}). {fit}",
        tokens, least.need, available, least.host_need, room, longest)


_TOTAL: dict[int, int] = {}


def _total_memory(device: Any) -> int:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _TOTAL:
        _TOTAL[index] = torch.cuda.get_device_properties(index).total_memory
    return _TOTAL[index]


def plan_for(gpt: Any, tokens: int, device: Any, elt: int = 2, allow_offload: bool = True,
             mlp: Any = False, tile: Any = False, attend: Any = False) -> MemPlan | None:
    """:func:`decide` for a training micro-batch of ``tokens`` through the swapped ``gpt`` on ``device``; None off
    CUDA (CPU runs: nothing to plan). Reading the allocator's statistics costs ~100 us of host time, a few percent of
    a short captured step, so a micro-batch whose activations fit by a wide margin what was free at the last reading
    (less room for everything that can have appeared since: the optimizer's state and gradients of every trainable
    parameter) is planned from that reading; it is taken again every :data:`REREAD_EVERY` calls. ``allow_offload``,
    ``mlp``, ``tile`` (or functions that say them, asked only where something must be recomputed): see
    :func:`decide`; the host's room: :func:`host_room`. Planned within :data:`MEMORY_FRACTION` of the device, or,
    where nothing fits there, within :data:`LIMIT_FRACTION` (the line says so); :class:`MemoryPlanError` where
    nothing fits that either. ``attend`` (or a function that says it, asked only where inputs go to the host): the
    Blocks' attention can keep its output for the rerun; the room the plan leaves then goes to that
    (:func:`keep_attention`)."""
    if getattr(device, "type", None) != "cuda":
        return None
    config = gpt.config
    memo = gpt.__dict__.get("_liger_mem_memo")
    if memo is not None and memo[2] < REREAD_EVERY:
        available, trainable = memo[0], memo[1]
        memo[2] += 1
        plan, _ = _search(config, tokens, available - 3 * trainable - 2**30, elt, 0, False, False)
        if plan is not None and plan.recompute == 0 and plan.mlp == 0:
            return MemPlan(0, False, plan.need, available)
    room = room_now(gpt, device)
    available = room.free()
    trainable = sum(p.numel() * p.element_size() for p in gpt.parameters() if p.requires_grad)
    gpt.__dict__["_liger_mem_memo"] = [available, trainable, 0]
    host = host_room(gpt) if allow_offload else 0
    plan, _ = _search(config, tokens, available, elt, host, False, False)
    if plan is None or plan.recompute:  # (the MLP level and the tiles asked about only where they may help)
        wide, tiled = (bool(f() if callable(f) else f) for f in (mlp, tile))
        plan, _ = _search(config, tokens, available, elt, host, wide, tiled)
        if plan is None:  # (nothing fits the share the plan aims for: the device's limit, or the error)
            plan = decide(config, tokens, room.free(LIMIT_FRACTION), elt, allow_offload, wide, host, tiled)
    plan = replace(plan, host_room=host if allow_offload else None, room=room)
    if plan.host and (attend() if callable(attend) else attend):
        plan = keep_attention(plan, config, tokens, elt)
    return plan


def attention_bytes(config: Any, tokens: int, elt: int = 2) -> tuple[int, int]:
    """The bytes of one Block's attention output (``tokens x n_head x head_size`` values of ``elt`` bytes) and of its
    float32 log-sum-exp (one per token and head)."""
    return tokens * config.n_head * config.head_size * elt, tokens * config.n_head * 4


def keep_attention(plan: MemPlan, config: Any, tokens: int, elt: int = 2) -> MemPlan:
    """``plan`` (Blocks recomputed, inputs on the host) with the room it leaves given to the recomputed Blocks'
    attention: each Block that keeps its attention's output and log-sum-exp from the forward skips the attention's
    forward in its rerun (``lit_liger.swap.attend.kept_sdpa``), a third of what the attention costs a recomputed Block
    beside its backward (flash-style backwards run the scores again), and the most of a long sequence's step: at
    262,144 tokens of Llama-3.1-8B the attention was ~150 s of a 168 s step, its reruns ~33 s of it
    (benchmarks/results/h200-2026-12-02d). The host's room left by the inputs first (``attn_host``), then the GPU's
    (``need`` stays within ``available``); the lowest Blocks first (an offloaded pair's first Block reruns twice)."""
    out, lse = attention_bytes(config, tokens, elt)
    per_host, per_gpu = host_bytes(out) + host_bytes(lse), out + lse
    spare_host = 0.0 if plan.host_room is None else plan.host_room - plan.host_need
    on_host = min(plan.recompute, max(0, int(spare_host // per_host)))
    on_gpu = min(plan.recompute - on_host, max(0, int((plan.available - plan.need) // per_gpu)))
    if not on_host + on_gpu:
        return plan
    return replace(plan, attn=on_host + on_gpu, attn_host=on_host, need=plan.need + on_gpu * per_gpu,
                   host_need=plan.host_need + on_host * per_host)


#: training forwards planned from one reading of the allocator (see :func:`plan_for`)
REREAD_EVERY = 64


def room_now(gpt: Any, device: Any, fraction: float | None = None) -> Room:
    """What holds the CUDA ``device``'s memory now (:class:`Room`), for a step of ``gpt`` that may fill ``fraction``
    (None: :data:`MEMORY_FRACTION`) of it."""
    import torch

    return Room(float(_total_memory(device)), MEMORY_FRACTION if fraction is None else fraction,
                float(torch.cuda.memory_allocated(device)), float(grads_to_come(gpt)), float(state_ahead(gpt)))


def available_bytes(gpt: Any, device: Any, fraction: float | None = None) -> float:
    """The bytes a training micro-batch's activations may take on the CUDA ``device`` now: ``fraction`` (None:
    :data:`MEMORY_FRACTION`) of its memory less what is allocated, the gradients the backward will still allocate
    (:func:`grads_to_come`) and what the model's ``state_ahead`` says is still to come (:func:`room_now`)."""
    return room_now(gpt, device, fraction).free()


#: where :func:`host_available` reads the host's memory (Linux), and a container's limit (cgroup v2, then v1: the
#: limit, the usage, the statistics whose inactive file pages the kernel can reclaim)
MEMINFO = "/proc/meminfo"
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat"))


def _read_ints(path: str) -> dict[str, int]:
    """``name value`` lines of ``path`` (``/proc/meminfo``'s ``Name: value kB`` in bytes); a lone value as ``""``."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.replace(":", " ").split()
            if len(parts) == 1 and parts[0].isdigit():
                out[""] = int(parts[0])
            elif len(parts) >= 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1]) * (1024 if parts[2:] == ["kB"] else 1)
    return out


def host_available() -> int | None:
    """Bytes of host memory available now: Linux's ``MemAvailable`` (:data:`MEMINFO`; else the free pages,
    ``os.sysconf``), capped by a container's memory limit less what it uses (its inactive file pages counted free, as
    the kernel reclaims them; :data:`CGROUP_FILES`); None where nothing can be read."""
    avail = None
    try:
        avail = _read_ints(MEMINFO).get("MemAvailable")
    except (OSError, ValueError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    for limit_file, usage_file, stat_file in CGROUP_FILES:
        try:
            limit, usage = _read_ints(limit_file).get(""), _read_ints(usage_file).get("")
        except (OSError, ValueError):
            continue
        if limit is None or usage is None or limit >= 1 << 60:  # ("max", or v1's unlimited: no limit)
            continue
        try:
            stat = _read_ints(stat_file)
        except (OSError, ValueError):
            stat = {}
        room = max(0, limit - usage + stat.get("inactive_file", stat.get("total_inactive_file", 0)))
        avail = room if avail is None else min(avail, room)
        break
    return avail


def host_room(gpt: Any) -> float | None:
    """The pinned host memory ``gpt``'s offloaded Block inputs may take (bytes; None: not known, no limit):
    :data:`HOST_FRACTION` of :func:`host_available`, split between the processes of this host (torchrun's
    ``LOCAL_WORLD_SIZE``). Read at the model's first plan and kept on the model: PyTorch's pinned-memory cache keeps
    the buffers the first offloaded step pinned for the steps after it, so a later reading would count this run's own
    inputs as taken."""
    cached = gpt.__dict__.get("_liger_host_room")
    if cached is None:
        avail = host_available()
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "") or 1))
        except ValueError:
            local = 1
        cached = gpt.__dict__["_liger_host_room"] = (None if avail is None else HOST_FRACTION * avail / local,)
    return cached[0]


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
    """A saved ``(B, T, C)`` tensor moved to host memory by :func:`offloaded`: its copy (a CUDA tensor's: its pinned
    pieces, :func:`_into_pieces`), the event its copy-out recorded (None: a CPU tensor's copy), its device, shape and
    dtype."""

    __slots__ = ("host", "event", "device", "shape", "dtype")

    def __init__(self, host: Any, event: Any, device: Any, shape: Any = None, dtype: Any = None) -> None:
        self.host, self.event, self.device, self.shape, self.dtype = host, event, device, shape, dtype


def _piece_bytes(nbytes: int) -> list[int]:
    """The sizes of the pieces that hold ``nbytes`` (:data:`OFFLOAD_PIECE` times the powers of two of the binary
    digits of ``nbytes`` in those units, rounded up; largest first): :func:`host_bytes` in all."""
    units = -(-int(nbytes) // OFFLOAD_PIECE)
    return [OFFLOAD_PIECE << j for j in reversed(range(units.bit_length())) if units >> j & 1]


def _into_pieces(flat: Any, pin: bool) -> list:
    """Copies of the 1-D tensor ``flat`` into new host tensors of :func:`_piece_bytes` sizes (pinned with ``pin``),
    each copy non-blocking (on the current stream); the last piece's tail unused."""
    import torch

    pieces, start, elt = [], 0, flat.element_size()
    for size in _piece_bytes(flat.numel() * elt):
        piece = torch.empty(size // elt, dtype=flat.dtype, pin_memory=pin)
        n = min(piece.numel(), flat.numel() - start)
        piece[:n].copy_(flat[start:start + n], non_blocking=True)
        pieces.append(piece)
        start += n
    return pieces


def _out_of_pieces(pieces: list, flat: Any) -> Any:
    """``flat`` (1-D) filled from ``pieces`` (:func:`_into_pieces`), each copy non-blocking."""
    start = 0
    for piece in pieces:
        n = min(piece.numel(), flat.numel() - start)
        flat[start:start + n].copy_(piece[:n], non_blocking=True)
        start += n
    return flat


def to_host(t: Any) -> Any:
    """``t`` copied to host memory (:class:`_OnHost`): a CUDA tensor's into pinned pieces (:func:`_into_pieces`) on a
    side stream, after the work that made it (its memory not reused before the copy has read it); a CPU tensor's
    cloned (what the CPU tests check). :func:`from_host` brings it back."""
    import torch

    if not t.is_cuda:
        return _OnHost(t.detach().clone(), None, t.device)
    index = t.device.index
    side = _SIDE.get(index)
    if side is None:
        side = _SIDE[index] = torch.cuda.Stream(t.device)
    src = t.detach()
    if not src.is_contiguous():
        src = src.contiguous()  # (on the current stream, before the side stream waits for it)
    side.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(side):
        pieces = _into_pieces(src.view(-1), pin=True)
        event = torch.cuda.Event()
        event.record(side)
    src.record_stream(side)  # (its memory is not reused before the copy has read it)
    return _OnHost(pieces, event, t.device, t.shape, t.dtype)


def from_host(saved: Any) -> Any:
    """The tensor :func:`to_host` copied out, on its device again (copied in on the current stream); anything else
    as it is."""
    import torch

    if not isinstance(saved, _OnHost):
        return saved
    if saved.event is None:
        return saved.host
    torch.cuda.current_stream(saved.device).wait_event(saved.event)
    out = torch.empty(saved.shape, dtype=saved.dtype, device=saved.device)
    _out_of_pieces(saved.host, out.view(-1))
    return out


def _pinned_held() -> float | None:
    """The bytes PyTorch's pinned-memory allocator holds (in use and cached; None where this PyTorch does not say)."""
    import torch

    stats = getattr(torch.cuda, "host_memory_stats", None)
    try:
        held = stats() if stats is not None else {}
    except Exception:  # (a PyTorch without the host allocator's statistics)
        return None
    for key in ("reserved_bytes.current", "allocated_bytes.current"):  # (the names vary between versions)
        if key in held:
            return float(held[key])
    return None


def release_pinned() -> str | None:
    """Hand back to the system the pinned host memory PyTorch's allocator keeps cached once the offloaded Block inputs
    and kept attention outputs of training are freed (``torch.accelerator.empty_host_cache``): what follows training
    (litgpt's ``merge_lora`` loads a whole checkpoint on the host) starts from the host memory training had before it
    pinned. Blocks still in use stay. Returns the log line, or None where nothing was released or this PyTorch cannot."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) \
        or getattr(torch._C, "_host_emptyCache", None)
    before = _pinned_held()
    if empty is None or not before:
        return None
    torch.cuda.synchronize()  # (a cached block is handed back once the copies that used it have finished)
    empty()
    after = _pinned_held() or 0.0
    if after >= before:
        return None
    went = before - after
    amount = f"{went / 2**30:.2f} GiB" if went >= 2**30 else f"{went / 2**20:.0f} MiB"
    return f"lit-liger: training ended: {amount} of pinned host memory (offloaded activations' copies) handed back to " \
           "the system"


def offloaded(width: int, min_bytes: int | None = None) -> Any:
    """A ``saved_tensors_hooks`` context: each ``(B, T, width)`` tensor autograd saves inside it (a checkpointed
    Block's input) goes to pinned host memory (:func:`to_host`), copied on a side stream after the work that made it,
    and comes back on the current stream when backward unpacks it (:func:`from_host`). (PyTorch's
    ``torch.autograd.graph.save_on_cpu`` moves every saved tensor, ``cos``/``sin`` once per Block included, with a copy
    the current stream waits for: this moves only the Block inputs, off the compute stream.) The pinned copy is made of
    pieces (:data:`OFFLOAD_PIECE`), not one buffer that PyTorch's pinned-memory cache would round up to a power of
    two."""
    import torch

    floor = OFFLOAD_MIN_BYTES if min_bytes is None else min_bytes

    def pack(t: torch.Tensor) -> Any:
        if t.dim() != 3 or t.shape[-1] != width or t.numel() * t.element_size() < floor or t.layout != torch.strided:
            return t
        return to_host(t)

    return torch.autograd.graph.saved_tensors_hooks(pack, from_host)
