"""LitGPT's LoRA layers (``litgpt.lora.LoRALinear`` / ``LoRAQKVLinear``) in one autograd function.

LitGPT computes a LoRA layer's update as several small ops: for the fused qkv projection with LoRA on some of
q, k, v, ``dropout(x) @ Aᵀ``, a grouped ``conv1d`` per enabled part (cuDNN convolutions, forward and backward),
a ``cat``, a zero-filled ``(B, T, out)`` tensor with an ``index_copy_`` of the update into it (the "zero pad"),
a scaling multiply and the add to the frozen projection. At litgpt's fine-tuning sizes (micro-batches of 1-4
samples of a few hundred tokens) a step is bound by the host, and those ops cost more host time than the GEMMs
they feed (measured on an H100, Llama-3.2-1B LoRA B4 x T512: the convolutions' forward and backward alone
~11 ms of host time per step of ~80).

:func:`lora_linear` computes the same function with GEMMs only, writing each part's update straight into its
columns of the frozen projection's output::

    y = x Wᵀ + b;   h = dropout(x) Aᵀ  (N, n·r);   y[:, part_i] += scaling · h[:, i·r:(i+1)·r] B_iᵀ

and in backward ``dh``, ``dA``, ``dB`` and ``dx`` as GEMMs (``dx = dy W + dh A`` in one output when there is no
dropout); a frozen ``W`` gets no weight-gradient GEMM. The update is accumulated into the projection's output
inside the GEMM (fp32 accumulation, one rounding) where LitGPT rounds the update to the input dtype first and
then adds: equal in fp32 up to summation order, within bf16 rounding in bf16. Parameters, names and
``state_dict`` keys are LitGPT's; merging, ``lora_filter`` checkpoints and ``merge_lora_weights`` are untouched.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels._launch import lora_branch_sms
from ..kernels.dropout import dropout_grad_add_, dropped_from_bits, encode_dropped_, pack_kept
from ..kernels.rms_norm import rms_norm_again
from ._common import _called_plainly, _is_dtensor, _plain_linear
from .fp8 import is_float8_linear, tensorwise_fusable
from .quant import _4bit_linear, dequantize, is_quantized
from . import tied as _tied


__all__ = ["call_lora", "lora_linear", "lora_parts", "part_tables"]


def lora_parts(module: nn.Module) -> tuple[tuple[int, int], ...]:
    """The output columns ``(lo, hi)`` of each LoRA part of a LitGPT LoRA layer, in the order of ``lora_B``'s rows
    (and of ``lora_A``'s row blocks of ``r``): the whole output for ``LoRALinear``; the enabled ones of q, k, v
    for ``LoRAQKVLinear`` (its fused output is ``[q | k | v]``, ``n_head``, ``n_query_groups``, ``n_query_groups``
    heads of ``head_size``)."""
    enable = getattr(module, "enable_lora", None)
    if enable is None:
        return ((0, module.linear.out_features),)
    q = module.head_size * module.n_head
    kv = module.head_size * module.n_query_groups
    bounds = ((0, q), (q, q + kv), (q + kv, q + 2 * kv))
    return tuple(b for b, on in zip(bounds, enable) if on)


def _side_by_side(parts: tuple[tuple[int, int], ...]) -> bool:
    """Two or more LoRA parts, each starting where the one before ends (no gap): what :func:`part_tables` covers."""
    return len(parts) >= 2 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def part_tables(parts: tuple[tuple[int, int], ...], device: torch.device | str,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where two or more LoRA parts lie side by side (``LoRAQKVLinear`` with q and k, or k and v, or all three on), the
    tables :func:`lora_linear` runs their updates with as one GEMM each way (forward, ``dh``, ``lora_B``'s gradient):
    ``mask (n, W)`` in ``dtype``, 1 where column ``c`` of the parts' ``W`` columns belongs to part ``i``, and
    ``part_of (W, 1, 1)``, each column's part. None for one part or parts with a gap (q and v only): the per-part
    GEMMs. Built with device kernels (no host copy), once per layer and device / dtype by the swapped layers."""
    if not _side_by_side(parts):
        return None
    lo = parts[0][0]
    part_of = torch.empty(parts[-1][1] - lo, dtype=torch.long, device=device)
    for i, (a, b) in enumerate(parts):
        part_of[a - lo:b - lo].fill_(i)
    mask = (part_of.unsqueeze(0) == torch.arange(len(parts), device=device).unsqueeze(1)).to(dtype)
    return mask, part_of.view(-1, 1, 1)


# Inside a CUDA graph's capture, the LoRA branch (dropout, its mask's bits, the rank-r GEMMs, the norm formed again)
# runs on a second stream beside the frozen projection's GEMM, forked from and joined to the capturing stream around
# it. At recipe sizes (a few hundred rows) that GEMM fills a fraction of the GPU's SMs and the branch's ~10 small
# kernels a layer, each a few microseconds, ran after it one by one (gemma2-2b's recipe: +2.8%, h200-2026-12-03f). The
# kernels, their inputs and the order of the random draws are the same either way, but for the backward's frozen
# input-gradient GEMM, which a capture on Hopper runs through cuBLASLt with SMs left to the branch (``_beside_branch``):
# bit for bit the same as cuBLAS's at the GPU test's shapes on an H200, which the test checks. Outside a capture the branch stays on the current stream (a fork and a join cost the host more than they win).
# One second stream per device, shared by every model: a stream holds no data, and one stream (not a new one per
# layer or model) lets PyTorch's allocator, whose free blocks are kept per stream, reuse the branch's blocks.
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _branch_stream(x: torch.Tensor) -> torch.cuda.Stream | None:
    """The LoRA branch's second stream for ``x``'s device while a CUDA graph is being captured there (see the comment
    above :data:`_SIDE_STREAMS`), else None."""
    if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


class _Branch:
    """``with _Branch(side):`` runs its body on ``side`` (None: on the current stream), after the work queued on the
    current stream so far; :meth:`join` makes the current stream wait for it. The caller keeps every tensor the body
    reads or makes referenced until the join: the allocator reuses a block only on the stream that freed it, and a
    block the body allocated is reused there only after a later fork, behind everything queued here before it."""

    def __init__(self, side: torch.cuda.Stream | None) -> None:
        self.side = side
        self.main = torch.cuda.current_stream() if side is not None else None
        self._ctx: Any = None
        self._marked: torch.cuda.Event | None = None

    def __enter__(self) -> _Branch:
        if self.side is not None:
            self.side.wait_stream(self.main)
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None

    def mark(self) -> None:
        """Inside the body: what the body has queued so far is what :meth:`join_marked` waits for."""
        if self.side is not None:
            self._marked = torch.cuda.Event()
            self._marked.record(self.side)

    def join_marked(self) -> None:
        """The current stream waits for the body's work up to :meth:`mark` (the rest of it still running beside
        what comes next); :meth:`join` must still follow, for the rest."""
        if self.side is not None:
            self.main.wait_event(self._marked)

    def join(self) -> None:
        if self.side is not None:
            self.main.wait_stream(self.side)


@contextlib.contextmanager
def _quiet_stderr():
    """The body with the process's stderr (file descriptor 2) pointed at the null device: PyTorch's C++ prints, once a
    process, that its SM carveout is experimental (to stderr, not through Python's warnings), a notice for lit-liger's
    developers (who read it in :func:`lit_liger.kernels._launch.lora_branch_sms`) that would puzzle a user in the
    middle of a run. The body is one call that sets a value."""
    sys.stderr.flush()
    try:
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # (no file descriptor 2 to speak of)
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@contextlib.contextmanager
def _beside_branch(branch: _Branch, t: torch.Tensor):
    """The body's GEMMs through cuBLASLt leaving :func:`lit_liger.kernels._launch.lora_branch_sms` SMs free (PyTorch's
    SM carveout), where ``branch`` runs on a second stream beside them (a capture) and the device and the rows of ``t``
    call for it; the body as it is elsewhere. Both settings are the process's (PyTorch has no other way to give them);
    they are back as they were when the body ends. Inside a capture the carveout is recorded into the graph's kernels,
    so that replays cost no host time for it."""
    sms = lora_branch_sms(t.device, t.shape[0]) if branch.side is not None else None
    if sms is None:
        yield
        return
    blas, carve = torch.backends.cuda.preferred_blas_library(), torch._C._get_sm_carveout_experimental()
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        with _quiet_stderr():
            torch._C._set_sm_carveout_experimental(sms)
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(blas)
        torch._C._set_sm_carveout_experimental(carve)


class _LoRAFn(torch.autograd.Function):
    """``x Wᵀ + b`` plus each LoRA part's ``scaling · (xd Aᵢᵀ) Bᵢᵀ`` in its output columns (see the module doc).
    ``xd``: the LoRA branch's input (``dropout(x)``), or None when it is ``x`` itself. ``source``: how ``x`` is
    formed again in backward from two tensors others keep (``src_a``, ``src_b``), not kept itself: ``("glu",
    activation)``, ``x = act(src_a) * src_b``; ``("rms", eps, offset)``, ``x = rms_norm(src_a, src_b)``."""

    @staticmethod
    def forward(ctx: Any, x, xd, weight, bias, lora_a, lora_b, scaling: float, parts: tuple, r: int, fp8: bool,
                p: float = 0.0, keep_input: bool = False, src_a=None, src_b=None, source: tuple | None = None,
                tables: tuple | None = None):
        C = x.shape[-1]
        x2 = x.reshape(-1, C)  # (N, C)
        ctx.p = p
        # keep_input: x is kept for backward anyway (by another reader, or, given a source, formed again from
        # it): the dropout's mask is kept as bits and dropout(x) formed again in backward (kernels.dropout)
        ctx.source = source if src_a is not None and (keep_input or p == 0) else None
        bits = None
        branch = _Branch(_branch_stream(x2))
        with branch:  # (on a second stream beside the frozen GEMM while a graph is captured: _branch_stream)
            mask = None
            if p > 0:  # the LoRA branch's dropout drawn here (nn.Dropout's call: the same random draws)
                xd2, mask = torch.native_dropout(x2, p, True)
                if not keep_input:
                    encode_dropped_(xd2, mask)  # its mask kept inside xd (2 bytes an element)
                    mask = None
                xd = xd2
            else:
                xd2 = x2 if xd is None else xd.reshape(-1, C)
            h = xd2 @ lora_a.t()  # (N, n·r)
            bt = None  # the parts side by side (tables given): B's blocks on a block diagonal, (n·r, W), one GEMM
            if tables is not None:
                lo, hi = parts[0][0], parts[-1][1]
                bt = lora_b.new_empty(len(parts), r, hi - lo)  # (n, r, W), row-major (B^T is a strided view)
                bt = torch.mul(lora_b.t().unsqueeze(0), tables[0].unsqueeze(1), out=bt).view(-1, hi - lo)  # (n·r, W)
            branch.mark()  # (what the update's addmm waits for)
            if mask is not None:
                # the mask as bits for the backward (1/8 byte an element), after h: beside the frozen GEMM the
                # branch gets SMs only as the GEMM's tiles finish, and the bits are not what the addmm waits for
                bits = pack_kept(mask)
            del mask
        ctx.quantized = is_quantized(weight)  # QLoRA: dequantized here and again in backward, never kept
        ctx.fp8 = fp8  # LigerConfig.fp8 tensorwise: the frozen base's GEMMs in float8 (lit_liger.swap.fp8)
        w_scale = None
        if fp8:
            from .fp8 import frozen_base_fp8

            if weight.requires_grad:
                raise ValueError("lit-liger LoRA: a float8 base weight must be frozen (requires_grad=False)")
            y, w_scale = frozen_base_fp8(x2, weight, bias)
        else:
            y = F.linear(x2, dequantize(weight, x.dtype) if ctx.quantized else weight, bias)  # (N, out)
        branch.join_marked()  # (h and B's blocks; the bits may still be packed beside the addmm)
        if bt is not None:
            y[:, lo:hi].addmm_(h, bt, alpha=scaling)  # the zeros off the diagonal add exact zeros
        else:
            row = 0
            for i, (lo, hi) in enumerate(parts):
                # (N, r) @ (r, hi - lo) accumulated into the part's columns of y: no zero-padded update tensor
                y[:, lo:hi].addmm_(h[:, i * r:(i + 1) * r], lora_b[row:row + hi - lo].t(), alpha=scaling)
                row += hi - lo
        branch.join()
        ctx.bits = bits is not None
        ctx.same_input = xd is None
        # x: for W's gradient, for lora_A's where the LoRA branch reads x itself, and for dropout(x) from the bits
        # (not where the GLU's inputs give it); xd: for lora_A's
        keep_x = ctx.source is None and (weight.requires_grad
                                         or ((ctx.same_input or ctx.bits) and lora_a.requires_grad))
        keep_xd = xd is not None and not ctx.bits
        src = (src_a, src_b) if ctx.source is not None else (None, None)
        ctx.save_for_backward(x2 if keep_x else None, xd2 if keep_xd else None, h, weight, lora_a, lora_b,
                              w_scale, bits, *src, bt, tables[1] if tables is not None else None)
        ctx.x_shape, ctx.scaling, ctx.parts, ctx.r = x.shape, scaling, parts, r
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx: Any, dy):
        x2, xd2, h, weight, lora_a, lora_b, w_scale, bits, src_a, src_b, bt, part_of = ctx.saved_tensors
        need_x, need_xd, need_w, need_b, need_a, need_lb = ctx.needs_input_grad[:6]
        scaling, parts, r = ctx.scaling, ctx.parts, ctx.r
        dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
        if not dy2.is_contiguous():
            dy2 = dy2.contiguous()
        glu = None  # (a, b, activation): the dropout's pass forms the GLU product itself
        dh = dxd_lora = dx = dxd = da = dlb = dw = db = None
        branch = _Branch(_branch_stream(dy2))
        with branch:  # the LoRA branch (on a second stream beside dy W while a graph is captured: _branch_stream)
            if ctx.source is not None and ctx.source[0] == "glu":
                glu = (src_a.reshape(-1, src_a.shape[-1]), src_b.reshape(-1, src_b.shape[-1]), ctx.source[1])
            elif ctx.source is not None:  # the norm's output formed again from the input the norm keeps
                x2 = rms_norm_again(src_a, src_b, *ctx.source[1:]).reshape(-1, src_a.shape[-1])
            if ctx.same_input:
                # the LoRA branch read x itself: x kept (or formed again), or the GLU product formed from the GLU's
                # inputs
                xd2 = x2 if glu is None else glu_product(*glu)
            if need_x or need_xd or need_a:
                dh = dy2.new_empty(dy2.shape[0], lora_a.shape[0])  # (N, n·r)
                if bt is not None:  # the block diagonal's zeros drop the other parts' columns from each part's sum
                    dh.addmm_(dy2[:, parts[0][0]:parts[-1][1]], bt.t(), beta=0, alpha=scaling)
                else:
                    row = 0
                    for i, (lo, hi) in enumerate(parts):
                        # beta=0: the uninitialized output is not read; the scaling rides on the GEMM (no extra pass)
                        dh[:, i * r:(i + 1) * r].addmm_(dy2[:, lo:hi], lora_b[row:row + hi - lo], beta=0,
                                                        alpha=scaling)
                        row += hi - lo
            if not ctx.same_input and (need_x and (ctx.bits or ctx.p > 0) or need_xd and ctx.p == 0):
                dxd_lora = dh @ lora_a  # (N, C): the dropped input's gradient
            if need_xd and not ctx.same_input and ctx.p == 0:
                dxd = dxd_lora.view(ctx.x_shape)
            if need_a and not ctx.bits:
                if xd2 is None:
                    raise RuntimeError("lit-liger LoRA: the LoRA input was not saved for lora_A's gradient")
                da = dh.t() @ xd2  # (n·r, C)
            if need_lb:
                if bt is not None:  # every part's gradient against every part's h, each column's own part's taken
                    lo, hi = parts[0][0], parts[-1][1]
                    full = dy2.new_empty(hi - lo, h.shape[1])  # (W, n·r)
                    full.addmm_(dy2[:, lo:hi].t(), h, beta=0, alpha=scaling)
                    dlb = full.view(hi - lo, len(parts), r).gather(1, part_of.expand(-1, -1, r)).view(hi - lo, r)
                else:
                    dlb = torch.empty_like(lora_b)  # (Σ part sizes, r)
                    row = 0
                    for i, (lo, hi) in enumerate(parts):
                        dlb[row:row + hi - lo].addmm_(dy2[:, lo:hi].t(), h[:, i * r:(i + 1) * r], beta=0,
                                                      alpha=scaling)
                        row += hi - lo
        if need_x:
            if ctx.fp8:
                from .fp8 import frozen_base_fp8_dx

                dx = frozen_base_fp8_dx(dy2, weight, w_scale)  # (N, C)
            else:
                w = dequantize(weight, dy2.dtype) if ctx.quantized else weight
                with _beside_branch(branch, dy2):  # (leaving SMs to the branch's kernels while captured)
                    dx = dy2 @ w  # (N, C)
        branch.join()
        if need_x:
            if ctx.same_input:
                dx.addmm_(dh, lora_a)  # the LoRA branch read x itself: one gradient
            elif ctx.bits:  # the dropout's backward from the bits, dropout(x) formed again in the same pass
                dx = dx.contiguous()
                xd2 = dropped_from_bits(bits, 1.0 / (1.0 - ctx.p), x=x2, glu=glu, dx=dx, dxd=dxd_lora,
                                        write_xd=need_a)
            elif ctx.p > 0:  # the dropout's backward (its mask read back from xd) added in the same pass
                dx = dx.contiguous()  # (a no-op for the GEMMs' outputs)
                dropout_grad_add_(dx, dxd_lora, xd2, 1.0 / (1.0 - ctx.p))
        if need_a and ctx.bits:
            if xd2 is None:  # (x's gradient not asked for)
                xd2 = dropped_from_bits(bits, 1.0 / (1.0 - ctx.p), x=x2, glu=glu)
            da = dh.t() @ xd2  # (n·r, C)
        if need_w:
            dw = dy2.t() @ x2
        if need_b and ctx.has_bias:
            db = dy2.sum(0)
        return (dx.view(ctx.x_shape) if dx is not None else None, dxd, dw, db, da, dlb, None, None, None, None, None,
                None, None, None, None, None)


