"""litgpt's sample generation on a swapped model: each one-token KV-cache step replayed from one CUDA graph.

litgpt's fine-tuning recipes generate a sample at every evaluation (``generate_example``: ``set_kv_cache``, up to
``eval.max_new_tokens`` one-token steps through ``litgpt.generate.base.generate``, ``clear_kv_cache``). Each step is a
whole model forward for one token, bound by the host's launches; and litgpt passes ``input_pos_maxp1`` (the cache's
filled length), so the attention's key length, and with it the attention kernel's plan, changes at every token. On an
H200 (Llama-3.2-1B LoRA, the shipped LoRA recipe, ``benchmarks/results/h200-2026-11-29e``) the five generations of a
run took 22 s of its 44 s ``fit``, stock's as long; the first one 10-12 s, 6.4 s of them in
``scaled_dot_product_attention`` (a new plan for each of its 100 key lengths).

Here the step at a given (batch, dtype) runs as one CUDA graph: litgpt's forward with ``input_pos_maxp1=None``, the
attention over the whole cache with litgpt's mask (the form litgpt runs itself for Thunder modules), all shapes fixed.
The token and its positions are copied into the graph's inputs, the graph replayed, its logits returned as a new
tensor. The first step of a cache runs once uncaptured (its writes into the cache are those the replay makes again),
then is captured. The graph lives with the KV cache: ``set_kv_cache`` and ``clear_kv_cache`` drop it, and a cache
buffer, mask, RoPE table or parameter found at another address recaptures it. Uncaptured, as before: the prompt
(prefill), grad enabled, training mode, a sliding-window cache (it reads its length back), more than one process
(:func:`lit_liger._dist.several_processes`), ``lm_head_chunk_size``, ``torch.compile``, CPU tensors,
``LigerConfig.cuda_graphs=False`` or :data:`DECODE_GRAPHS` off. A capture that fails turns it off for the model,
with one warning, and the step runs uncaptured.

The logits are litgpt's up to the attention's summation order (the masked keys weigh exactly zero), so a sampled token
can differ from stock's at the same seed where two are nearly tied, as with any change of attention kernel.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["DECODE_GRAPHS", "STATS", "drop", "step"]

#: capture the one-token KV-cache step (off: litgpt's forward at every step)
DECODE_GRAPHS = True

#: this process's decode graphs: captures, replays, capture failures (tests and the benchmarks read them)
STATS = {"captures": 0, "replays": 0, "failed": 0}

_ATTR = "_liger_decode"  # (removed with the other _liger_ attributes by remove_liger)
_OFF = "off"


class _Graph:
    """One captured step: its graph, static inputs and logits, and the tensors whose addresses it was captured at."""

    def __init__(self, key: tuple, graph: Any, x: torch.Tensor, pos: torch.Tensor, out: torch.Tensor,
                 watched: list[tuple[Any, str, int]]) -> None:
        self.key, self.graph, self.x, self.pos, self.out, self.watched = key, graph, x, pos, out, watched

    def current(self) -> bool:
        return all(_ptr(owner, name) == ptr for owner, name, ptr in self.watched)


def _ptr(owner: Any, name: str) -> int:
    t = getattr(owner, name, None)
    return t.data_ptr() if isinstance(t, torch.Tensor) else -1


def _watched(gpt: torch.nn.Module) -> list[tuple[Any, str, int]]:
    """What a replay reads or writes by address: every parameter and buffer (the KV caches', the mask's, RoPE's)."""
    out = []
    for module in gpt.modules():
        for name, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None:
                out.append((module, name, t.data_ptr()))
    for name in ("mask_cache", "cos", "sin"):
        if isinstance(getattr(gpt, name, None), torch.Tensor) and name not in gpt._buffers:
            out.append((gpt, name, getattr(gpt, name).data_ptr()))
    return out


def _why_not(gpt: torch.nn.Module, idx: torch.Tensor, input_pos: torch.Tensor, lm_head_chunk_size: int) -> str | None:
    """Why this call is not a step the graph serves (None: it is)."""
    from ._dist import several_processes

    if not DECODE_GRAPHS or getattr(gpt, "_liger_cuda_graphs", None) is False or vars(gpt).get(_ATTR) is _OFF:
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
    """Forget ``gpt``'s decode graph (its memory pool goes back to PyTorch's allocator); a failed capture's "off" is
    kept."""
    if isinstance(vars(gpt).get(_ATTR), _Graph):
        del vars(gpt)[_ATTR]


def _capture(gpt: torch.nn.Module, forward: Any, idx: torch.Tensor, input_pos: torch.Tensor, key: tuple) -> _Graph:
    x, pos = idx.clone(), input_pos.clone()
    stream = torch.cuda.Stream(device=idx.device)
    stream.wait_stream(torch.cuda.current_stream(idx.device))
    with torch.cuda.stream(stream):  # (the warm-up: lazy initializations and plans outside the capture)
        forward(x, pos)
    torch.cuda.current_stream(idx.device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        out = forward(x, pos)
    STATS["captures"] += 1
    return _Graph(key, graph, x, pos, out, _watched(gpt))


def step(gpt: torch.nn.Module, forward: Any, idx: torch.Tensor, input_pos: torch.Tensor,
         lm_head_chunk_size: int = 0) -> torch.Tensor | None:
    """The logits of a one-token KV-cache step of ``gpt`` from its decode graph, made where there is none yet;
    ``forward(idx, input_pos)``: litgpt's forward with ``input_pos_maxp1=None``. None where the step is not one the
    graph serves (see the module's doc): the caller runs litgpt's forward as it was called."""
    if _why_not(gpt, idx, input_pos, lm_head_chunk_size) is not None:
        return None
    # (inference mode in the key: a graph's inputs made under it cannot be written outside it)
    key = (tuple(idx.shape), idx.dtype, tuple(input_pos.shape), input_pos.dtype, idx.device,
           torch.is_inference_mode_enabled())
    g = vars(gpt).get(_ATTR)
    if not isinstance(g, _Graph) or g.key != key or not g.current():
        drop(gpt)
        try:
            with torch.cuda.device(idx.device):
                g = _capture(gpt, forward, idx, input_pos, key)
        except Exception as e:  # noqa: BLE001 - litgpt's forward then runs, for this model from now on
            STATS["failed"] += 1
            vars(gpt)[_ATTR] = _OFF
            warnings.warn(f"lit-liger: the KV-cache step could not be captured as a CUDA graph "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); generation runs "
                          "uncaptured for this model", stacklevel=3)
            return None
        vars(gpt)[_ATTR] = g
    g.x.copy_(idx)
    g.pos.copy_(input_pos)
    with torch.cuda.device(idx.device):
        g.graph.replay()
    STATS["replays"] += 1
    return g.out.clone()
