"""Attention for the layers where LitGPT does not call plain causal SDPA: attention logit softcapping
(Gemma-2) and sliding windows (Gemma-2/3, Mistral-7B-v0.1, Phi-3 ... any ``sliding_window_size``).

LitGPT computes those layers (training, no KV cache) as ``q @ kᵀ`` -> scale -> softcap -> + a (T, T)
mask -> fp32 softmax -> ``@ v``, keeping ``(B, nh, T, T)`` tensors, and builds a sliding window's
``(T, T)`` mask with a Python loop over its rows in every forward of every such layer. On CUDA tensors
the same math runs here as one fused PyTorch FlexAttention kernel, forward and backward (the softcap's
derivative comes from autograd of its ``score_mod``):

* scale: ``1 / sqrt(attention_scores_scalar or head_size) * mscale**2`` (LitGPT's), applied to ``q·k``
  before the softcap, as LitGPT does;
* softcap: ``score_mod = cap * tanh(score / cap)``, then the mask, as LitGPT adds it after the softcap;
* mask: LitGPT's training mask as a FlexAttention block mask (:func:`window_mask_mod`): causal, or in
  a sliding-window layer query ``i`` sees keys ``i - W < j <= i`` (``W = sliding_window_size``). Blocks
  wholly outside it are skipped: a window layer costs ``O(T·W)``, not ``O(T²)``;
* GQA/MQA: ``enable_gqa`` reads each kv head where it is (no ``repeat_interleave`` copies).

Where it runs: on CUDA tensors where ``torch.nn.attention.flex_attention`` exists (torch >= 2.5). In
eager mode a module-level ``torch.compile(flex_attention)`` runs it (see :func:`_compiled_flex` for its
shapes and recompiles); under an outer ``torch.compile`` the plain function is traced
(dynamo handles FlexAttention natively). Elsewhere -- CPU tensors (eager, or Triton's interpreter in
CI) -- the adapter runs LitGPT's own math after lit-liger's RoPE, with :func:`dense_mask` in window
layers: FlexAttention has no CPU backward, and CI's reference is LitGPT's result.

The plain causal layers' SDPA backend (``LigerConfig.sdpa_backend``: :func:`sdpa_backend_for`) and, for a recomputed
Block of a long sequence, its attention output kept from the forward so its rerun in backward skips the attention's
forward (:func:`kept_sdpa`, ``MemPlan.attn``) are here too; every recomputed Block's rerun runs the attention's
backward over slices of key/value groups where the query is large (:func:`sliced_sdpa_backward`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..kernels._launch import attn_bwd_slices, flex_kernel_options

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch: the adapter runs LitGPT's math (reported)
    create_block_mask = flex_attention = None

__all__ = [
    "RECOMPILE_LIMIT",
    "SDPA_BACKENDS",
    "SDPA_LONG",
    "sdpa_backend_for",
    "sdpa_flags",
    "block_mask",
    "check_window",
    "dense_mask",
    "describe",
    "effective_window",
    "flex_attend",
    "flex_available",
    "softcap_score_mod",
    "sliced_sdpa_backward",
    "window_mask_mod",
]

#: dynamo's recompile limit while the eager-mode compiled FlexAttention is called (default 8 per code object).
#: Every (score_mod, mask_mod) variant, dtype and grad mode is its own cache entry, and automatic dynamic
#: shapes add one more per variant when a second sequence length arrives: a Gemma-2 model (local and
#: global layers) in training and validation reaches 8. Past the limit dynamo would run the frame uncompiled,
#: i.e. FlexAttention's unfused reference that materializes the (B, nh, T, T) scores (a log line and a
#: warning say so, nothing fails).
RECOMPILE_LIMIT = 64

#: tests set this to run the FlexAttention path on CPU tensors (FlexAttention's unfused eager reference:
#: forward only, it has no CPU backward); lit-liger itself uses FlexAttention on CUDA tensors only
_FLEX_ON_CPU = False

# eager-mode caches (never read or written while torch.compile traces: there each call builds its own)
_BLOCK_MASKS: dict[tuple[int, int | None, torch.device], Any] = {}
_MASK_MODS: dict[int | None, Callable] = {}
_SCORE_MODS: dict[float, Callable] = {}
_COMPILED: Callable | None = None


def flex_available() -> bool:
    """Whether this torch has FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5)."""
    return flex_attention is not None


def check_window(window: Any, name: str = "sliding_window_size") -> None:
    """A sliding window is a positive integer or None (``name``: how the caller's user spells it)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {window!r}")


def effective_window(T: int, window: int | None) -> int | None:
    """The window that limits a length-``T`` sequence: None where every key is inside it (no window, or
    ``window >= T``: LitGPT's window mask is then exactly the causal mask)."""
    check_window(window)
    return None if window is None or window >= T else window


def window_mask_mod(window: int | None) -> Callable:
    """LitGPT's training attention mask as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``:
    causal (``kv_idx <= q_idx``) without a window; with a window ``W`` (LitGPT's loop sets row ``i`` to 0
    on columns ``max(0, i - W + 1) .. i``) ``q_idx - W < kv_idx <= q_idx``. One function object per
    window in eager mode (the compiled FlexAttention guards on it); the block mask, :func:`dense_mask`
    and the tests all evaluate this one definition."""
    check_window(window)
    return _one_per_key(_MASK_MODS, window, _make_mask_mod)


def _one_per_key(cache: dict, key: Any, make: Callable) -> Callable:
    """``make(key)``, one function object per key in eager mode (kept in ``cache``); under ``torch.compile``
    a fresh one each call (no Python state read or written while tracing)."""
    if torch.compiler.is_compiling():
        return make(key)
    fn = cache.get(key)
    if fn is None:
        fn = cache[key] = make(key)
    return fn


def _make_mask_mod(window: int | None) -> Callable:
    if window is None:

        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx

        return causal

    def sliding_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return sliding_window


def softcap_score_mod(cap: float) -> Callable:
    """LitGPT's ``do_softcapping`` on the scaled score, ``tanh(score / cap) * cap``, as a FlexAttention
    ``score_mod``; its derivative ``1 - tanh²`` comes from autograd through FlexAttention's backward.
    One function object per cap in eager mode, as :func:`window_mask_mod`."""
    cap = float(cap)
    if not cap > 0:
        raise ValueError(f"attention_logit_softcapping must be > 0, got {cap!r}")
    return _one_per_key(_SCORE_MODS, cap, _make_score_mod)


def _make_score_mod(cap: float) -> Callable:
    def softcap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return softcap


def dense_mask(T: int, window: int | None, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """``(1, 1, T, T)`` additive mask (0 where :func:`window_mask_mod` allows, ``-inf`` elsewhere, as
    LitGPT builds its sliding-window mask): the reference path's mask, built without a loop over rows."""
    i = torch.arange(T, device=device)
    allowed = window_mask_mod(window)(0, 0, i[:, None], i[None, :])  # (T, T) bool
    mask = torch.zeros(T, T, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return mask.view(1, 1, T, T)


def block_mask(T: int, window: int | None, device: torch.device):
    """FlexAttention ``BlockMask`` of :func:`window_mask_mod` for a length-``T`` self-attention.

    In eager mode one per ``(T, window, device)``, built on first use and kept (sequence buckets keep the
    lengths few; a mask holds ``O((T / 128)²)`` small integers). Built outside any CUDA-graph capture: the
    capture in ``lit_liger.runtime.graphs`` runs the same shape once before capturing, which fills this cache, and
    a capture that meets an unbuilt shape raises (the capture then falls back to uncaptured steps). Under
    ``torch.compile`` the mask is built inside the traced graph (no Python state read or written)."""
    mask_mod = window_mask_mod(window)
    if torch.compiler.is_compiling():
        return create_block_mask(mask_mod, None, None, T, T, device=device)
    key = (T, window, torch.device(device))
    bm = _BLOCK_MASKS.get(key)
    if bm is None:
        if key[2].type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"lit-liger: FlexAttention block mask for T={T}, window={window} requested during CUDA-graph "
                "capture; run the same shape once uncaptured first (a warm-up) so it is built outside capture"
            )
        bm = _BLOCK_MASKS[key] = _outside_graph_pools(
            lambda: create_block_mask(mask_mod, None, None, T, T, device=key[2]), key[2])
    return bm


_MASK_STREAMS: dict[torch.device, Any] = {}


def _outside_graph_pools(make: Callable, device: torch.device) -> Any:
    """``make()`` with its CUDA allocations outside any CUDA-graph memory pool: on a stream of its own, which
    the current stream then waits for. ``lit_liger.runtime.graphs`` runs each new shape's warm-up with the current
    stream's allocations routed into the graphs' shared pool (``WARMUP_IN_POOL``); a tensor that outlives the
    warm-up there, such as a block mask kept in this cache, can sit in blocks that an earlier captured graph
    uses as scratch, and that graph's next replay overwrites it (the masks' block indices then point anywhere:
    "an illegal memory access" on an H100 after a second bucket's capture)."""
    if device.type != "cuda":
        return make()
    current = torch.cuda.current_stream(device)
    stream = _MASK_STREAMS.get(device)
    if stream is None:
        stream = _MASK_STREAMS[device] = torch.cuda.Stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        out = make()
    current.wait_stream(stream)
    return out


def _compiled_flex() -> Callable:
    """The eager-mode FlexAttention: ``torch.compile(flex_attention)``, made once. ``dynamic=None``
    (dynamo's automatic dynamic shapes) rather than ``dynamic=False``: the first shape of each variant
    compiles a static kernel (the fastest; a fixed-shape run such as a benchmark keeps it), and a second
    sequence length or batch size recompiles with those sizes symbolic, so variable-length fine-tuning
    compiles a few times per variant instead of once per sequence bucket (each compile of FlexAttention's
    forward and backward takes seconds). ``fullgraph``: a graph break is an error, not a silent unfused
    fallback. Its recompiles are allowed up to :data:`RECOMPILE_LIMIT` (see :func:`flex_attend`)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention, dynamic=None, fullgraph=True)
    return _COMPILED


def _limit_name() -> str:
    cfg = torch._dynamo.config
    return "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # renamed in torch 2.6


def flex_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal self-attention of ``q (B, nh, T, hs)`` over ``k, v (B, ng, T, hs)`` (``nh`` a multiple of
    ``ng``) with LitGPT's scale / softcap / sliding-window semantics, on FlexAttention. Returns
    ``(B, nh, T, hs)`` in ``q``'s dtype."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, heads, T, hs); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, nh, T, hs = q.shape
    ng = k.shape[1]
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != T or k.shape[3] != hs or nh % ng:
        raise ValueError(f"k, v must be (B, ng, T, hs) with nh % ng == 0 for q {tuple(q.shape)}; got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    window = effective_window(T, window)
    kw = dict(
        score_mod=softcap_score_mod(softcap) if softcap is not None else None,
        block_mask=block_mask(T, window, q.device),
        scale=scale,
        enable_gqa=ng != nh,
    )
    options = flex_kernel_options(hs, q.dtype, q.device, windowed=window is not None)
    if options is not None:
        kw["kernel_options"] = options
    if torch.compiler.is_compiling() or q.device.type != "cuda":
        # traced into the caller's graph by an outer torch.compile; on CPU (tests only) the eager reference
        return flex_attention(q, k, v, **kw)
    cfg, name = torch._dynamo.config, _limit_name()
    old = getattr(cfg, name)
    old_float = getattr(cfg, "specialize_float", None)
    setattr(cfg, name, max(old, RECOMPILE_LIMIT))  # ~6 us on the host per call; see RECOMPILE_LIMIT
    if old_float is not None:
        # the scale as a constant: measured on an H100 (torch 2.11), a second scale value in one process (another
        # model) made dynamo trace it as a symbolic float, which FlexAttention's backward cannot take ("Pending
        # unbacked symbols"); specialized, each scale value compiles its own static kernel, as the first did
        cfg.specialize_float = True
    try:
        return _compiled_flex()(q, k, v, **kw)
    finally:
        setattr(cfg, name, old)
        if old_float is not None:
            cfg.specialize_float = old_float


def describe(softcap: float | None, window: int | None, path: str, triton: bool = False) -> str:
    """The report's name of a layer's attention kernel. ``path``: ``"flex"`` (FlexAttention on CUDA,
    LitGPT's math elsewhere), ``"sdpa"`` (plain causal layers), or why LitGPT's math runs everywhere.
    ``triton``: a softcap layer runs lit-liger's Triton kernel where its sequence fits inside its window
    (``LigerConfig.softcap_attention``)."""
    what = ", ".join(x for x in (f"softcap {softcap}" if softcap is not None else "",
                                 f"sliding window {window}" if window is not None else "") if x)
    if path == "sdpa":
        return "attention: SDPA (causal)"
    if path == "flex":
        if triton and softcap is not None:
            where = f", sequences up to {window} tokens" if window is not None else ""
            return (f"attention: lit-liger Triton causal softcap {softcap} (bf16/fp16 on CUDA{where}); flex attention "
                    f"({what}) otherwise; LitGPT's math on CPU without the Triton interpreter")
        return f"attention: flex attention ({what}) on CUDA; LitGPT's math on CPU"
    return f"attention: LitGPT's math ({what}; {path})"


# ------------------------------------------------------------------------------------------------
# SDPA backend of the plain causal layers (LigerConfig.sdpa_backend)
# ------------------------------------------------------------------------------------------------
#: the settings of ``LigerConfig.sdpa_backend`` -> the SDPA backends left enabled, in the flags' order
#: ``(flash, mem_efficient, math, cudnn)`` of ``torch.backends.cuda``; ``"torch"``: PyTorch's own choice (its flags
#: untouched). Each leaves a fallback on, so a call that the preferred kernel cannot take (fp32 for flash, a head
#: size it does not support) still runs.
SDPA_BACKENDS: dict[str, tuple[bool, bool, bool, bool] | None] = {
    "torch": None,
    "flash": (True, True, True, False),
    "efficient": (False, True, True, False),
    "cudnn": (True, True, True, True),
    "math": (False, False, True, False),
}


#: sequences of at least this many tokens take PyTorch's SDPA choice (cuDNN on an H100) in uncaptured steps too: its
#: per-shape plan (~0.2 s of host time per new length, a handful of lengths with ``seq_buckets``) is small next to
#: such steps, and its kernels are faster there. Measured on an H100 (torch 2.11, ``python -m benchmarks diag
#: graph-gain``, LoRA, B 1): a captured step (cuDNN) ran 1.23x the uncaptured one (flash) at 16,384 tokens for
#: Llama-3.1-8B and Llama-3.2-1B alike, where the graphs save no host time to speak of
SDPA_LONG = 4096


def sdpa_backend_for(setting: str, device: torch.device, captured: bool = False) -> str:
    """The backend ``setting`` (a key of :data:`SDPA_BACKENDS` or ``"auto"``) means on ``device``; ``captured``:
    for a step captured as a CUDA graph (``LigerConfig.cuda_graphs``), or a sequence of :data:`SDPA_LONG` tokens.

    ``"auto"``, by measurement on an H100 (torch 2.11, litgpt's LoRA recipe on Llama-3.2-1B, Alpaca-shaped
    lengths in buckets, ``benchmarks/results/h100-2026-11-24/``): PyTorch picks cuDNN attention there, which
    builds a plan per new (batch, length) shape (110-220 ms of host time for one layer's forward + backward,
    against under 2 ms for flash attention's first call):

    * uncaptured steps: ``"flash"`` on NVIDIA sm80+ (no plans; 16,985 vs 16,144 tokens/s with cuDNN at
      micro-batch 4), PyTorch's choice elsewhere;
    * captured steps: ``"torch"`` (cuDNN on an H100): its plans are built once per bucket in the warm-up, and
      the replayed kernels are faster (51,726 vs 48,494 tokens/s at micro-batch 4; 21,592 vs 19,899 at 1).

    ROCm keeps PyTorch's choice (not measured here)."""
    if setting != "auto":
        return setting
    if captured:
        return "torch"
    if device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device) >= (8, 0):
        return "flash"
    return "torch"


class sdpa_flags:
    """Context manager: only the SDPA backends of ``flags`` (see :data:`SDPA_BACKENDS`) enabled, the previous
    flags restored on exit. Flips just the flags that differ (a few microseconds: it runs once per layer and
    step on the host). Eager mode only: ``torch.compile`` chooses its own kernel."""

    __slots__ = ("flags", "old")
    _GET = (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
            torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)
    _SET = (torch.backends.cuda.enable_flash_sdp, torch.backends.cuda.enable_mem_efficient_sdp,
            torch.backends.cuda.enable_math_sdp, torch.backends.cuda.enable_cudnn_sdp)

    def __init__(self, flags: tuple[bool, bool, bool, bool] | None) -> None:
        self.flags = flags
        self.old: tuple | None = None

    def __enter__(self) -> None:
        if self.flags is None:
            return
        self.old = tuple(get() for get in self._GET)
        for set_, old, new in zip(self._SET, self.old, self.flags):
            if old != new:
                set_(new)

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            for set_, old, new in zip(self._SET, self.old, self.flags):
                if old != new:
                    set_(old)
            self.old = None


# ------------------------------------------------------------------------------------------------
# a recomputed Block's attention output kept for its rerun (MemPlan.attn, lit_liger.runtime.memplan.keep_attention)
# ------------------------------------------------------------------------------------------------
class KeptAttention:
    """One recomputed Block's attention output and log-sum-exp, kept from its forward for its rerun in backward, which
    then skips the attention's forward: its backward takes them with q, k, v (:func:`kept_sdpa`). ``runtime``: where
    given, they wait in pinned host memory (its ``to_host`` / ``from_host``, off the compute stream); else on the
    GPU. Filled by the Block's forward, read by a rerun without grad (an offloaded pair's, which makes its second
    Block's input), emptied by the rerun with grad; it lives with the checkpoint that holds it (a backward that never
    runs frees it with its graph). ``keep=False``: a recomputed Block that keeps nothing (its rerun runs the
    attention's forward again), whose rerun's backward still runs over slices of key/value groups (:func:`kept_sdpa`)."""

    __slots__ = ("runtime", "saved", "keep")

    def __init__(self, runtime: Any = None, keep: bool = True) -> None:
        self.runtime, self.saved, self.keep = runtime, None, keep

    def put(self, backend: str, out: torch.Tensor, lse: torch.Tensor, aux: tuple) -> None:
        if not self.keep:
            return
        rt = self.runtime
        # the kernels' output is (B, T, nh, hs) in memory, a (B, nh, T, hs) view: copied out as the former
        flip = not out.is_contiguous() and out.transpose(1, 2).is_contiguous()
        out_t = out.detach().transpose(1, 2) if flip else out.detach()
        if rt is not None:
            out_t, lse = rt.to_host(out_t), rt.to_host(lse)
        self.saved = (backend, out_t, flip, lse, aux)

    def get(self, take: bool) -> tuple | None:
        """``(backend, out, lse, aux)`` on the device, or None where nothing is kept; ``take``: emptied after."""
        if self.saved is None:
            return None
        backend, out, flip, lse, aux = self.saved
        if take:
            self.saved = None
        if self.runtime is not None:
            out, lse = self.runtime.from_host(out), self.runtime.from_host(lse)
        return backend, (out.transpose(1, 2) if flip else out), lse, aux


def _kept_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> str | None:
    """The fused causal kernel PyTorch's SDPA would run for this call (its enabled backends, the groups as they are
    with ``enable_gqa``) where lit-liger can call its forward and backward apart: ``"flash"`` or ``"cudnn"`` on CUDA,
    ``"cpu"`` (the CPU's flash kernel) on CPU; None elsewhere (the memory-efficient or math kernels: the rerun then
    runs the attention again)."""
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True, scale=scale, enable_gqa=k.size(1) != q.size(1))
    if q.device.type == "cpu":
        return "cpu" if choice == int(SDPBackend.FLASH_ATTENTION) else None
    if q.is_cuda:
        return {int(SDPBackend.FLASH_ATTENTION): "flash", int(SDPBackend.CUDNN_ATTENTION): "cudnn"}.get(choice)
    return None


def _sdpa_forward(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple:
    """``(out, lse, aux)`` of the causal attention through ``backend``'s aten kernel (no dropout): what its backward
    takes besides q, k, v."""
    aten = torch.ops.aten
    if backend == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        return out, lse, ()
    if backend == "flash":
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale)
    else:
        out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False, scale=scale)
    return out, lse, (cq, ck, mq, mk, seed, offset)


def _sdpa_backward(backend: str, g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, aux: tuple, scale: float) -> tuple:
    aten = torch.ops.aten
    if g.stride() != out.stride():  # (cuDNN's backward reads the output's gradient in the output's layout)
        g = torch.empty_strided(out.size(), out.stride(), dtype=g.dtype, device=g.device).copy_(g)
    if backend == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, True, scale=scale)
    cq, ck, mq, mk, seed, offset = aux
    if backend == "flash":
        return aten._scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True,
                                                                 seed, offset, scale=scale)
    return aten._scaled_dot_product_cudnn_attention_backward(g, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk,
                                                             0.0, True, scale=scale)