def glu_product(a: torch.Tensor, b: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(a) * b`` without autograd, rounded as lit-liger's GLU kernels round it (the reference on CPU)."""
    from ..kernels.swiglu import _glu_fwd_impl, glu_reference
    from ..kernels._launch import use_triton

    return _glu_fwd_impl(a, b, activation) if use_triton(a) else glu_reference(a, b, activation)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scaling: float, parts: tuple[tuple[int, int], ...],
                xd: torch.Tensor | None = None, fp8: bool = False, dropout: float = 0.0, keep_input: bool = False,
                glu: tuple[torch.Tensor, torch.Tensor, str] | None = None,
                norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
                tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """A LitGPT LoRA layer's output ``(..., out)`` for ``x (..., C)``: ``weight (out, C)``, ``lora_a (n·r, C)``,
    ``lora_b (Σ part sizes, r)``, ``parts`` from :func:`lora_parts`, ``xd`` the LoRA branch's input where it is
    not ``x`` (dropout). A bitsandbytes 4-bit ``weight`` (QLoRA's frozen base) is dequantized to ``x``'s dtype
    for the forward's GEMM and again for the backward's, as bitsandbytes' own layer does. ``fp8``: the frozen
    ``weight`` is a float8 tensorwise Linear's (``LigerConfig.fp8``); its forward and input-gradient GEMMs run in
    float8 on lit-liger's casts (:func:`lit_liger.swap.fp8.frozen_base_fp8`), the LoRA update in 16 bits. ``dropout``
    (``p`` > 0, ``xd`` None): the LoRA branch's input is ``dropout(x)``, drawn here as ``nn.Dropout`` draws it
    (``torch.native_dropout``: the same mask for the same random state) and kept for backward as one tensor with
    its mask inside (:mod:`lit_liger.kernels.dropout`): 2 bytes per element of ``x`` where an ``xd =
    dropout(x)`` given by the caller keeps 3 (``xd`` and PyTorch's ``bool`` mask). ``keep_input``: ``x`` is kept
    for backward anyway (by another reader: the attention's output, an input two LoRA layers share), so the dropout
    keeps its mask as bits beside it (1/8 byte an element) and forms ``dropout(x)`` again in backward. ``glu = (a, b,
    activation)``: ``x`` is the GLU product ``act(a) * b`` of two tensors the GLU's backward keeps (a frozen
    ``weight``); ``x`` itself is not kept but formed again from them in backward (with dropout: its bits beside).
    ``norm = (s, norm_weight, eps, offset)``: ``x`` is :func:`lit_liger.kernels.rms_norm.rms_norm` ``(s, norm_weight,
    eps, offset)`` (or :func:`~lit_liger.kernels.rms_norm.rms_norm_residual`'s normalized output of the sum ``s``),
    whose backward keeps ``s``; ``x`` is not kept but formed again from ``s`` in backward, bit for bit (a frozen
    ``weight``; with dropout: its bits beside): one ``(B, T, C)`` tensor fewer for one norm pass in backward."""
    n = len(parts)
    if n == 0 or lora_a.shape[0] % n:
        raise ValueError(f"lora_A has {lora_a.shape[0]} rows, not a multiple of its {n} LoRA parts")
    r = lora_a.shape[0] // n
    if lora_b.shape != (sum(hi - lo for lo, hi in parts), r):
        raise ValueError(f"lora_B has shape {tuple(lora_b.shape)}, expected ({sum(hi - lo for lo, hi in parts)}, {r})")
    in_features = weight.quant_state.shape[1] if is_quantized(weight) else weight.shape[1]
    if x.shape[-1] != in_features or lora_a.shape[1] != x.shape[-1]:
        raise ValueError(f"x's last dimension {x.shape[-1]} must equal the layer's in_features {in_features}")
    dtypes = {x.dtype, lora_a.dtype, lora_b.dtype} | ({xd.dtype} if xd is not None else set())
    dtypes |= set() if is_quantized(weight) else {weight.dtype}
    if len(dtypes) != 1:
        raise TypeError(f"lit-liger LoRA: x, the weight and lora_A/lora_B must share one dtype, got {sorted(map(str, dtypes))}")
    if dropout and (xd is not None or not 0.0 < dropout < 1.0):
        raise ValueError(f"lit-liger LoRA: dropout={dropout} needs 0 < p < 1 and no xd")
    src_a = src_b = source = None
    if glu is not None and norm is not None:
        raise ValueError("lit-liger LoRA: give at most one of glu and norm")
    if glu is not None:
        src_a, src_b, activation = glu
        if xd is not None or weight.requires_grad or src_a.shape != x.shape or src_b.shape != x.shape \
                or not (src_a.is_contiguous() and src_b.is_contiguous()):
            raise ValueError("lit-liger LoRA: glu needs a frozen weight, no xd and contiguous a, b of x's shape")
        source, keep_input = ("glu", activation), True
    if norm is not None:
        src_a, src_b, eps, offset = norm
        if xd is not None or weight.requires_grad or src_a.shape != x.shape or src_b.shape != x.shape[-1:]:
            raise ValueError("lit-liger LoRA: norm needs a frozen weight, no xd, an input of x's shape and a (C,) weight")
        source, keep_input = ("rms", float(eps), float(offset)), True
    if tables is not None and (not _side_by_side(parts) or tables[0].shape != (n, parts[-1][1] - parts[0][0])
                               or tables[0].dtype != x.dtype or tables[0].device != x.device):
        raise ValueError("lit-liger LoRA: tables must be part_tables(parts, x.device, x.dtype)")
    if keep_input and dropout and not x.is_contiguous():
        raise ValueError("lit-liger LoRA: keep_input with dropout needs a contiguous x")
    return _LoRAFn.apply(x, xd, weight, bias, lora_a, lora_b, float(scaling), parts, r, bool(fp8), float(dropout),
                         bool(keep_input), src_a, src_b, source, tables)


class _LoRAMixin:
    """LitGPT's ``LoRALinear`` / ``LoRAQKVLinear`` (r > 0): the frozen projection and the LoRA update in one
    autograd function of GEMMs (:func:`lit_liger.swap.lora.lora_linear`: no grouped conv1d, zero-padded update, cat or
    scaling op). LitGPT's forward runs when merged, under ``torch.compile`` (inductor fuses LitGPT's ops itself),
    under autocast, for a quantized or hooked base Linear, or for sharded (DTensor / ZeRO-3) LoRA weights."""

    #: marks the swapped LoRA classes (``lit_liger.swap._common._is_lora_linear``)
    _liger_lora_mixin = True
    #: merge() gives a base weight shared with the embedding (``LigerConfig.tied_weights``) its own copy first
    _liger_merge_owns = True

    def merge(self) -> None:
        _tied.own_copy(self.linear.weight)  # merging writes into the base weight in place
        super().merge()

    def _liger_lora_here(self, x: torch.Tensor) -> bool:
        a = self.lora_A
        return (
            not self.merged
            and not torch.compiler.is_compiling()
            and not torch.is_autocast_enabled(x.device.type)
            and (_plain_linear(self.linear) or _4bit_linear(self.linear, x) or self._liger_fp8_base(x))
            and not hasattr(a, "ds_id") and not _is_dtensor(a)
            and x.dtype == a.dtype == self.lora_B.dtype
            and (x.dtype == self.linear.weight.dtype or is_quantized(self.linear.weight))
            and (isinstance(self.lora_dropout, nn.Dropout) or not isinstance(self.lora_dropout, nn.Module))
            and _called_plainly(self.linear)
        )

    def _liger_part_tables(self, parts: tuple, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:func:`part_tables` for this layer's parts on ``x``'s device and dtype, built on the first call for them
        (a constant of the layer's shape: an eager warm-up builds it before CUDA graphs capture the layer)."""
        cache = self.__dict__.setdefault("_liger_tables", {})
        key = (parts, x.device, x.dtype)
        if key not in cache:
            cache[key] = part_tables(parts, x.device, x.dtype)
        return cache[key]

    def _liger_fp8_base(self, x: torch.Tensor) -> bool:
        """``LigerConfig.fp8`` tensorwise: a frozen float8 base Linear whose GEMMs the LoRA function runs itself."""
        lin = self.linear
        return is_float8_linear(lin) and not lin.weight.requires_grad and tensorwise_fusable(x, lin)

    def forward(self, x: torch.Tensor, _liger_keep_input: bool = False,
                _liger_glu: tuple[torch.Tensor, torch.Tensor, str] | None = None,
                _liger_norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None) -> torch.Tensor:
        """``_liger_keep_input`` / ``_liger_glu`` / ``_liger_norm``: see :func:`lora_linear`'s ``keep_input`` /
        ``glu`` / ``norm`` (lit-liger's Blocks pass them through :func:`call_lora`)."""
        if not self._liger_lora_here(x):
            return super().forward(x)
        drop = self.lora_dropout  # nn.Dropout, or LitGPT's identity lambda when lora_dropout == 0
        p = drop.p if isinstance(drop, nn.Dropout) and drop.training and drop.p > 0 else 0.0
        lin = self.linear
        parts = lora_parts(self)
        tables = self._liger_part_tables(parts, x)
        glu = _liger_glu if _source_usable(_liger_glu, x, lin.weight) else None
        norm = _liger_norm if glu is None and _source_usable(_liger_norm, x, lin.weight) else None
        if p and type(drop) is nn.Dropout and not drop.inplace and p < 1 and x.is_contiguous() \
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and _called_plainly(drop):
            # the dropout drawn inside the LoRA function, its mask kept inside its output (2 bytes an element, not 3)
            return lora_linear(x, lin.weight, lin.bias, self.lora_A, self.lora_B, self.scaling, parts,
                               fp8=is_float8_linear(lin), dropout=p, keep_input=_liger_keep_input, glu=glu,
                               norm=norm, tables=tables)
        if not p and (glu is not None or norm is not None):  # x not kept: formed again from the GLU's / norm's input
            return lora_linear(x, lin.weight, lin.bias, self.lora_A, self.lora_B, self.scaling, parts,
                               fp8=is_float8_linear(lin), glu=glu, norm=norm, tables=tables)
        xd = drop(x) if p else None  # (B, T, C)
        return lora_linear(x, lin.weight, lin.bias, self.lora_A, self.lora_B, self.scaling, parts, xd,
                           fp8=is_float8_linear(lin), tables=tables)


def _source_usable(source: tuple | None, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """A ``glu = (a, b, activation)`` or ``norm = (s, norm_weight, eps, offset)`` that :func:`lora_linear` takes for
    this call: a frozen base weight; ``a``, ``b`` contiguous of ``x``'s shape, or ``s`` of ``x``'s shape."""
    if source is None or weight.requires_grad or source[0].shape != x.shape:
        return False
    if isinstance(source[2], str):  # glu
        return source[1].shape == x.shape and source[0].is_contiguous() and source[1].is_contiguous()
    return source[1].shape == x.shape[-1:]


def call_lora(module: nn.Module, x: torch.Tensor, keep_input: bool = False,
              glu: tuple[torch.Tensor, torch.Tensor, str] | None = None,
              norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None) -> torch.Tensor:
    """``module(x)``; where ``module`` is a swapped LoRA layer, told that ``x`` is kept for backward anyway
    (``keep_input``), is the GLU product of ``glu = (a, b, activation)`` or the RMSNorm output of ``norm = (s,
    norm_weight, eps, offset)`` (see :func:`lora_linear`)."""
    if getattr(module, "_liger_lora_mixin", False) and (keep_input or glu is not None or norm is not None):
        return module(x, _liger_keep_input=keep_input, _liger_glu=glu, _liger_norm=norm)
    return module(x)
