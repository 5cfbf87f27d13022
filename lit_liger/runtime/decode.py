"""litgpt's sample generation on a swapped model: each one-token KV-cache step replayed from a CUDA graph.

litgpt's fine-tuning recipes generate a sample at every evaluation (``generate_example``: ``set_kv_cache``, up to
``eval.max_new_tokens`` one-token steps through ``litgpt.generate.base.generate``, ``clear_kv_cache``). Each step is a
whole model forward for one token, bound by the host's launches; and litgpt passes ``input_pos_maxp1`` (the cache's
filled length), so the attention's key length, and with it the attention kernel's plan, changes at every token. On an
H200 (Llama-3.2-1B LoRA, the shipped LoRA recipe, ``benchmarks/results/h200-2026-11-29e``) the five generations of a
run took 22 s of its 44 s ``fit``, stock's as long; the first one 10-12 s, 6.4 s of them in
``scaled_dot_product_attention`` (a new plan for each of its 100 key lengths).

Here the step runs as a CUDA graph per (batch, dtype, key length): litgpt's forward with ``input_pos_maxp1`` rounded up
to a power of two (at least :data:`MIN_KEYS`; the whole cache where that is no shorter, or where litgpt passes none), so
the attention reads the cache's filled part and a little more, with litgpt's mask, every shape fixed. A generation of
a few hundred tokens uses one graph, one of 100k tokens from a short prompt ten; a whole-cache graph would read all of a
128k cache (17 GB at Llama-3.1-8B) at every token. The token and its positions are copied into the graph's inputs, the
graph replayed, its logits returned as a new tensor. The first step of each key length runs once uncaptured (its
writes into the cache are those the replay makes again), then is recorded on a side stream (no device synchronize, no
garbage collection: ``graphs._recording``); the graphs of a cache share one memory pool. They live with the KV cache:
``set_kv_cache`` and ``clear_kv_cache`` drop them, and a cache buffer, mask, RoPE table or parameter found at another
address recaptures them. Uncaptured, as before: the prompt
(prefill), grad enabled, training mode, a sliding-window cache (it reads its length back), more than one process
(:func:`lit_liger._dist.several_processes`), ``lm_head_chunk_size``, ``torch.compile``, CPU tensors,
``LigerConfig.cuda_graphs=False``. A capture that fails turns it off for the model,
with one warning, and the step runs uncaptured.

The logits are litgpt's up to the attention's summation order (the masked keys weigh exactly zero), so a sampled token
can differ from stock's at the same seed where two are nearly tied, as with any change of attention kernel.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from ..swap.state import state_of

__all__ = ["MAX_GRAPHS", "MIN_KEYS", "drop", "key_length", "step"]

#: the shortest key length a step's graph attends over (litgpt's fine-tuning recipes generate ~100 tokens after a short
#: prompt: one graph)
MIN_KEYS = 256

#: graphs kept per KV cache (batch sizes, dtypes, key lengths: a generation to a 128k cache from a 256-token prompt
#: needs 10); past it the cache's graphs are dropped and captured again as needed
MAX_GRAPHS = 24

#: each model's decode graphs are counted on it: ``ModelState.decode`` (captures, replays, capture failures)

_ATTR = "_liger_decode"  # (removed with the other _liger_ attributes by remove_liger)
_OFF = "off"


class _Graph:
    """One captured step: its graph, static inputs and logits."""

    def __init__(self, graph: Any, x: torch.Tensor, pos: torch.Tensor, out: torch.Tensor) -> None:
        self.graph, self.x, self.pos, self.out = graph, x, pos, out


class _Graphs:
    """A KV cache's graphs by key, their memory pool and side stream, and the tensors whose addresses they were
    captured at."""

    def __init__(self, gpt: torch.nn.Module, device: torch.device) -> None:
        self.by_key: dict[tuple, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device=device)
        self.watched = _watched(gpt)

    def current(self, gpt: torch.nn.Module) -> bool:
        own = vars(gpt)
        return all((t := (own if d is None else d).get(name)) is not None and t.data_ptr() == ptr
                   for d, name, ptr in self.watched)


def _watched(gpt: torch.nn.Module) -> list[tuple[dict | None, str, int]]:
    """What a replay reads or writes by address: every parameter and buffer (the KV caches', the mask's, RoPE's), each
    as (the dict that holds it, its name, its address): read straight from the module's ``_parameters`` /
    ``_buffers`` at every step, without ``nn.Module.__getattr__`` (0.4 of a 2.5 ms step at Llama-3.2-1B). ``gpt``'s
    own attributes (``mask_cache``, ``cos``, ``sin``) as None: their dict holds these graphs, and holding it here would
    make a reference cycle that keeps a dropped model's memory until Python's next collection."""
    out: list[tuple[dict | None, str, int]] = []
    for module in gpt.modules():
        for d in (module._parameters, module._buffers):
            out.extend((d, name, t.data_ptr()) for name, t in d.items() if t is not None)
    for name in ("mask_cache", "cos", "sin"):
        t = vars(gpt).get(name)
        if isinstance(t, torch.Tensor):
            out.append((None, name, t.data_ptr()))
    return out


def key_length(input_pos_maxp1: Any, cache_length: int) -> int | None:
    """The key length a step's graph attends over: ``input_pos_maxp1`` (litgpt's filled length of the cache, a Python
    int) rounded up to a power of two, at least :data:`MIN_KEYS`; None (the whole cache) where that is no shorter than
    ``cache_length`` or litgpt gives no int."""
    if not isinstance(input_pos_maxp1, int) or isinstance(input_pos_maxp1, bool) or input_pos_maxp1 < 1:
        return None
    n = max(MIN_KEYS, 1 << (input_pos_maxp1 - 1).bit_length())
    return n if n < cache_length else None


def _why_not(gpt: torch.nn.Module, idx: torch.Tensor, input_pos: torch.Tensor, lm_head_chunk_size: int) -> str | None:
    """Why this call is not a step the graph serves (None: it is)."""
    from .._dist import several_processes

    if getattr(gpt, "_liger_cuda_graphs", None) is False or vars(gpt).get(_ATTR) is _OFF:
        return "off"
    if idx.device.type != "cuda" or idx.dim() != 2 or idx.shape[1] != 1 or input_pos.device != idx.device:
        return "not a one-token CUDA step"
    if torch.is_grad_enabled() or gpt.training or lm_head_chunk_size or torch.compiler.is_compiling():
        return "grad, training, a chunked head or torch.compile"
    if torch.cuda.is_current_stream_capturing() or several_processes():
        return "inside a capture, or several processes"
    if getattr(gpt, "mask_cache", None) is None:
        return "no KV cache"
    for block in gpt.transformer.h:
        cache = getattr(block.attn, "kv_cache", None)
        if cache is None or getattr(cache, "is_sliding_window", False):
            return "a Block without a KV cache, or a sliding-window one"
    return None


def drop(gpt: torch.nn.Module) -> None:
    """Forget ``gpt``'s decode graphs (their memory pool goes back to PyTorch's allocator); a failed capture's "off" is
    kept."""
    if isinstance(vars(gpt).get(_ATTR), _Graphs):
        del vars(gpt)[_ATTR]


def _capture(gpt: torch.nn.Module, state: _Graphs, forward: Any, idx: torch.Tensor, input_pos: torch.Tensor) -> _Graph:
    from .graphs import _no_gc, _recording

    x, pos = idx.clone(), input_pos.clone()
    stream, current = state.stream, torch.cuda.current_stream(idx.device)
    with _no_gc(collect=False):  # (no collection, with its __del__s, inside the recording)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):  # (the warm-up: lazy initializations and plans outside the capture)
            forward(x, pos)
        graph = torch.cuda.CUDAGraph()
        with _recording(graph, state.pool, stream):
            out = forward(x, pos)
        current.wait_stream(stream)
    state_of(gpt).decode["captures"] += 1
    return _Graph(graph, x, pos, out)


def step(gpt: torch.nn.Module, forward: Any, idx: torch.Tensor, input_pos: torch.Tensor,
         input_pos_maxp1: Any = None, lm_head_chunk_size: int = 0) -> torch.Tensor | None:
    """The logits of a one-token KV-cache step of ``gpt`` from its decode graph for this key length (see
    :func:`key_length`), made where there is none yet; ``forward(idx, input_pos, input_pos_maxp1=...)``: litgpt's
    forward. None where the step is not one the graphs serve (see the module's doc): the caller runs litgpt's forward
    as it was called."""
    if _why_not(gpt, idx, input_pos, lm_head_chunk_size) is not None:
        return None
    keys = key_length(input_pos_maxp1, min(gpt.mask_cache.shape[-1], gpt.max_seq_length))
    # (inference mode in the key: a graph's inputs made under it cannot be written outside it)
    key = (tuple(idx.shape), idx.dtype, tuple(input_pos.shape), input_pos.dtype, idx.device,
           torch.is_inference_mode_enabled(), keys)
    state = vars(gpt).get(_ATTR)
    if not isinstance(state, _Graphs) or not state.current(gpt):
        state = None
    g = None if state is None else state.by_key.get(key)
    if g is None:
        try:
            with torch.cuda.device(idx.device):
                if state is None or len(state.by_key) >= MAX_GRAPHS:
                    drop(gpt)
                    state = vars(gpt)[_ATTR] = _Graphs(gpt, idx.device)
                g = state.by_key[key] = _capture(gpt, state, functools.partial(forward, input_pos_maxp1=keys), idx,
                                                 input_pos)
        except Exception as e:  # noqa: BLE001 - litgpt's forward then runs, for this model from now on
            if state is not None:
                from .graphs import _end_allocating

                _end_allocating(state.pool, idx.device)
            state_of(gpt).decode["failed"] += 1
            vars(gpt)[_ATTR] = _OFF
            warnings.warn(f"lit-liger: the KV-cache step could not be captured as a CUDA graph "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); generation runs "
                          "uncaptured for this model", stacklevel=3)
            return None
    g.x.copy_(idx)
    g.pos.copy_(input_pos)
    with torch.cuda.device(idx.device):
        g.graph.replay()
    state_of(gpt).decode["replays"] += 1
    return g.out.clone()
