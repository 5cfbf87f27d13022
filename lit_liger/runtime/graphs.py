"""CUDA graphs of the swapped model's training forward and backward (``LigerConfig.cuda_graphs``).

At the micro-batches litgpt's fine-tuning recipes use (1-4 samples of a few hundred tokens) a training
step is bound by the host: the GPU runs a 1B model's forward and backward faster than Python can issue
its ~2,000 kernel launches. A CUDA graph replays all of them with one call.

What is captured, per ``(batch, bucket)`` input shape (``LigerConfig.seq_buckets`` keeps those few):
the swapped GPT's training body, token ids -> final hidden states (embedding, every Block, ``ln_f``), as
two graphs: the forward, and the backward from a gradient of the hidden states to the gradients of the
trainable parameters. The fused loss (lm_head + cross-entropy: a few launches), the optimizer step and
everything else the training loop does run as before. :class:`_Replay` joins them to autograd: its
forward replays the forward graph; its backward replays the backward graph and hands autograd the
parameters' gradients, which it accumulates into ``.grad`` as usual (gradient accumulation works); with
in one process (or lit-liger's replica plan) the replay adds them straight into ``.grad`` instead.

Memory: every shape's graphs share one memory pool (one set of activations, the largest bucket's), one
set of gradient buffers for the trainable parameters (a LoRA's are tiny; full fine-tuning pays one copy of
the trainable parameters' size, none where they serve as ``.grad``) and one buffer each for the hidden states and their gradient. Each shape's warm-up allocates from that pool too, so the warm-ups never sit beside
it (measured: they set the run's peak reserved memory before). Dropout (LoRA dropout) draws fresh random numbers on every replay
(PyTorch's generator is graph-aware).

Never silently wrong: a replay reads the parameters and buffers at the addresses they had at capture, so
every call compares those addresses and recaptures if one moved (``param.data = ...``, a new RoPE cache).
The shared pool holds one forward's activations at a time, so a forward that comes while a replayed
forward's backward is still due (two forwards, then their backwards) runs uncaptured; a backward whose
activations were replayed over all the same (possible only through ``retain_graph``) raises. Where capture cannot apply (several processes,
autocast, module hooks, ``torch.compile``, FlexAttention layers with :data:`CAPTURE_FLEX` off, a capture error) the step runs
uncaptured, with one warning.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from .. import _dist
from .._dist import sharded_processes, whole_model
from ..swap.state import state_of, states_in
from ..kernels import _grad_into
from .memplan import _total_memory
from ..swap.quant import is_4bit

__all__ = ["GraphRunner", "MAX_GRAPHS", "capture_report", "release", "runner_for"]


@contextlib.contextmanager
def _captured_attention(gpt: nn.Module) -> Iterator[None]:
    """While a shape's warm-up and capture run, each of ``gpt``'s attention modules says so (``_liger_capturing``):
    ``sdpa_backend="auto"`` picks the kernel measured fastest for replayed steps there
    (``lit_liger.swap.attend.sdpa_backend_for``). On the modules, not the process: another model's steps meanwhile
    keep their own choice."""
    mods = [m for m in gpt.modules() if hasattr(m, "_liger_sdpa_flags")]
    for m in mods:
        m.__dict__["_liger_capturing"] = True
    try:
        yield
    finally:
        for m in mods:
            m.__dict__.pop("_liger_capturing", None)

#: torch.cuda.graph's capture_error_mode: only this thread's CUDA calls are checked (a data loader's
#: pin-memory thread may allocate page-locked memory meanwhile)
CAPTURE_ERROR_MODE = "thread_local"

#: capture steps with active dropout (LoRA dropout): PyTorch's CUDA generator is graph-safe, so every
#: replay draws fresh random numbers
CAPTURE_DROPOUT = True

#: run each shape's warm-up with its allocations in the graphs' memory pool: the capture that follows reuses the
#: blocks the warm-up freed. Outside the pool, the warm-up's freed blocks stay cached for the side stream and the
#: pool grows beside them: measured (H100, Llama-3.2-1B LoRA B4, `python -m benchmarks diag recipe-mem`) the run's
#: peak reserved memory was set by such a warm-up, 2 GB above the steady state
WARMUP_IN_POOL = True

#: the warm-up pass above runs only where a capture would otherwise record first-call work: a model's first capture
#: since its graphs were last released (the capture stream's own state), a shape whose attention builds per-shape state
#: (unpacked micro-batches, rare under packing (``lit_liger.swap.packing.plan``): cuDNN attention plans each (batch, length);
#: FlexAttention layers compile per length), a driver
#: older than CUDA 12.3 (which cannot load a kernel's module inside a capture). A packed length after the first is
#: recorded with no warm-up (flash attention over cumulative lengths has no per-length state), under
#: :func:`_compile_guard`: a Triton kernel that would compile there stops the capture, which starts again with a
#: warm-up. That includes the replicas' first-step pre-capture (``GraphRunner._precapture``). Measured before it
#: (``benchmarks/results/h200x2-2026-11-27d``, ``h100-2026-11-27b``): the warm-ups were 4.79 of 7.05 s of captures at
#: Llama-3.1-8B full fine-tuning on 2 GPUs (18% of a 39 s run) and 0.61 of 1.09 s at Llama-3.2-1B LoRA (the switch
#: that compared them left in issue 67: docs/performance-trail.md). So only a model's first capture warms up
#: (:meth:`GraphRunner._warmup_needed`)

#: the first micro-batch since a model's graphs were made or released runs uncaptured, as the run's real step, and
#: tells the runner the hidden states' width and dtype (:meth:`GraphRunner.note_hidden`); the captures from the next
#: micro-batch on are then recorded without a warm-up pass where they may be (packed lengths, guarded
#: by :func:`_compile_guard`). The warm-up pass before a model's first capture was a forward and backward whose results
#: were thrown away, and in a new process it also made every kernel's first call and Triton's compilations
#: (0.14-0.16 s of a shipped Llama-3.2-1B recipe's captures on an H200 with Triton's disk cache, 0.9-1.3 s without,
#: ``benchmarks/results/h200-2026-11-29e``); the uncaptured step makes those first calls as part of the training.
#: Where a trainable parameter's ``.grad`` from that step is a plain tensor and the replay adds into ``.grad`` directly
#: (one process), it becomes that parameter's gradient buffer (:meth:`GraphRunner.grad_buffers`): no second
#: copy of the gradients (16 GB at Llama-3.1-8B full fine-tuning). One process only: several processes (DDP, lit-liger's
#: replicas and their first-step pre-capture) warm up as before, since no 2-GPU machine was lent to measure it there.
#: Measured on an H200 through the shipped 1B recipes (``benchmarks/results/h200-2026-11-29f``): the captures' share of
#: litgpt's Training Time 3.0-3.9% on a fresh machine (7.6-8.6% before) and 3.4-3.6% warm (3.9-5.1%). False: the first
#: micro-batch is captured, after a warm-up pass
EAGER_FIRST = True

#: the CUDA driver (``cuDriverGetVersion``) from which a capture may load a kernel's module: CUDA 12.3 (NVIDIA Warp's
#: documentation of graph capture and module loading)
CAPTURE_LOADS_FROM_DRIVER = 12030

#: a shape longer than any captured so far drops the captured graphs (and their pool) and is captured first, so
#: that the pool's blocks are sized for the longest shape. Off: measured (H100, Llama-3.2-1B LoRA B4, 64 steps,
#: `python -m benchmarks diag recipe-mem`) it saves 0.34 GB of pool at the end but raises the run's peak reserved
#: memory by 1.1 GB (8.00 vs 6.90 GB with WARMUP_IN_POOL): the training loop still holds the last step's outputs, and with
#: them the old graphs and their pool, while the new shape's warm-up and capture run
RECAPTURE_ON_GROWTH = False

#: before each capture, hand the allocator's cached but unused blocks back to the device
#: (``torch.cuda.empty_cache``), so that the graphs' pool can grow into them. litgpt's scripts run a validation pass
#: before training, whose freed activations stay cached in the default pool, where the graphs' private pool cannot
#: use them: reserved memory is then that cache plus the pool (measured on an H100, litgpt's LoRA recipe at micro-batch
#: 4: 7.26 -> 6.95 GB reserved). It runs once per captured shape, next to a capture's ~200 ms
EMPTY_CACHE_BEFORE_CAPTURE = True

#: a capture records while the GPU still runs the work queued before it. ``torch.cuda.graph`` synchronizes the device
#: and empties the allocator's caches (the device's and the pinned host memory's) before every graph it records, a
#: shape's forward and each backward segment; a recording then costs the run its whole host time (~65 ms at
#: Llama-3.2-1B, ``benchmarks/results/h200-2026-11-29``) with the GPU idle. Here the graphs are recorded with
#: ``capture_begin`` / ``capture_end`` on the runner's side stream, which needs neither: the recorded kernels run only
#: when the graph is replayed, on the current stream after everything queued before it, and the side stream's warm-up
#: pass waits for that stream first. The GPU keeps running what the host queued before the capture meanwhile (one
#: iteration in litgpt's loops, see ``lazylog.LAG``); the GPU's wait is measured (``ModelState.captures["gpu_wait"]``) and
#: reported. The device's cache is still emptied before a capture where the pool may need it
#: (:data:`RELEASE_BELOW_FREE`). ``tests/test_buckets.py`` checks a capture recorded behind ~2 s of queued GPU work
#: (losses, gradients, the GPU's wait) and full fine-tuning queued far ahead of the GPU. Measured through litgpt's CLI
#: (Llama-3.2-1B, 200 iterations, H200, ``benchmarks/results/h200-2026-11-29c``): the GPU waits 0.5-0.7 s for a run's
#: 8 captures, about their host time, since the host is rarely ahead when they come (against ``torch.cuda.graph``'s
#: synchronize before each: the switch left in issue 67, docs/performance-trail.md). See :func:`_recording`

#: a capture first synchronizes and empties the allocator's cache
#: (:data:`EMPTY_CACHE_BEFORE_CAPTURE`) only where it is the model's first since its pool was made, or the device's
#: free memory is below this fraction of its total: the memory the graphs' pool grows into. A capture needs a fraction
#: of a GiB at Llama-3.2-1B's recipes and the pool's growth at 8B and 16k tokens is a few GiB
RELEASE_BELOW_FREE = 0.25

#: capture models with FlexAttention layers (softcap / sliding window). Measured on an H100 (torch 2.11, gemma-2-2b,
#: litgpt's LoRA recipe with buckets): a replay after the second bucket's capture used to fail with "an illegal
#: memory access". The cause found: each new length's FlexAttention block mask was built during that shape's
#: warm-up, whose allocations go to the graphs' shared pool (WARMUP_IN_POOL), so the cached mask could sit in an
#: earlier graph's scratch blocks and be overwritten by its replay; block masks are now built outside the pools
#: (``attention._outside_graph_pools``). With that, on an H100: litgpt's LoRA recipe on a 2-layer gemma-2-2b ran
#: captured (4.10x stock tokens/s, 1.23x uncaptured lit-liger), and gemma-2 captured across four buckets gives the
#: uncaptured losses and gradients (tests/test_buckets.py; it once aborted its process after other graph tests, a
#: garbage collection inside the routed warm-up, now kept out by ``_no_gc``). False: such models run uncaptured,
#: with :data:`FLEX_WHY` as the warning
CAPTURE_FLEX = True
FLEX_WHY = ("FlexAttention layers (softcap / sliding window) are not captured (lit_liger.runtime.graphs.CAPTURE_FLEX is "
            "off)")

#: capture steps of a model with ``LigerConfig.activation_checkpointing``. The recompute rewinds the CUDA generator to
#: replay the forward's dropout masks, which PyTorch allows inside a capture from 2.10 on (pytorch#162505; earlier
#: versions raise, and such steps run uncaptured with a warning). Off: they run uncaptured, with
#: :data:`CHECKPOINT_WHY` as the warning. ``tests/test_checkpointing.py::test_gpu_graphs_capture_checkpointed_steps``
#: checks a captured, checkpointed LoRA model with dropout against the uncaptured model without checkpointing
#: (passed on an H100, torch 2.11). Measured there, Llama-3.2-1B LoRA recipe: 16.0x stock's tokens/s at micro-batch
#: 1 captured vs 1.9x uncaptured (the recompute doubles the host's forward work)
CAPTURE_CHECKPOINTED = True
CHECKPOINT_WHY = ("activation_checkpointing is on: its recomputed Blocks are not captured "
                  "(lit_liger.runtime.graphs.CAPTURE_CHECKPOINTED is off)")



def checkpointed_capture_why() -> str | None:
    """Why steps with activation checkpointing cannot be captured here, or None."""
    if not CAPTURE_CHECKPOINTED:
        return CHECKPOINT_WHY
    if torch.__version__ < "2.10":  # (TorchVersion compares as a version)
        return "activation_checkpointing: torch < 2.10 cannot rewind the CUDA generator inside a capture"
    return None


#: the replayed backward adds the trainable parameters' gradients straight into their ``.grad`` tensors (the graphs'
#: gradient buffers become ``.grad``; see :class:`_Replay`). False: the backward writes them into the buffers and hands
#: them to autograd, which copies each into a new ``.grad`` where there was none: a second copy of every trained
#: parameter (nothing for LoRA, 2.5 GB for a 1B model's full fine-tuning). Measured on an H100 (Llama-3.2-1B, litgpt's
#: full recipe, micro-batch 4, ``benchmarks/results/h100-2026-11-25d``): peak allocated equal to the uncaptured run's
#: (15.1 GB), 1.8-2.0x its tokens/s. Where autograd's accumulation must see them (a DDP replica, a tensor hook) they go
#: through autograd.
#:
#: the captured backward's GEMMs that make a weight's gradient add it into ``.grad`` themselves
#: (``kernels._grad_into``: the fused norm -> Linear, the GLU MLP's proj, the attention's proj), instead of writing it
#: to a new tensor that one ``_foreach_add_`` then adds to ``.grad``: two reads and a write of every such gradient
#: less per micro-batch (the variant that measured it left in issue 67: docs/performance-trail.md).
#:
#: ``cuda_graphs=None`` (automatic) captures full fine-tuning and pretraining too, not only runs that train at most 1/8
#: of the parameters (LoRA, adapters). It used to leave them uncaptured: the replayed backward's gradient buffers sat
#: beside autograd's ``.grad`` copies, a second copy of every trained parameter (measured on an H100, Llama-3.2-1B,
#: litgpt's full recipe at micro-batch 4: 18.06 vs 15.09 GB). The buffers are now the ``.grad`` tensors themselves
#: (see :class:`_Replay`). Only where the gradients can go straight into ``.grad`` (one process, or lit-liger's replica
#: plan): inside a DDP replica the automatic mode still captures only LoRA-style runs (:meth:`GraphRunner.hidden`)

#: distinct input shapes captured per model; a new shape beyond this runs uncaptured (with a warning)
MAX_GRAPHS = 48

#: ``ModelState.captures`` (``lit_liger.swap.state``), on each model: what its captures cost (host seconds per phase;
#: the CLI reports its model's after a run, see :func:`capture_report`); ``gpu_wait`` the seconds the GPU's stream that trains waited for them (see
#: :func:`_recording`: a recording made while the GPU runs queued work costs the run only what is left of
#: it): ``release`` the synchronize + ``empty_cache`` before a capture, ``warmup`` the shape's uncaptured forward and
#: backward, ``forward`` / ``backward`` recording and instantiating the two graphs,
#: ``first_replay`` the new forward graph's first replay (its upload to the device); ``warmed`` the captures that ran a
#: warm-up pass (:meth:`GraphRunner._warmup_needed`), ``rewarmed`` the captures without one that met a Triton compilation and started
#: again with one; ``left_out`` the ladder's lengths the replicas' pre-capture left out as rare in the data
#: (``ModelState.expected_lengths``), ``deferred`` the micro-batches run uncaptured before their shape's capture
#: (:data:`CAPTURE_AFTER`); ``eager_first`` the first micro-batches since a reset, run uncaptured in place of a warm-up
#: pass (:data:`EAGER_FIRST`: training steps, not capture time); ``first_warmup`` the process's first warm-up pass (in
#: ``warmup`` too), which also makes every kernel's first call: Triton's compilations (1.1-1.4 s of a 1B model's on an
#: H200 without Triton's disk cache, against 0.13-0.15 s with it, ``benchmarks/results/h200-2026-11-29``), cuBLAS's and
#: attention's set-up, which an uncaptured run's first step makes too

#: a warm-up pass has run in this process: its Triton kernels are compiled, cuBLAS and attention set up (the first
#: one's seconds are ``first_warmup``); a fact about the process's caches of compiled code, not about a model
_PROCESS_WARMED = [False]

#: a captured step's GPU work grows with its tokens x the parameters of a Block, its host work (the launches it
#: saves) does not: past this product capture buys little and holds a pool of activations. ``auto_max_tokens`` divides
#: it by one Block's parameters (Llama-3.1-8B: 218 M, Llama-3.2-1B: 61 M per Block: 2,292 and 8,220 tokens). Measured
#: on an H100 (torch 2.11, LoRA, B 1, ``python -m benchmarks diag graph-gain``, ``benchmarks/results/h100-2026-11-26f``):
#: captured over uncaptured step time 2.47x / 1.06x / 1.00x / 1.00x at 2k / 4k / 8k / 16k tokens for Llama-3.2-1B
#: (products 1.2e11 ... 1.0e12), 1.09x / 1.03x / 1.01x / 0.99x for Llama-3.1-8B (4.5e11 ... 3.6e12)
CAPTURE_MAX_WORK = 5 * 10**11

#: lit-liger's replica plan in several processes: the packed lengths a run can see are captured together at its first
#: packed step (``GraphRunner._precapture``), the same step in every process. Measured on 2 x H200 (Llama-3.2-1B LoRA,
#: micro-batch 4, 500 iterations, ``benchmarks/results/h200x2-2026-11-27``): captured one by one as each process met a
#: length, the other process waited at the next all-reduce: 4 stalls of ~160 ms in the 400 timed iterations, which
#: held 2 GPUs to 1.68x one GPU's tokens/s (1.80x without them); captured together (16 lengths in 2.9 s at the first
#: step), 1.81x (:meth:`GraphRunner._precapture`)

#: (``ModelState.expected_lengths``, on the model) what the replicas' run is expected to feed each process:
#: ``{packed length: micro-batches}`` (key None: the unpacked
#: ``samples x max_seq_length`` of a batch without padding), estimated from the data before the run
#: (:func:`expected_lengths`; the ``lit-liger`` command sets it for the run's ``fit`` where the micro-batches are dealt,
#: ``LigerConfig.balance_ranks``). With it the first step pre-captures only the lengths expected at least
#: :data:`PRECAPTURE_MIN_COUNT` times; None: not known, the whole ladder is pre-captured

#: a length of the ladder expected fewer times than this per process is left out of the replicas' pre-capture (met
#: later, it is captured then, see :data:`CAPTURE_AFTER`). A length pre-captured that never comes costs one capture
#: (~90 ms at Llama-3.2-1B); one left out that comes costs about one capture more (the other processes wait for its
#: capture): pre-capture what is more likely than not to come on some process. Measured on 2 x H200 (Llama-3.2-1B,
#: Alpaca-shaped lengths, micro-batch 4, 300 iterations, ``benchmarks/results/h200x2-2026-11-27h``): the ladder's 17
#: shapes recorded in 1.26-1.61 s at the first step, the 11 expected at least 0.5 times in 0.83-0.91 s (Llama-3.1-8B
#: full fine-tuning: 2.77 -> 1.20 s); every run there met the one unpacked micro-batch its estimate (0.5 per process)
#: foretold
PRECAPTURE_MIN_COUNT = 0.5

#: in a replica whose lengths were pre-captured, a shape outside them runs uncaptured until its micro-batch of this
#: number, which is captured (1: captured at once; a capture there stalls the other processes at the next
#: all-reduce). Renting before buying (4, uncaptured first) was measured on 2 x H200
#: (``benchmarks/results/h200x2-2026-11-27h``, Llama-3.2-1B, with lengths expected fewer than 4 times left out): each
#: uncaptured micro-batch took 50-90 ms against ~13 ms replayed and ~90 ms for a capture, the first of a run ~1 s more;
#: and full fine-tuning's peak rose from 13.2 to 15.3 GB (the uncaptured activations beside the graphs' pool)
CAPTURE_AFTER = 1

#: :func:`expected_lengths`: the relative error allowed the estimate of a micro-batch's tokens (each micro-batch
#: counts at every packed length within it)
ESTIMATE_MARGIN = 0.05


def _expected_words(expected: dict | None) -> str:
    """``ModelState.expected_lengths`` in words, for the pre-capture's line."""
    if not expected:
        return ""
    words = [f"{'unpacked' if k is None else format(k, ',')}: {v:.1f}" for k, v in
             sorted(expected.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)) if v >= 0.05]
    return f" (expected per process: {', '.join(words)})" if words else ""


