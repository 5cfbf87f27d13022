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
parameters' gradients, which it accumulates into ``.grad`` as usual (gradient accumulation works).

Memory: every shape's graphs share one memory pool (one set of activations, the largest bucket's) and one
set of gradient buffers for the trainable parameters (a LoRA's are tiny; full fine-tuning pays one copy of
the trainable parameters' size). Dropout (LoRA dropout) draws fresh random numbers on every replay
(PyTorch's generator is graph-aware).

Never silently wrong: a replay reads the parameters and buffers at the addresses they had at capture, so
every call compares those addresses and recaptures if one moved (``param.data = ...``, a new RoPE cache).
A backward that comes after another forward replay (two forwards, then their backwards: the shared pool
holds only the latest forward's activations) raises. Where capture cannot apply (several processes,
autocast, module hooks, ``torch.compile``, a capture error) the step runs uncaptured, with one warning.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

__all__ = ["GraphRunner", "MAX_GRAPHS", "runner_for"]

#: torch.cuda.graph's capture_error_mode: only this thread's CUDA calls are checked (a data loader's
#: pin-memory thread may allocate page-locked memory meanwhile)
CAPTURE_ERROR_MODE = "thread_local"

#: distinct input shapes captured per model; a new shape beyond this runs uncaptured (with a warning)
MAX_GRAPHS = 48


class _Graphs:
    """The forward and backward graphs of one input shape, with their static inputs and outputs."""

    def __init__(self, runner: GraphRunner, idx: torch.Tensor, params: list[nn.Parameter]) -> None:
        gpt = runner.gpt
        self.runner = runner
        self.static_idx = idx.clone()  # (B, T)
        bufs = runner.grad_buffers(params)
        stream = runner.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # warm-up outside the capture: first-call work (cuBLAS workspaces, attention plans, Triton
            # compilation, LoRA's lazily built index buffer) must not be recorded
            hidden = gpt._liger_hidden(self.static_idx)
            torch.autograd.grad(hidden, params, torch.ones_like(hidden), allow_unused=True)
            del hidden
        torch.cuda.current_stream().wait_stream(stream)
        self.fwd = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.fwd, pool=runner.pool, stream=stream, capture_error_mode=CAPTURE_ERROR_MODE):
            self.static_hidden = gpt._liger_hidden(self.static_idx)  # (B, T, C)
        if runner.pool is None:
            runner.pool = self.fwd.pool()
        self.static_grad = torch.empty_like(self.static_hidden)  # d loss / d hidden, copied in by backward
        self.bwd = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.bwd, pool=runner.pool, stream=stream, capture_error_mode=CAPTURE_ERROR_MODE):
            grads = torch.autograd.grad(self.static_hidden, params, self.static_grad, allow_unused=True)
            self.used = [g is not None for g in grads]
            pairs = [(b, g) for b, g in zip(bufs, grads) if g is not None]
            if pairs:
                torch._foreach_copy_([b for b, _ in pairs], [g for _, g in pairs])
            del grads, pairs
        self.static_hidden = self.static_hidden.detach()
        self.grads = [b if u else None for b, u in zip(bufs, self.used)]
        self.params = params


class _Replay(torch.autograd.Function):
    """Forward: replay the forward graph on ``idx``. Backward: replay the backward graph; the trainable
    parameters' gradients come out of the shared buffers (autograd copies them into ``.grad``, as it does
    for any gradient that is still referenced elsewhere, or adds them to it)."""

    @staticmethod
    def forward(ctx: Any, graphs: _Graphs, idx: torch.Tensor, *params: nn.Parameter) -> torch.Tensor:
        graphs.static_idx.copy_(idx)
        graphs.fwd.replay()
        runner = graphs.runner
        runner.generation += 1
        ctx.graphs, ctx.generation = graphs, runner.generation
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
        graphs.bwd.replay()
        runner.generation += 1
        return (None, None, *graphs.grads)