class _Held:
    __slots__ = ("backend", "out", "lse", "aux", "scale")

    def __init__(self, backend, out, lse, aux, scale) -> None:
        self.backend, self.out, self.lse, self.aux, self.scale = backend, out, lse, aux, scale


class _KeptSDPA(torch.autograd.Function):
    """Causal attention whose output (and log-sum-exp) were computed before: the forward returns the output, the
    backward runs the kernel's backward on them."""

    @staticmethod
    def forward(ctx, q, k, v, held):
        ctx.save_for_backward(q, k, v, held.out, held.lse)
        ctx.backend, ctx.aux, ctx.scale = held.backend, held.aux, held.scale
        out, held.out, held.lse = held.out, None, None  # (the graph holds them through the saved tensors only)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        return (*sliced_sdpa_backward(ctx.backend, g, q, k, v, out, lse, ctx.aux, ctx.scale), None)


def sliced_sdpa_backward(backend: str, g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         out: torch.Tensor, lse: torch.Tensor, aux: tuple, scale: float) -> tuple:
    """``(dq, dk, dv)`` of the causal attention of ``q (B, nh, T, hs)`` over ``k, v (B, ng, T, hs)`` from its
    output's gradient ``g``, its output and log-sum-exp, through ``backend``'s aten backward, over slices of whole
    key/value groups (``kernels._launch.attn_bwd_slices``; the heads of a slice attend only to its groups, so each
    slice's gradients are those of the whole call): the kernel's float32 accumulator of the query's gradient then
    spans one slice, not the whole query (4 GiB at Llama-3.1-8B's width and 262,144 tokens)."""
    ng, nh = k.size(1), q.size(1)
    parts = attn_bwd_slices(ng, q.numel() * q.element_size())
    if parts == 1:
        return _sdpa_backward(backend, g, q, k, v, out, lse, aux, scale)[:3]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    gs, hs = ng // parts, nh // parts  # (key/value groups, query heads) a slice
    for i in range(parts):
        qh, kh = slice(i * hs, (i + 1) * hs), slice(i * gs, (i + 1) * gs)
        grads = _sdpa_backward(backend, g[:, qh], q[:, qh], k[:, kh], v[:, kh], out[:, qh], lse[:, qh], aux, scale)
        dq[:, qh].copy_(grads[0])
        dk[:, kh].copy_(grads[1])
        dv[:, kh].copy_(grads[2])
        del grads
    return dq, dk, dv


def kept_sdpa(kept: KeptAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              scale: float) -> torch.Tensor | None:
    """Causal self-attention of ``q (B, nh, T, hs)`` over ``k, v (B, ng, T, hs)`` for a recomputed Block that keeps
    its attention's output (``kept``): the forward computes it and keeps it with its log-sum-exp; the rerun in
    backward takes them and runs only the attention's backward. Returns ``(B, nh, T, hs)``; None where PyTorch's
    choice for the call is a kernel lit-liger cannot call apart (:func:`_kept_backend`: the caller attends as usual).
    Inside ``sdpa_flags``: the backend is the one SDPA would pick there."""
    grad = torch.is_grad_enabled()
    saved = kept.get(take=grad)
    if saved is None:
        backend = _kept_backend(q, k, v, scale)
        if backend is None:
            return None
        with torch.no_grad():
            out, lse, aux = _sdpa_forward(backend, q, k, v, scale)
        kept.put(backend, out, lse, aux)
    else:
        backend, out, lse, aux = saved
    if not (grad and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return out
    return _KeptSDPA.apply(q, k, v, _Held(backend, out, lse, aux, scale))