def expected_lengths(rounds: Iterable[list[list[float]]], cap: int, scale: float = 1.0,
                     margin: float = ESTIMATE_MARGIN) -> dict:
    """``ModelState.expected_lengths`` from ``rounds``: for each round (one micro-batch per process, run at the same iteration
    on every process), every process's micro-batch as its samples' estimated tokens (each at most ``cap``, the
    dataset's ``max_seq_length``; <= 0: no cap). Each micro-batch counts ``scale`` / the processes (``scale``: the
    run's rounds over the rounds given) at every packed length (``lit_liger.swap.buckets.packed_bucket_length``) of its
    tokens within ``margin`` either side (a batch without padding is packed too, as the packed length of its tokens).
    The key None (the unpacked ``samples x max_seq_length``) is counted by none: the data's lengths alone decide."""
    from ..swap.buckets import packed_bucket_length

    counts: dict = {}
    for row in rounds:
        weight = scale / max(1, len(row))
        for sizes in row:
            if len(sizes) < 2:
                continue  # (one sample: never packed)
            total = sum(sizes)
            top = len(sizes) * cap if cap > 0 else float("inf")
            lo = packed_bucket_length(max(1, int(total * (1 - margin))))
            hi = packed_bucket_length(max(1, int(min(total * (1 + margin), top))))
            length = lo
            while length <= hi:
                counts[length] = counts.get(length, 0.0) + weight
                length = packed_bucket_length(length + 1)
    return counts