class GraphRunner:
    """The captured graphs of one swapped GPT (held by the GPT as ``_liger_graphs``)."""

    def __init__(self, gpt: nn.Module) -> None:
        self._gpt = weakref.ref(gpt)  # the model owns the runner (see runner_for), not the other way round
        self.graphs: dict[tuple, _Graphs] = {}
        self.pool: Any = None
        self.stream: torch.cuda.Stream | None = None
        self.generation = 0
        self.addresses: tuple | None = None
        self.buffers: dict[int, torch.Tensor] = {}
        self.disabled: str | None = None  # why capture was given up for this model
        self.error: str | None = None  # the capture failure's traceback
        self.warned: set[str] = set()
        self.captures = 0
        self.replays = 0

    @property
    def gpt(self) -> nn.Module:
        gpt = self._gpt()
        assert gpt is not None, "the model of these CUDA graphs is gone"
        return gpt

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
        if torch.distributed.is_available() and torch.distributed.is_initialized() and \
                torch.distributed.get_world_size() > 1:
            return "several processes (FSDP/DeepSpeed/DDP): their communication hooks are not captured"
        if torch.is_autocast_enabled("cuda"):
            return "autocast is on (mixed precision): use a *-true precision to capture"
        if _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks or \
                _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks:
            return "global module hooks are registered"
        for name, m in self.gpt.named_modules():
            if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
                return f"module {name or '<root>'} has hooks (they would not run on a replay)"
        if any(isinstance(m, nn.Dropout) and m.p > 0 and m.training for m in self.gpt.modules()):
            # Measured on an H100 (torch 2.11): a second capture of a dropout (LoRA dropout) in one process
            # fails inside the forward capture ("operation would make the legacy stream depend on a
            # capturing blocking stream") and leaves the CUDA generator unusable for eager dropout too, so
            # runs with active dropout are not captured (--lora_dropout 0 lets them be)
            return "active dropout (e.g. LoRA dropout > 0): capturing its random numbers fails after the first graph"
        for p in self.gpt.parameters():
            if hasattr(p, "ds_id") or type(p) not in (nn.Parameter, torch.Tensor):
                return "sharded or wrapped parameters"
        return None

    def warn_once(self, why: str) -> None:
        if why and why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"lit-liger: CUDA graphs off for this step ({why}); running uncaptured.", stacklevel=4)

    # -- the one entry point ----------------------------------------------------------------------------
    def hidden(self, idx: torch.Tensor) -> torch.Tensor | None:
        """The final hidden states of ``idx`` through captured graphs, or None (the caller runs eagerly)."""
        why = self.why_not(idx)
        if why is not None:
            self.warn_once(why)
            return None
        gpt = self.gpt
        params = [p for p in gpt.parameters() if p.requires_grad]
        if not params:
            return None  # nothing to train: an uncaptured forward costs nothing extra
        addresses = (tuple(t.data_ptr() for t in gpt.parameters()), tuple(t.data_ptr() for t in gpt.buffers()),
                     tuple(id(p) for p in params))
        if addresses != self.addresses:
            self.reset()  # a parameter or buffer moved (or the trainable set changed): capture again
            self.addresses = addresses
        key = (tuple(idx.shape), idx.dtype, gpt.training)
        graphs = self.graphs.get(key)
        if graphs is None:
            if len(self.graphs) >= MAX_GRAPHS:
                self.warn_once(f"more than {MAX_GRAPHS} input shapes (turn LigerConfig.seq_buckets on)")
                return None
            if self.stream is None:
                self.stream = torch.cuda.Stream()
            try:
                graphs = _Graphs(self, idx, params)
            except Exception as e:  # noqa: BLE001 - any capture failure: run uncaptured from now on
                import traceback

                self.error = traceback.format_exc()
                self.reset()
                self.disabled = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                self.warn_once(self.disabled)
                return None
            # the warm-up and capture may have moved lazily created buffers (LoRA's index buffer)
            self.addresses = (tuple(t.data_ptr() for t in gpt.parameters()),
                              tuple(t.data_ptr() for t in gpt.buffers()), tuple(id(p) for p in params))
            self.graphs[key] = graphs
            self.captures += 1
        self.replays += 1
        return _Replay.apply(graphs, idx, *graphs.params)

    def grad_buffers(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        """One gradient buffer per trainable parameter, shared by every shape's backward graph."""
        out = []
        for p in params:
            buf = self.buffers.get(id(p))
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype:
                buf = self.buffers[id(p)] = torch.empty_like(p, memory_format=torch.contiguous_format)
            out.append(buf)
        return out

    def reset(self) -> None:
        """Drop every captured graph and buffer (their memory returns to PyTorch's allocator)."""
        self.graphs.clear()
        self.buffers.clear()
        self.pool = None
        self.addresses = None


# Kept outside the model (a graph cannot be pickled or deep-copied: the model still can be), and gone with it.
_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runner_for(gpt: nn.Module) -> GraphRunner:
    """The :class:`GraphRunner` of ``gpt`` (made on first use)."""
    runner = _RUNNERS.get(gpt)
    if runner is None:
        runner = _RUNNERS[gpt] = GraphRunner(gpt)
    return runner