def precapture_lengths(samples: int, max_len: int, max_tokens: int | None = None) -> list[int]:
    """The packed lengths (``lit_liger.swap.buckets.packed_bucket_length``'s ladder) that a micro-batch of ``samples``
    samples of at most ``max_len`` tokens each can be padded up to, at most ``max_tokens`` (None: no bound); shortest
    first."""
    from ..swap.buckets import packed_bucket_length

    out, length = [], packed_bucket_length(max(1, samples))
    while length <= packed_bucket_length(samples * max_len):
        if max_tokens is None or length <= max_tokens:
            out.append(length)
        length = packed_bucket_length(length + 1)
    return out


def _describe_key(key: tuple) -> str:
    """A capture key in words (see ``GraphRunner.hidden``)."""
    shape, _, training, bounds, (recompute, mlp, *_) = key
    n = None if bounds is None else bounds - 2
    what = f"unpacked {tuple(shape)}" if n is None else f"{n} sample{'s' * (n != 1)} packed into {shape[-1]:,} tokens"
    return (what + ("" if training else ", evaluation") + (f", {recompute} Blocks recomputed" if recompute else "")
            + (f", {mlp} Blocks' MLP inputs recomputed" if mlp else ""))


def _several_replicas(gpt: nn.Module) -> bool:
    """Several processes each train the whole model on their own micro-batches (lit-liger's replica plan, or inside
    DDP's forward): a capture in one stalls the others at the next gradient reduction."""
    return _dist.replicated(gpt)


#: the share of the device's memory the graphs' pool may hold: past it, the graphs are released and micro-batches as
#: long as the one that went over run uncaptured from then on (``GraphRunner.give_up_above``)
POOL_FRACTION = 0.25


#: the share of the device a run with its graphs' pool may fill (:func:`_room`). The pool is measured after each capture,
#: not estimated as the memory plan's activations are (``memplan.MEMORY_FRACTION``, 0.75, a margin for its estimate):
#: issue 46 lets a plan spend up to 90% of the card on speed. At 0.75, Llama-3.1-8B full fine-tuning zero1 on an 80 GB
#: card (weights, gradients and Adam's share 45 GiB, a 17.5 GiB pool; its gradient buffers then counted twice, see
#: ``memplan.grads_to_come``) released every graph and ran uncaptured at 29.3% MFU; at 0.9 it kept its 10 shapes: 37.4%,
#: 70.8 GiB reserved (2 x H200 with an 80 GB card's memory emulated, ``benchmarks/results/h200x2-2026-11-27i``)
ROOM_FRACTION = 0.9


def _room(gpt: nn.Module, device: torch.device) -> float:
    """The bytes the run may still allocate on ``device`` beside what it holds (``lit_liger.runtime.memplan.available_bytes``
    at :data:`ROOM_FRACTION` of the device: less what is allocated, the gradients and the optimizer state to come);
    off CUDA, no bound."""
    if device.type != "cuda":
        return float("inf")
    from .memplan import available_bytes

    return available_bytes(gpt, device, ROOM_FRACTION)


def auto_max_tokens(gpt: nn.Module) -> int:
    """``LigerConfig.cuda_graphs_max_tokens=None``: :data:`CAPTURE_MAX_WORK` over the parameters of ``gpt``'s first
    Block."""
    block = gpt.transformer.h[0]
    return max(1, CAPTURE_MAX_WORK // max(1, sum(p.numel() for p in block.parameters())))


def _reserved(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def capture_report(stats: dict, wall_s: float | None = None) -> str | None:
    """One line on a run's CUDA graphs (``stats``: the change of :data:`ModelState.captures` over the run), or None where
    nothing was captured."""
    if not stats.get("captures"):
        if stats.get("long"):
            return (f"lit-liger: CUDA graphs: none captured; {stats['long']:,} micro-batches longer than "
                    "cuda_graphs_max_tokens ran uncaptured (bound by the GPU)")
        return None
    phases = ("release", "warmup", "forward", "backward", "first_replay")
    total = sum(stats[k] for k in phases)
    share = f", {total / wall_s:.1%} of the run's {wall_s:.1f} s" if wall_s else ""
    first = stats.get("first_warmup", 0.0)
    if first:  # (see ModelState.captures: first calls an uncaptured run makes too)
        share += ((f"; {(total - first) / wall_s:.1%} besides" if wall_s else "; of which") +
                  f" the process's first warm-up pass ({first:.2f} s), which also made every kernel's first call, "
                  "compilations included, as an uncaptured run's first step would")
    if stats.get("gpu_wait"):  # (the GPU waits through the first warm-up: nothing is queued before a run's first step)
        wait = stats["gpu_wait"]
        share += (f"; the GPU waited {wait:.2f} s for them" + (f", {wait / wall_s:.1%} of the run" if wall_s else "")
                  + (f", {max(0.0, wait - first) / wall_s:.1%} besides the first warm-up" if wall_s and first else ""))
    extra = ""
    if stats.get("long"):
        extra += f", {stats['long']:,} longer micro-batches uncaptured (cuda_graphs_max_tokens)"
    if stats.get("captures") and "warmed" in stats:
        extra += f"; {stats['warmed']} of the captures warmed up first"
    if stats.get("eager_first"):
        extra += (f"; {stats['eager_first']} first micro-batch(es) ran uncaptured in place of a warm-up pass "
                  "(graphs.EAGER_FIRST)")
    if stats.get("rewarmed"):
        extra += f"; {stats['rewarmed']} captures restarted with a warm-up (a Triton compilation)"
    if stats.get("precaptured"):
        extra += f"; {stats['precaptured']} of the shapes captured at the first step (data parallel)"
    if stats.get("left_out"):
        extra += (f", {stats['left_out']} lengths left out of it (expected fewer than {PRECAPTURE_MIN_COUNT:g} times "
                  "per process)")
    if stats.get("deferred"):
        extra += (f"; {stats['deferred']:,} micro-batches of shapes outside it ran uncaptured (a shape is captured at "
                  f"its micro-batch {CAPTURE_AFTER})")
    if stats.get("released"):
        extra += f"; graphs released {stats['released']} time(s) for memory"
    return (f"lit-liger: CUDA graphs: {stats['captures']} input shapes captured in {total:.2f} s{share} (per phase: "
            + ", ".join(f"{k} {stats[k]:.2f} s" for k in phases)
            + f"), {stats['replays']:,} replayed steps{extra}")


class _Graphs:
    """The forward and backward graphs of one input shape, with their static inputs and outputs."""

    def __init__(self, runner: GraphRunner, idx: torch.Tensor, params: list[nn.Parameter], plan: Any = None,
                 warmup: bool = True) -> None:
        self.runner = runner
        self.static_idx = idx.clone()  # (B, T); packed: (1, N)
        self.static_plan = None
        if plan is not None:  # LigerConfig.packing: positions and boundaries are inputs too (copied in per replay)
            from ..swap.packing import Pack, Plan

            pack = Pack(plan.pack.cu_seqlens.clone(), plan.pack.max_len, None)
            self.static_plan = Plan(self.static_idx, plan.positions.clone(), pack, None, 0)
        _clear_blas_workspaces()
        try:
            self._capture(params, warmup)
        except _NeedsWarmup as e:
            e.partial = self  # (kept by the runner until its reset: see GraphRunner._capture)
            raise
        finally:
            _clear_blas_workspaces()

    def _capture(self, params: list[nn.Parameter], warmup: bool) -> None:
        # the garbage collector stays off for the warm-up and both captures (see _no_gc); it collects first only
        # before a model's first capture, where earlier models' dead pools may be waiting: a full collection costs
        # 0.3 s in a litgpt process (measured on an H100, Llama-3.2-1B LoRA: it was half of every new shape's cost)
        with _no_gc(collect=self.runner.captures == 0):
            self._capture_ungc(params, warmup)

    def _capture_ungc(self, params: list[nn.Parameter], warmup: bool) -> None:
        runner, gpt = self.runner, self.runner.gpt
        bufs = runner.grad_buffers(params)
        if runner.stream is None:
            runner.stream = torch.cuda.Stream()
        stream = runner.stream
        if runner.pool is None:
            runner.new_pool()
        stream.wait_stream(torch.cuda.current_stream())
        t0 = time.perf_counter()
        if warmup or runner.hidden_spec is None:
            with torch.cuda.stream(stream), \
                    _allocating_to(runner.pool if WARMUP_IN_POOL else None, self.static_idx.device):
                # warm-up outside the capture: first-call work (the stream's cuBLAS workspace, attention plans,
                # Triton compilation, LoRA's lazily built index buffer) must not be recorded. No replay runs
                # meanwhile (the side stream waits for the current one; no replayed forward awaits its backward), so
                # the pool's free blocks are free to use
                hidden = gpt._liger_hidden(self.static_idx, self.static_plan, taps={})
                torch.autograd.grad(hidden, params, torch.ones_like(hidden), allow_unused=True)
                _warm_grads_into(gpt, params, bufs, self.static_idx.dtype)
                runner.grads_warm = True
                runner.hidden_spec = hidden.shape[-1], hidden.dtype
                out_spec = hidden.shape, hidden.dtype, hidden.device
                del hidden
            self.runner.stats["warmed"] += 1
            first_in_process, _PROCESS_WARMED[0] = not _PROCESS_WARMED[0], True
            torch.cuda.current_stream().wait_stream(stream)
            guard = contextlib.nullcontext()
        else:  # (a packed length after the first capture: no warm-up, Triton's compilations guarded)
            first_in_process = False
            if not runner.grads_warm:  # (EAGER_FIRST: no warm-up pass has run since the reset)
                _warm_grads_into(gpt, params, bufs, self.static_idx.dtype)
                runner.grads_warm = True
            width, dtype = runner.hidden_spec  # ((B, T) or packed (1, N) token ids -> (..., width) hidden states)
            out_spec = torch.Size((*self.static_idx.shape, width)), dtype, self.static_idx.device
            guard = _compile_guard()
        t1 = time.perf_counter()
        out_buf = runner.shared_view("out", *out_spec)  # (outside the pool: a plain allocation)
        # the buffers are the parameters' .grad (see _Replay.backward): the ops that can (the fused
        # norm -> Linear, the GLU's proj, the attention's proj: kernels._grad_into) add their weight gradients into them
        # inside their GEMM; the others' gradients are added below, in one pass
        into = [(p, b) for p, b in zip(params, bufs) if p.dim() == 2 and b.shape == p.shape and b.dtype == p.dtype]
        with guard, _grad_into.grads_into(into) as written:
            self._capture_graphs(params, bufs, stream, out_buf, out_spec, written)
        self.added_by_gemm = len(written)  # gradients a GEMM adds into .grad itself (the rest: one _foreach_add_)
        t3 = time.perf_counter()
        self.runner.stats["warmup"] += t1 - t0
        if first_in_process:  # (the same seconds, said apart: see ModelState.captures)
            self.runner.stats["first_warmup"] += t1 - t0
        self.runner.stats["forward"] += self._t2 - t1
        self.runner.stats["backward"] += t3 - self._t2
        self.static_hidden = self.static_out.detach()
        self.grads = [b if u else None for b, u in zip(bufs, self.used)]
        self.params = params

    def _capture_graphs(self, params: list[nn.Parameter], bufs: list[torch.Tensor], stream: torch.cuda.Stream,
                        out_buf: torch.Tensor, out_spec: tuple, written: set[int]) -> None:
        runner, gpt = self.runner, self.runner.gpt
        self.fwd = torch.cuda.CUDAGraph()
        with _recording(self.fwd, runner.pool, stream):
            # kept for the graphs' lifetime, autograd graph included. Measured on an H100 (torch 2.11): when
            # this output (and with it the captured autograd graph) was released right after its backward's
            # capture, the *next* shape's backward capture failed ("operation failed due to a previous error
            # during capture"), even with LitGPT's own ops, and left the CUDA generator unusable;
            # torch.cuda.make_graphed_callables keeps its outputs alive too (a one-off diagnostic, in git history
            # as scripts/gpu_graph_diag2.py).
            # It is a view of one buffer that every shape's output shares (the final norm's own output is a
            # temporary of the graph), so that the shapes not running hold no (B, T, C) tensor each
            self.taps: dict[int, torch.Tensor] = {}  # the segments' lowest inputs (see _capture_graphs' backward)
            self.static_out = _IntoBuffer.apply(gpt._liger_hidden(self.static_idx, self.static_plan, self.taps),
                                                out_buf)
        self._t2 = time.perf_counter()
        # the forward's cuBLAS workspaces (its thread's handle, on the capture stream and the LoRA branch's) dropped
        # into the pool before the backward's: autograd runs the backward on its device thread (unless
        # caller_thread_backward), whose cuBLAS handle takes workspaces of its own, and they take these blocks (the
        # streams match) instead of adding 32 MiB each beside them at the allocated peak, which is in this capture.
        # The forward's replay only uses them as scratch while it runs, before its backward's (measured on an H200:
        # see benchmarks/results/h200-2026-12-04)
        _clear_blas_workspaces()
        self.static_grad = runner.shared_view("grad", *out_spec)  # d loss / d hidden, copied in by backward
        # one backward graph per segment of the model's grads_ready callbacks (one in all where it has no callback): graph j takes the
        # gradient of segment j-1's lowest input (a shared buffer, copied in at the end of graph j-1) to segment j's
        # parameters and its own lowest input; the last one takes every parameter left
        # (a cut whose input needs no gradient, nothing below it training, is left out; each boundary kept runs its
        # segment's callbacks under the segment number the uncaptured backward's hook would give)
        kept = [(j, c) for j, c in enumerate(_dist.segment_cuts(gpt), 1)
                if c in self.taps and self.taps[c].requires_grad]
        cuts, self.notify = [c for _, c in kept], [j for j, _ in kept]
        segment = _param_segments(gpt, params, cuts)
        self.used = [False] * len(params)
        self.bwds = []
        out, gout = self.static_out, self.static_grad
        for j in range(1, len(cuts) + 2):
            last = j == len(cuts) + 1
            idxs = [i for i, s in enumerate(segment) if s == j or (last and s > j)]
            link = None if last else self.taps[cuts[j - 1]]
            inputs = [params[i] for i in idxs] + ([] if link is None else [link])
            graph = torch.cuda.CUDAGraph()
            with _recording(graph, runner.pool, stream):
                grads = torch.autograd.grad(out, inputs, gout, allow_unused=True)
                pairs = []
                for i, g in zip(idxs, grads):
                    self.used[i] = g is not None or id(bufs[i]) in written
                    if g is not None:
                        pairs.append((bufs[i], g))
                if pairs:
                    # the buffers are the parameters' ``.grad`` (see _Replay.backward): the replay adds this
                    # micro-batch's gradients to what they hold, as autograd's own accumulation would
                    torch._foreach_add_([b for b, _ in pairs], [g for _, g in pairs])
                if link is not None:
                    nxt = runner.shared_view(f"segment{j}", link.shape, link.dtype, link.device)
                    nxt.copy_(grads[-1])
                del grads, pairs
            self.bwds.append(graph)
            if link is not None:
                out, gout = link, nxt
        self.taps.clear()


@contextlib.contextmanager
def _recording(graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream) -> Iterator[None]:
    """Record ``graph`` on ``stream`` into ``pool``: ``torch.cuda.graph`` without its device synchronize and cache
    emptying, so that the GPU keeps running the work queued before the capture (measured: see the comment above
    :data:`RELEASE_BELOW_FREE`)."""
    with torch.cuda.stream(stream):
        graph.capture_begin(pool, capture_error_mode=CAPTURE_ERROR_MODE)
        try:
            yield
        finally:  # (as torch.cuda.graph: the capture ends whatever happened in it)
            graph.capture_end()


def settle_waits(runner: GraphRunner, block: bool = False) -> None:
    """Add the GPU's waits for ``runner``'s captures whose end events have completed (every one with ``block``) to
    its model's ``captures["gpu_wait"]``."""
    waits = runner.waits
    while waits and (block or waits[0][1].query()):
        start, end = waits.pop(0)
        end.synchronize()
        runner.stats["gpu_wait"] += start.elapsed_time(end) / 1e3


def _release_first(runner: GraphRunner, device: torch.device) -> bool:
    """Whether a capture of ``runner``'s on ``device`` synchronizes and empties the allocator's cache first (see
    :data:`EMPTY_CACHE_BEFORE_CAPTURE`, :data:`RELEASE_BELOW_FREE`)."""
    if not EMPTY_CACHE_BEFORE_CAPTURE or device.type != "cuda":
        return False
    if not runner.graphs:
        return True
    # (what the pool can grow into: the device's free memory, within the card lit-liger's memory plans see, which an
    # allocator cap makes smaller than the device, see benchmarks.finetune._cap_device)
    total = _total_memory(device)
    free = min(torch.cuda.mem_get_info(device)[0], total - _reserved(device))
    return free < RELEASE_BELOW_FREE * total


class _NeedsWarmup(Exception):
    """Raised by :func:`_compile_guard`'s hook: a capture without a warm-up pass met a Triton kernel that is not
    compiled yet. Compiling it would load its module, which CUDA refuses while a stream captures (and that failure
    would end capture for the model); raised before that, the capture ends cleanly and is made again with a
    warm-up."""


_DRIVER: list[int] = []


def _driver_version() -> int:
    """The CUDA driver's version (``cuDriverGetVersion``: 12030 for 12.3), or 0 where it cannot be read."""
    if not _DRIVER:
        version = 0
        try:
            import ctypes

            out = ctypes.c_int(0)
            if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(out)) == 0:
                version = out.value
        except (OSError, AttributeError):
            pass
        _DRIVER.append(version)
    return _DRIVER[0]


def _triton_runtime_knobs() -> Any:
    """Triton's ``knobs.runtime`` where it has the ``jit_cache_hook`` that :func:`_compile_guard` sets (Triton 3.4
    on), else None."""
    try:
        from triton import knobs

        rt = knobs.runtime
        rt.jit_cache_hook  # noqa: B018 - (does this Triton have it?)
    except (ImportError, AttributeError):
        return None
    return rt


def _warm_grads_into(gpt: nn.Module, params: list[nn.Parameter], bufs: list[torch.Tensor], idx_dtype: torch.dtype
                     ) -> None:
    """Launch once, outside the capture, the kernels that add a weight's gradient into its ``.grad`` buffer only inside
    a capture (the warm-up pass runs outside ``grads_into``): the token embedding's (``lit_liger.swap.gpt._EmbeddingMixin``),
    on a zero gradient for one token, which leaves the buffer's values as they are. Its compilation and module load
    are then not recorded (a driver older than CUDA 12.3 cannot load a module inside a capture), and a later capture
    without warm-up does not meet it in :func:`_compile_guard`."""
    from ..kernels.embedding import embedding_grad_into_

    wte = getattr(getattr(gpt, "transformer", None), "wte", None)
    if not isinstance(wte, nn.Embedding):
        return
    for p, b in zip(params, bufs):
        if p is wte.weight and b.shape == p.shape and b.dtype == p.dtype:
            embedding_grad_into_(b, torch.zeros(1, dtype=idx_dtype, device=b.device),
                                 torch.zeros(1, b.shape[1], dtype=b.dtype, device=b.device))


@contextlib.contextmanager
def _compile_guard() -> Iterator[None]:
    """While the block runs, a Triton kernel compilation (``knobs.runtime.jit_cache_hook``, which Triton calls before
    it compiles a kernel that its in-memory cache lacks) raises :class:`_NeedsWarmup` instead. The hook set before is
    put back after."""
    rt = _triton_runtime_knobs()
    if rt is None:
        yield
        return
    before = rt.jit_cache_hook

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise _NeedsWarmup(f"a capture without warm-up would compile the Triton kernel {kwargs.get('repr', '?')}")

    rt.jit_cache_hook = refuse
    try:
        yield
    finally:
        rt.jit_cache_hook = before


def _param_segments(gpt: nn.Module, params: list[nn.Parameter], cuts: list[int]) -> list[int]:
    """The backward graph of each of ``params`` (``_dist.segment_of``; the lm_head, which no body graph trains, and the
    embedding with the last); a parameter under several names takes the latest."""
    last = len(cuts) + 1
    where: dict[int, int] = {}
    for name, p in gpt.named_parameters(remove_duplicate=False):
        where[id(p)] = max(where.get(id(p), 0), _dist.segment_of(name, cuts) or last)
    return [where.get(id(p), last) for p in params]


class _IntoBuffer(torch.autograd.Function):
    """``x`` copied into ``buf`` (a view of the buffer every shape's graphs share; it needs no gradient and nothing
    saves it), returned as a new view of it; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        buf.copy_(x)
        return buf.view_as(buf)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


class _Replay(torch.autograd.Function):
    """Forward: replay the forward graph on ``idx`` (and a packed batch's ``plan``). Backward: replay the backward
    graph. In one process it adds the trainable parameters' gradients into the shared buffers, which *are*
    the parameters' ``.grad`` tensors, so a gradient exists once: before the replay each used parameter's ``.grad``
    becomes its buffer, zeroed where ``.grad`` was None (``zero_grad()``'s default), holding the current ``.grad``
    where it was another tensor, kept where it is the buffer already (gradient accumulation). Where a parameter has a
    tensor hook (``register_hook``, ``register_post_accumulate_grad_hook``: only autograd's accumulation runs them),
    or in several processes outside lit-liger's replica plan, the gradients go to autograd, which copies them into ``.grad`` or adds them to
    it. (Autograd only accumulates a gradient it is handed: a ``torch.autograd.grad`` call for these parameters gets
    none in direct mode, and fails as for an unused input.)"""

    @staticmethod
    def forward(ctx: Any, graphs: _Graphs, idx: torch.Tensor, plan: Any, *params: nn.Parameter) -> torch.Tensor:
        graphs.static_idx.copy_(idx)
        if plan is not None:
            graphs.static_plan.positions.copy_(plan.positions)
            graphs.static_plan.pack.cu_seqlens.copy_(plan.pack.cu_seqlens)
        graphs.fwd.replay()
        runner = graphs.runner
        runner.generation += 1
        ctx.graphs, ctx.generation = graphs, runner.generation
        runner.pending = weakref.ref(ctx)  # this forward's backward is due (or its graph is dropped unused)
        return graphs.static_hidden.detach()

    @staticmethod
    def backward(ctx: Any, grad_hidden: torch.Tensor) -> tuple:
        graphs = ctx.graphs
        runner = graphs.runner
        if runner.generation != ctx.generation:
            raise RuntimeError(
                "lit-liger CUDA graphs: this backward belongs to a forward that another forward (or backward) has "
                "replayed over since; the captured graphs keep one forward's activations at a time. Run each "
                "micro-batch's backward before the next forward, or turn graphs off (LigerConfig(cuda_graphs=False), "
                "--liger.cuda_graphs false)."
            )
        graphs.static_grad.copy_(grad_hidden)
        # (DDP's hooks sit on the gradient accumulators, out of sight: several processes hand the gradients to them,
        # except under lit-liger's replica plan, whose strategy reduces ``.grad`` after backward)
        direct = whole_model(runner.gpt) and not any(_tensor_hooked(p) for p in graphs.params)
        if direct:
            zero, copy = [], []
            for p, buf in zip(graphs.params, graphs.grads):
                if buf is None:
                    continue
                g = p.grad
                if g is None:
                    zero.append(buf)
                    p.grad = buf
                elif g is not buf:
                    copy.append((buf, g))
                    p.grad = buf
            if zero:
                torch._foreach_zero_(zero)
            if copy:
                torch._foreach_copy_([b for b, _ in copy], [g for _, g in copy])
        else:  # (the graph adds into the buffers)
            for p, buf in zip(graphs.params, graphs.grads):  # (a buffer that is .grad: the gradients so far move out)
                if buf is not None and p.grad is buf:
                    p.grad = buf.clone()
            torch._foreach_zero_([b for b in graphs.grads if b is not None])
        for j, graph in enumerate(graphs.bwds):
            graph.replay()
            if j < len(graphs.notify):
                _dist.grads_ready(runner.gpt, graphs.notify[j])
        runner.generation += 1
        runner.pending = None
        if direct:
            return (None, None, None, *([None] * len(graphs.params)))
        # autograd copies them into a new ``.grad`` (they are referenced here too) or adds them to the one there
        return (None, None, None, *graphs.grads)


def _tensor_hooked(p: torch.Tensor) -> bool:
    """``p`` has a tensor hook that only autograd's own gradient accumulation would run."""
    return bool(getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None))


_ACCUMULATE_GRAD_STREAM = r"The AccumulateGrad node's stream does not match the stream of the node that produced"

#: said with a capture failure inside a DistributedDataParallel forward. DDP's constructor makes the parameters'
#: gradient accumulators on the stream current then; on the legacy default stream, the captured backward makes that
#: stream wait for the capturing one, which CUDA refuses ("operation would make the legacy stream depend on a capturing
#: blocking stream": torch's DDP wrapped by hand, 2 x H200, benchmarks/results/h200x2-2026-11-27c/f2-ddp-capture.log).
#: Lightning's DDPStrategy constructs it on a side stream, and captures
_DDP_STREAM_HINT = (" (inside DistributedDataParallel: construct it on a side stream, `with torch.cuda.stream("
                    "torch.cuda.Stream()): model = DistributedDataParallel(model, ...)`, as PyTorch's notes on CUDA "
                    "graphs ask; Lightning's DDPStrategy does)")


class GraphRunner:
    """The captured graphs of one swapped GPT (held by the GPT as ``_liger_graphs``).

    Every call checks, cheaply (tens of microseconds: at these step sizes the host is the bottleneck), that
    a replay still computes what the model would: no hooks registered since, same parameter and buffer
    addresses, same trainable set, dropout as captured. The module tree itself (which parameters, buffers,
    submodules exist) is walked again only when something in the process registered a module, parameter or
    buffer since the last walk (PyTorch's global registration hooks), or on every call where this PyTorch
    has no such hooks."""

    def __init__(self, gpt: nn.Module) -> None:
        self._gpt = weakref.ref(gpt)  # the model owns the runner (see runner_for), not the other way round
        self.stats = state_of(gpt).captures  # the model's counters (ModelState.captures)
        #: (start, end) CUDA events around each capture on the stream that trains, not read yet: the GPU's wait for
        #: the capture is the time between them (``gpu_wait``, see :func:`settle_waits`)
        self.waits: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        # A replayed backward hands the parameters' gradients to autograd on the current stream, while their
        # AccumulateGrad nodes may carry the capture stream; PyTorch then warns (once per process) and makes the
        # accumulating stream wait for the producing one, an event on the GPU: the gradients are right either way
        # (the GPU tests of test_buckets.py and test_qlora.py compare replays with uncaptured steps). Exactly that
        # warning is silenced, only in a process where lit-liger captures.
        warnings.filterwarnings("ignore", message=_ACCUMULATE_GRAD_STREAM, category=UserWarning)
        self.graphs: dict[tuple, _Graphs] = {}
        self.pool: Any = None  # the graphs' memory pool id (shared by every shape's graphs and warm-ups)
        self._mempool: Any = None  # the torch.cuda.MemPool that owns it, where this PyTorch has one
        self.stream: torch.cuda.Stream | None = None
        self.generation = 0
        self.pending: Any = None  # weakref to the autograd context of a replayed forward awaiting its backward
        self.addresses: tuple | None = None
        self.buffers: dict[int, torch.Tensor] = {}
        self._shared: dict[str, torch.Tensor] = {}  # see shared_view
        self.disabled: str | None = None  # why capture was given up for this model
        self.error: str | None = None  # the capture failure's traceback
        self.warned: set[str] = set()
        self.captures = 0
        self.replays = 0
        self.few_trained = False  # at most 1/8 of the parameters are trained (cuda_graphs=None captures)
        self.regrown = 0  # times a longer shape than any captured dropped the graphs (RECAPTURE_ON_GROWTH)
        self.uncaptured = 0  # forwards run uncaptured because an earlier replay's backward was still due
        # micro-batches of more tokens run uncaptured (LigerConfig.cuda_graphs_max_tokens, lowered by give_up_above)
        self.max_tokens: int | None = getattr(gpt, "_liger_graphs_max_tokens", None)
        self.pool_bytes = 0  # the pool's growth over this runner's captures (reserved memory; reset with the pool)
        self.grad_bytes_made = 0  # bytes of the gradient buffers made so far (grad_buffers)
        self.precaptured = False  # the replica's lengths captured at its first packed step (_precapture)
        self.precaptured_n = 0
        self.seen: dict[tuple, int] = {}  # uncaptured micro-batches per shape met after the pre-capture (CAPTURE_AFTER)
        # the hidden states' width and dtype, known from a warm-up or the first uncaptured micro-batch since the reset
        self.hidden_spec: tuple | None = None
        self.aborted: list = []  # captures stopped by _compile_guard: kept until the next reset (see _capture)
        self.eager_first = False  # the first micro-batch since the reset ran uncaptured (EAGER_FIRST)
        self.accumulators: list = []  # the parameters' AccumulateGrad nodes, made on the capture stream (EAGER_FIRST)
        self.grads_warm = False  # _warm_grads_into has run since the reset
        self._tree: int | None = None  # _TREE_VERSION at the last walk of the module tree
        _watch_registrations()

    @property
    def gpt(self) -> nn.Module:
        gpt = self._gpt()
        assert gpt is not None, "the model of these CUDA graphs is gone"
        return gpt

    # -- the module tree, walked only when it may have changed -------------------------------------------
    def _walk(self) -> None:
        gpt = self.gpt
        self._tree = _TREE_VERSION[0]
        # the runner reaches the model only weakly (the model's state holds the runner; a strong way back, through
        # the runner or its hooks, would be a cycle that keeps the model, its weights and gradients alive until the
        # garbage collector finds it). The hook dicts (checked on every call: any() over them
        # is ~8 us for a 16-layer model, through weak references to the modules ~75) go on the model itself,
        # a cycle the garbage collector frees with it
        modules = list(gpt.modules())
        gpt.__dict__["_liger_hook_dicts"] = [d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks,
                                                                          m._backward_hooks, m._backward_pre_hooks)]
        self._dropouts = [m for m in modules if isinstance(m, nn.Dropout)]
        self._params = list(gpt.parameters())
        self._buffers = list(gpt.buffers())
        self._flex = any(getattr(m, "_liger_attention_path", lambda: "")() == "flex" for m in modules)
        # (a frozen bitsandbytes 4-bit weight is a Parameter subclass whose packed storage stays put: capturable)
        self._sharded = any(hasattr(p, "ds_id") or (type(p) not in (nn.Parameter, torch.Tensor)
                                                    and not (is_4bit(p) and not p.requires_grad)) for p in self._params)

    def _tree_changed(self) -> bool:
        return self._tree is None or self._tree != _TREE_VERSION[0] or _TREE_VERSION[0] < 0

    # -- when it applies ------------------------------------------------------------------------------
    def why_not(self, idx: torch.Tensor) -> str | None:
        """Why this call cannot be captured/replayed (None: it can)."""
        if self.disabled:
            return self.disabled
        if not idx.is_cuda:
            return ""  # CPU / interpreter runs: nothing to capture, nothing to warn about
        if torch.compiler.is_compiling():
            return ""  # torch.compile has its own CUDA graphs (mode="reduce-overhead")
        if torch.cuda.is_current_stream_capturing():
            return ""  # inside someone else's capture: stay part of it
        if sharded_processes(self.gpt):
            # (inside a DDP forward the graphs replay and DDP's hooks reduce the gradients autograd accumulates)
            return "several processes (FSDP/DeepSpeed): their communication hooks are not captured"
        if torch.is_autocast_enabled("cuda"):
            return "autocast is on (mixed precision): use a *-true precision to capture"
        if _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks or \
                _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks:
            return "global module hooks are registered"
        gpt = self.gpt
        if self._tree_changed() or "_liger_hook_dicts" not in gpt.__dict__:  # (remove_liger drops it)
            self._walk()
        if any(gpt.__dict__["_liger_hook_dicts"]):
            name = next(n for n, m in gpt.named_modules() if _hooked(m))
            return f"module {name or '<root>'} has hooks (they would not run on a replay)"
        if not CAPTURE_DROPOUT and any(m.p > 0 and m.training for m in self._dropouts):
            return "active dropout (e.g. LoRA dropout > 0)"
        if self._sharded:
            return "sharded or wrapped parameters"
        recomputed, offloaded = getattr(gpt, "_liger_mem_now", (0, False))[:2]
        if offloaded:
            return ""  # (Block inputs in host memory: a long micro-batch with no memory to spare for a pool)
        if recomputed and (why := checkpointed_capture_why()):
            return why
        if self._flex and not CAPTURE_FLEX:
            return FLEX_WHY
        return None

    def _few_trained_now(self) -> bool:
        """At most 1/8 of the parameters are trained (where ``cuda_graphs=None`` captures)."""
        if self._tree_changed():
            self._walk()
        return 8 * sum(p.numel() for p in self._params if p.requires_grad) <= sum(p.numel() for p in self._params)

    def warn_once(self, why: str) -> None:
        if why and why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"lit-liger: CUDA graphs off for this step ({why}); running uncaptured.", stacklevel=4)

    def _fingerprint(self) -> tuple:
        """What a replay depends on besides the input: where the parameters and buffers live, which
        parameters are trained, and each dropout's probability and mode."""
        return (tuple(map(torch.Tensor.data_ptr, self._params)), tuple(map(torch.Tensor.data_ptr, self._buffers)),
                tuple(p.requires_grad for p in self._params), tuple((m.p, m.training) for m in self._dropouts))

    # -- the one entry point ----------------------------------------------------------------------------
    def hidden(self, idx: torch.Tensor, auto: bool = False, plan: Any = None) -> torch.Tensor | None:
        """The final hidden states of ``idx`` through captured graphs, or None (the caller runs eagerly).
        ``auto``: ``LigerConfig.cuda_graphs=None`` (full training is captured where
        the replay adds into ``.grad`` directly: one process, or lit-liger's replica plan; a DDP replica gets its
        gradients through autograd's accumulation, a second copy beside the graphs' buffers, so auto leaves full
        training uncaptured there)."""
        auto = auto and not whole_model(self.gpt)
        why = self.why_not(idx)
        if why is not None:
            if not (why and auto and not self._few_trained_now()):  # automatic mode: no word where it would
                self.warn_once(why)                                  # not capture this model anyway
            return None
        if self.max_tokens is not None and idx.numel() > self.max_tokens:
            self.stats["long"] += 1  # bound by the GPU: a graph would buy little and hold its activations
            return None
        gpt = self.gpt
        fingerprint = self._fingerprint()
        if fingerprint != self.addresses:
            self.reset()  # a parameter or buffer moved (or the trainable set or a dropout changed): capture again
            self.addresses = fingerprint
            self.few_trained = self._few_trained_now()
        if auto and not self.few_trained:
            return None  # full fine-tuning / pretraining: uncaptured unless cuda_graphs=True (memory)
        if self.pending is not None and self.pending() is not None:
            # a replayed forward still awaits its backward (two forwards, then their backwards): replaying or
            # capturing now would overwrite its activations in the shared pool, so this one runs uncaptured
            self.uncaptured += 1
            return None
        # (packed: the number of samples sizes the boundaries' buffer; the packed length bounds a sample's length;
        # the memory plan decides which Blocks the captured body recomputes)
        key = (tuple(idx.shape), idx.dtype, gpt.training, None if plan is None else plan.pack.cu_seqlens.numel(),
               getattr(gpt, "_liger_mem_now", (0, False, 0, 0, 0))[0:5:2])  # (recompute, mlp, tile)
        graphs = self.graphs.get(key)
        if graphs is None:
            params = [p for p in self._params if p.requires_grad]
            if not params:
                return None  # nothing to train: an uncaptured forward costs nothing extra
            if EAGER_FIRST and self.hidden_spec is None and not self.eager_first and not self.graphs \
                    and not _dist.several_processes():
                self.eager_first = True  # (this micro-batch runs uncaptured, see EAGER_FIRST; the caller tells
                self.stats["eager_first"] += 1  # note_hidden what it computed)
                _PROCESS_WARMED[0] = True
                self._accumulators_on_side_stream(params)
                return None
            if len(self.graphs) >= MAX_GRAPHS:
                self.warn_once(f"more than {MAX_GRAPHS} input shapes (turn LigerConfig.seq_buckets on)")
                return None
            if not self.precaptured and plan is not None and _several_replicas(self.gpt):
                self.precaptured = True
                self._precapture(idx, plan, params)
                graphs = self.graphs.get(key)
                if graphs is None and (self.disabled or (self.max_tokens is not None and idx.numel() > self.max_tokens)):
                    return None  # (the pool's budget or a failure stopped the captures there)
        if graphs is None and self.precaptured and _several_replicas(self.gpt) and CAPTURE_AFTER > 1:
            seen = self.seen[key] = self.seen.get(key, 0) + 1
            if seen < CAPTURE_AFTER:  # (its first micro-batches uncaptured, see CAPTURE_AFTER)
                self.stats["deferred"] += 1
                return None
        if graphs is None:
            t0 = time.perf_counter()
            graphs = self._capture(key, idx, params, plan, warmup=self._warmup_needed(plan))
            if graphs is None:
                return None
            if self.precaptured and self.precaptured_n:  # (a replica: the other processes wait for this capture)
                print(f"lit-liger: CUDA graphs: process {torch.distributed.get_rank()} met a micro-batch outside the "
                      f"first step's pre-capture ({_describe_key(key)}); captured in {time.perf_counter() - t0:.2f} s",
                      flush=True)
            self.replays += 1
            self.stats["replays"] += 1
            t0 = time.perf_counter()
            out = _Replay.apply(graphs, idx, plan, *graphs.params)
            self.stats["first_replay"] += time.perf_counter() - t0
            return out
        self.replays += 1
        self.stats["replays"] += 1
        return _Replay.apply(graphs, idx, plan, *graphs.params)

    def _warmup_needed(self, plan: Any) -> bool:
        """Whether the next capture (of a packed micro-batch where ``plan`` is given) runs a warm-up pass first (see
        the comment above :data:`EAGER_FIRST`)."""
        if self.hidden_spec is None:  # (the first capture since the model's last reset)
            return True
        if plan is None or self._flex:  # (cuDNN attention plans each unpacked shape, FlexAttention compiles per length)
            return True
        return _driver_version() < CAPTURE_LOADS_FROM_DRIVER or _triton_runtime_knobs() is None

    def _capture(self, key: tuple, idx: torch.Tensor, params: list[nn.Parameter], plan: Any,
                 warmup: bool = True) -> _Graphs | None:
        """Capture the graphs of ``idx`` (and a packed batch's ``plan``) under ``key``, or None: out of memory (this and
        longer shapes run uncaptured from now on), the pool over its budget (the same), or a capture failure (no more
        captures for this model); each said once. ``warmup`` False (:meth:`_warmup_needed`): no warm-up pass before the
        capture, which, where it would compile a Triton kernel, stops and starts again with one (see
        :meth:`_warmup_needed`)."""
        if idx.device.type != "cuda":
            return self._capture_timed(key, idx, params, plan, warmup)
        settle_waits(self)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            return self._capture_timed(key, idx, params, plan, warmup)
        finally:  # (the GPU's wait: from the work queued before the capture to the step that follows it)
            end.record()
            self.waits.append((start, end))

    def _capture_timed(self, key: tuple, idx: torch.Tensor, params: list[nn.Parameter], plan: Any,
                       warmup: bool) -> _Graphs | None:
        release = _release_first(self, idx.device)
        if RECAPTURE_ON_GROWTH and self.graphs and \
                idx.numel() > max(g.static_idx.numel() for g in self.graphs.values()):
            self.graphs.clear()  # the next captures start a new pool, sized by this (largest so far) shape
            self.pool = self._mempool = None
            release = True  # the old pool's memory goes before the new shape's warm-up needs its own
            self.regrown += 1
        if release:  # one synchronize + empty_cache per capture, whichever of the two asked for it
            t0 = time.perf_counter()
            torch.cuda.synchronize(idx.device)
            torch.cuda.empty_cache()
            self.stats["release"] += time.perf_counter() - t0
        before, made = _reserved(idx.device), self.grad_bytes_made
        try:
            with _captured_attention(self.gpt):  # LigerConfig.sdpa_backend "auto": the captured steps' choice
                try:
                    graphs = _Graphs(self, idx, params, plan, warmup=warmup)
                except _NeedsWarmup as e:
                    # (the stopped capture's graphs and outputs are kept, not freed: releasing a captured forward's
                    # autograd graph right after its capture was seen to fail the next capture, see _capture_graphs)
                    self.aborted.append(getattr(e, "partial", None))
                    self.stats["rewarmed"] += 1
                    graphs = _Graphs(self, idx, params, plan, warmup=True)
        except torch.cuda.OutOfMemoryError as e:  # no memory for this shape's graphs: this and longer shapes
            _end_allocating(self.pool, idx.device)  # run uncaptured, the shorter ones are captured again
            _repair_generator(idx.device)
            self.give_up_above(idx.numel() - 1, f"out of memory capturing {idx.numel():,} tokens "
                                                f"({str(e).splitlines()[0][:120]})")
            return None
        except Exception as e:  # noqa: BLE001 - any capture failure: run uncaptured from now on
            import traceback

            self.error = traceback.format_exc()
            _end_allocating(self.pool, idx.device)
            self.reset()
            repaired = _repair_generator(idx.device)
            self.disabled = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if _dist.replicated(self.gpt) and not _dist.liger_replica(self.gpt):
                self.disabled += _DDP_STREAM_HINT
            if not repaired:
                self.disabled += " (PyTorch's CUDA generator may be unusable after it: random ops such as dropout can fail)"
            self.warn_once(self.disabled)
            return None
        # the warm-up and capture may have registered lazily created buffers (LoRA's index buffer)
        if self._tree_changed():
            self._walk()
        self.addresses = self._fingerprint()
        self.graphs[key] = graphs
        self._drop_unused_buffers()
        self.captures += 1
        self.stats["captures"] += 1
        # (the gradient buffers made for it are no graph's cost: they become the parameters' .grad, which the step
        # holds anyway; at Llama-3.1-8B full fine-tuning they are 16 GB, and counted they took the pool over its budget
        # within 4 shapes, 2 x H200, benchmarks/results/h200x2-2026-11-27b)
        self.pool_bytes += max(0, _reserved(idx.device) - before - (self.grad_bytes_made - made))
        budget = POOL_FRACTION * _total_memory(idx.device)
        if self.pool_bytes > budget:
            self.give_up_above(idx.numel() - 1, f"their memory pool reached {self.pool_bytes / 2**30:.1f} GiB, "
                                                f"over its budget of {budget / 2**30:.1f} GiB")
            return None
        # (the pool's memory is reserved, not allocated: what it holds free is counted against the run's room too,
        # with the optimizer state still to come; see ModelState.state_ahead)
        room = _room(self.gpt, idx.device) - self.pool_bytes
        if room < 0:
            from .memplan import state_ahead

            ahead = state_ahead(self.gpt)
            self.give_up_above(idx.numel() - 1, f"their memory pool ({self.pool_bytes / 2**30:.1f} GiB) left the run "
                               f"{-room / 2**30:.1f} GiB short of graphs.ROOM_FRACTION ({ROOM_FRACTION:g}) of the "
                               "device" + (f", with {ahead / 2**30:.1f} GiB of optimizer state still to come"
                                           if ahead else ""))
            return None
        return graphs

    def _precapture(self, idx: torch.Tensor, plan: Any, params: list[nn.Parameter]) -> None:
        """(lit-liger's replica plan or DDP, several processes) At the first packed
        micro-batch, capture every packed length the run can see (the bucket ladder up to ``samples x
        max_seq_length``, longest first, within ``max_tokens`` and the pool's budget; lengths that the memory plan
        would recompute are left to their own step; a batch without padding runs as the ladder's longest), so that the
        processes capture at the same step. Captured one by
        one as they come, a length that one process meets first stalls the others at the next all-reduce for as
        long as its capture takes."""
        from ..swap import gpt as gpt_swap
        from ..swap.packing import Pack, Plan, _layout

        gpt = self.gpt
        S = plan.pack.cu_seqlens.numel() - 2
        T = min(int(getattr(gpt, "max_seq_length", 0) or 0), gpt.cos.size(0))
        if S < 2 or T <= 0:
            return
        lengths = precapture_lengths(S, T, self.max_tokens)
        expected, left_out = state_of(self.gpt).expected_lengths, 0
        if expected is not None:  # (the data's lengths estimated before the run: the rare ones are captured if they come)
            kept = [L for L in lengths if expected.get(L, 0) >= PRECAPTURE_MIN_COUNT]
            left_out, lengths = len(lengths) - len(kept), kept
        self.stats["left_out"] += left_out
        saved = gpt.__dict__.get("_liger_mem_now")
        t0, n0 = time.perf_counter(), self.captures
        try:
            for L in reversed(lengths):
                if len(self.graphs) >= MAX_GRAPHS or self.disabled:
                    break
                real = min(L, S * T)  # (samples of at most T tokens, then the bucket's pad segment, as real ones)
                sizes = [real // S + (i < real % S) for i in range(S)]
                _, n, bounds, _, positions, _ = _layout(sizes, T, lambda _real, L=L: L, gpt.cos.size(0))
                sidx = torch.ones((1, n), dtype=idx.dtype, device=idx.device)
                if any(gpt_swap._memory_plan_here(gpt, sidx)):
                    continue
                gpt._liger_mem_now = gpt_swap.NO_PLAN
                cu = torch.tensor(bounds, dtype=torch.int32).to(idx.device)
                splan = Plan(sidx, positions.to(idx.device), Pack(cu, n, bounds), None, n)
                key = (tuple(sidx.shape), sidx.dtype, gpt.training, cu.numel(), (0, 0, 0))
                # (the first length is warmed up; the others are recorded without, guarded: _warmup_needed)
                warmup = self._warmup_needed(splan)
                if key not in self.graphs and self._capture(key, sidx, params, splan, warmup=warmup) is None:
                    if self.disabled:
                        break
                    continue  # (out of memory or over the pool's budget: released; the shorter lengths from scratch)
        finally:
            if saved is None:
                gpt.__dict__.pop("_liger_mem_now", None)
            else:
                gpt._liger_mem_now = saved
        self.precaptured_n = self.captures - n0
        self.stats["precaptured"] += self.precaptured_n
        if (self.precaptured_n or left_out) and _dist.rank_zero():
            full = (S, T) in {k[0] for k in self.graphs if k[3] is None}
            some = [k[0][-1] for k in self.graphs if k[3] is not None]
            print(f"lit-liger: CUDA graphs: {self.precaptured_n - full} packed lengths"
                  + (f" of {min(some):,}-{max(some):,} tokens" if some else "")
                  + (f" and the unpacked {S} x {T:,}" if full else "")
                  + f" captured at the first step in {time.perf_counter() - t0:.1f} s (every process at once: data "
                    "parallel)"
                  + (f"; {left_out} lengths of the ladder left out, expected fewer than {PRECAPTURE_MIN_COUNT:g} "
                     f"times per process in this run's data{_expected_words(expected)} (captured if they come)"
                     if left_out else ""), flush=True)

    def give_up_above(self, max_tokens: int, why: str) -> None:
        """Release every graph and the pool, and capture no micro-batch of more than ``max_tokens`` tokens from now
        on (the shorter shapes are captured again as they come), with a warning that says why."""
        self.pending = None
        self.reset()
        self.max_tokens = max_tokens if self.max_tokens is None else min(self.max_tokens, max_tokens)
        self.stats["released"] += 1
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.warn_once(f"{why}; released, micro-batches of more than {self.max_tokens:,} tokens run uncaptured")

    def _drop_unused_buffers(self) -> None:
        """Free the gradient buffers no captured backward writes (a trainable parameter outside the graphs, such as
        the lm_head, which the fused loss trains: its buffer was made for the capture and stays unused; as
        ``.grad`` it would sit beside the lm_head's own ``.grad``, a (V, C) tensor of waste)."""
        used = {id(b) for g in self.graphs.values() for b in g.grads if b is not None}
        for k in [k for k, b in self.buffers.items() if id(b) not in used]:
            del self.buffers[k]

    def _accumulators_on_side_stream(self, params: list[nn.Parameter]) -> None:
        """Make the parameters' gradient accumulators (autograd's AccumulateGrad nodes) with the capture stream current,
        and hold them until the reset. Autograd gives a node the stream current at its making and reuses a parameter's
        node while anything holds it. The uncaptured micro-batch's graph lives on after its backward where the caller
        keeps its loss (litgpt's loop does, until the next micro-batch's loss replaces it), and with it nodes made on
        the default stream: the next micro-batch's captured backward then made that (legacy) stream wait for the
        capture, which CUDA refuses ("operation would make the legacy stream depend on a capturing blocking stream";
        measured on an H200, ``benchmarks/results/h200-2026-11-29f``). Made here, every later forward, uncaptured or
        captured, reuses these, as it reuses those that the captured graphs hold after a warm-up pass."""
        device = params[0].device if params else None
        if device is None or device.type != "cuda":
            return
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        with torch.cuda.stream(self.stream):
            self.accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in params]

    def note_hidden(self, hidden: torch.Tensor) -> None:
        """The final hidden states of a micro-batch run uncaptured: after the first since the reset
        (:data:`EAGER_FIRST`) their width and dtype are what a capture without warm-up needs."""
        if self.eager_first and self.hidden_spec is None:
            self.hidden_spec = hidden.shape[-1], hidden.dtype

    def grad_buffers(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        """One gradient buffer per trainable parameter, shared by every shape's backward graph: the parameter's
        ``.grad`` where the replay adds into it directly and it is a plain contiguous tensor of the parameter's shape
        and dtype (an uncaptured micro-batch's, :data:`EAGER_FIRST`), else a new tensor."""
        out = []
        direct = whole_model(self.gpt)
        for p in params:
            buf = self.buffers.get(id(p))
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype:
                g = p.grad
                if direct and g is not None and type(g) is torch.Tensor and g._base is None and \
                        g.shape == p.shape and g.dtype == p.dtype and g.device == p.device and g.is_contiguous() \
                        and not _tensor_hooked(p):
                    buf = self.buffers[id(p)] = g
                else:
                    buf = self.buffers[id(p)] = torch.empty_like(p, memory_format=torch.contiguous_format)
                    self.grad_bytes_made += buf.numel() * buf.element_size()
            out.append(buf)
        return out

    def shared_view(self, name: str, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A view of that shape into one buffer per ``name`` shared by every shape's graphs: ``"out"``, the
        forward graphs' output (the final hidden states), ``"grad"``, the backward graphs' input (d loss /
        d hidden; a replay copies it in just before it runs). Replays run one at a time, so one buffer serves them
        all. A shape larger than the buffer gets a new one; the graphs captured before keep the old."""
        n = shape.numel()
        buf = self._shared.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
            buf = self._shared[name] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(shape)

    def new_pool(self) -> None:
        """A fresh memory pool for the next captures (the old one is freed with the graphs that used it)."""
        try:
            self._mempool = torch.cuda.MemPool()
            self.pool = self._mempool.id
        except (AttributeError, RuntimeError, TypeError):  # a PyTorch without MemPool
            self._mempool = None
            self.pool = torch.cuda.graph_pool_handle()

    def reset(self) -> None:
        """Drop every captured graph and buffer (their memory returns to PyTorch's allocator)."""
        self.graphs.clear()
        self.buffers.clear()
        self._shared.clear()
        self.pool = self._mempool = None
        self.pool_bytes = 0
        self.addresses = None
        self.aborted.clear()
        self.hidden_spec = None  # (the next capture warms up: the model's dtype or kernels may have changed)
        self.eager_first = self.grads_warm = False
        self.accumulators = []


def _clear_blas_workspaces() -> None:
    """Drop cuBLAS's cached workspaces (one per handle and stream, 32 MiB each on Hopper), before a shape's warm-up
    and after its capture, as torch.compile's CUDA graph trees do, and between its forward and backward captures
    (see _capture_graphs). The capture stream's workspace is then allocated inside the graphs' pool and, once
    dropped, stays there as scratch of the graphs that recorded its address (replays run one at a time, like all
    the pool's scratch) instead of being held as a live allocation beside the default stream's; and the default
    stream's is freed to the cache while the warm-up and capture run (the next GEMM there takes it back). Without
    this, every captured run held two workspaces."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@contextlib.contextmanager
def _allocating_to(pool: Any, device: torch.device) -> Iterator[None]:
    """Allocations on the current stream (by any thread: autograd's backward runs on its own) come from ``pool``
    (see WARMUP_IN_POOL); nothing changes where ``pool`` is None or this PyTorch lacks the allocator's hooks."""
    C = torch._C
    begin = getattr(C, "_cuda_beginAllocateCurrentStreamToPool", None)
    end, release = getattr(C, "_cuda_endAllocateToPool", None), getattr(C, "_cuda_releasePool", None)
    if pool is None or begin is None or end is None or release is None:
        yield
        return
    index = _device_index(device)
    begin(index, pool)
    try:
        yield
    finally:
        end(index, pool)
        release(index, pool)


@contextlib.contextmanager
def _no_gc(collect: bool = True) -> Iterator[None]:
    """Python's garbage collector stays off for the block (collecting first where ``collect``). Seen on an H100 (torch
    2.11): a garbage collection inside the warm-up (set off by a FlexAttention block mask's construction: vmap, many
    small objects), in a test process holding earlier tests' models and graph pools, aborted the process with no
    message; with this the same tests pass. Our reading, not proven: inside ``_allocating_to`` the allocator counts
    a capture underway, and a collection that frees a dead memory pool there trips its "captures_underway.empty()"
    assertion (the failure pytorch/pytorch#180395 describes). Without ``collect`` dead objects wait for the next
    collection after the block, where freeing a pool is safe."""
    enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _end_allocating(pool: Any, device: torch.device) -> None:
    """After a failed capture: PyTorch's capture_end raises before it tells the allocator that the capture's
    allocations into ``pool`` are over, and the allocator then fails an internal assert on its next cache flush
    (``torch.cuda.empty_cache``, or at exit: "captures_underway.empty()", measured on torch 2.11). Tell it."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if pool is None or end is None:
        return
    index = _device_index(device)
    try:
        end(index, pool)
    except RuntimeError:  # the capture had ended after all (it failed later, or PyTorch ended it itself)
        pass


def _repair_generator(device: torch.device) -> bool:
    """After a failed capture PyTorch's default CUDA generator still holds that capture's state, and its next
    random draw outside a capture raises ("Offset increment outside graph capture encountered unexpectedly",
    measured on torch 2.11). Give it a fresh state with the same seed and offset. True if that was possible."""
    try:
        gen = torch.cuda.default_generators[_device_index(device)]
        if not (hasattr(gen, "graphsafe_set_state") and hasattr(gen, "get_offset")):
            return False
        fresh = torch.Generator(device=device)
        fresh.manual_seed(gen.initial_seed())
        fresh.set_offset(gen.get_offset())
        gen.graphsafe_set_state(fresh.graphsafe_get_state())
        return True
    except Exception:  # noqa: BLE001 - best effort; the warning says what may follow
        return False


#: bumped whenever any module, parameter or buffer is registered anywhere in the process (-1: this
#: PyTorch has no global registration hooks, so every call walks the module tree)
_TREE_VERSION = [0]
_WATCHING = False


def _hooked(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


def _bump(*_args: Any) -> None:
    if _TREE_VERSION[0] >= 0:
        _TREE_VERSION[0] += 1


def _watch_registrations() -> None:
    global _WATCHING
    if _WATCHING:
        return
    _WATCHING = True
    names = ("register_module_module_registration_hook", "register_module_parameter_registration_hook",
             "register_module_buffer_registration_hook")
    hooks = [getattr(_nn_module, n, None) for n in names]
    if any(h is None for h in hooks):
        _TREE_VERSION[0] = -1
        return
    for h in hooks:
        h(_bump)


def runner_for(gpt: nn.Module) -> GraphRunner:
    """The :class:`GraphRunner` of ``gpt`` (made on first use; kept on its ``ModelState``, which a deep copy or a
    pickle of the model does not carry: a graph can be neither, the copy captures its own)."""
    state = state_of(gpt)
    if state.runner is None:
        state.runner = GraphRunner(gpt)
    return state.runner


def release(model: nn.Module) -> str | None:
    """Drop the captured graphs of every swapped GPT inside ``model``, their memory pool and buffers, and hand the
    allocator's cached memory back to the device: what the ``lit-liger`` command and ``LigerCallback`` do when
    training ends, before litgpt validates, saves, merges LoRA weights or generates (a run that had captured
    long-document shapes held their pools until the process ended: 119 GiB at 16k tokens, and litgpt's
    ``merge_lora`` then ran out of memory). A later training step captures again. Returns the log line, or None
    where nothing was captured. Gradients the replays wrote into ``.grad`` stay the parameters' own."""
    runners = [st.runner for st in states_in(model) if st.runner is not None]
    for r in runners:
        settle_waits(r, block=True)
    runners = [r for r in runners if r.graphs or r.pool is not None]
    if not runners:
        return None
    shapes = sum(len(r.graphs) for r in runners)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    before = torch.cuda.memory_reserved() if cuda else 0
    for r in runners:
        r.pending = None
        r.reset()
    if cuda:
        gc.collect()  # (a graph's autograd state may sit in a reference cycle)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved() if cuda else 0
    freed = f": reserved memory {before / 2**30:.2f} -> {after / 2**30:.2f} GiB" if cuda else ""
    return f"lit-liger: training ended: the CUDA graphs of {shapes} input shapes and their memory pool released{freed}"
