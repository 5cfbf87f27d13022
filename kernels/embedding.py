"""Token embedding lookup whose backward is one opaque op under ``torch.compile``.

``embedding(weight, idx)`` equals ``F.embedding(idx, weight)`` (no padding index, max-norm or frequency scaling),
forward and backward. The forward is PyTorch's own gather (inductor fuses it with what follows, e.g. Gemma's
``* sqrt(n_embd)``). The backward is ATen's ``embedding_dense_backward`` behind a ``torch.library`` custom op
(``lit_liger::embedding_bwd``), so that inductor calls the CUDA kernel eager mode uses (indices sorted, each
row's gradients summed in fp32 and written once) instead of building its own: a zero-filled fp32 ``(V, C)``
buffer, atomic adds into it and a cast to the weight's dtype, two more passes over ``(V, C)``. Measured on an H100,
gemma-2-2b (V = 256k, C = 2304) B4 T2048: 1.96 ms per step compiled against 0.68 in eager mode
(``benchmarks/results/h100-2026-11-24h/step-gemma2-prof/``). In eager mode the result is the same kernel either
way: the adapter uses this function only while ``torch.compile`` traces.

Inside :func:`kernels._grad_into.grads_into` (lit-liger's CUDA-graph capture, where the weight's ``.grad`` is the
buffer the captured backward adds into), :func:`embedding` adds the weight's gradient straight into that buffer:
``embedding_dense_backward`` writes a whole new ``(V, C)`` tensor (zero-filled, then the touched rows) that a second
pass adds to ``.grad`` (reading both, writing one): four passes over ``(V, C)`` per micro-batch, 2.1 GB at
Llama-3.2-1B's vocabulary, for the few thousand rows a micro-batch touches. :func:`embedding_grad_into_` sorts the
token ids and sums each touched row's gradients in fp32 (one program per first occurrence of a row and block of
columns), then adds the sum into the row once: one rounding where the two passes round twice. The CPU path
(:func:`embedding_grad_into_reference`) does the same with PyTorch ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._grad_into import added_into, target_for
from ._launch import cdiv, embedding_grad_plan, use_triton

__all__ = ["embedding", "embedding_grad_into_", "embedding_grad_into_reference"]


@torch.library.custom_op("lit_liger::embedding_bwd", mutates_args=())
def _embedding_bwd(grad: torch.Tensor, idx: torch.Tensor, num_weights: int) -> torch.Tensor:
    """``(V, C)`` gradient of the embedding weight from the output's gradient ``idx.shape + (C,)``."""
    return torch.ops.aten.embedding_dense_backward(grad, idx, num_weights, -1, False)


@_embedding_bwd.register_fake
def _(grad, idx, num_weights):
    return grad.new_empty((num_weights, grad.shape[-1]))


class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(weight: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, weight)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        weight, idx = inputs
        ctx.save_for_backward(idx)
        ctx.num_weights = weight.shape[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return _embedding_bwd(grad, idx, ctx.num_weights), None


def embedding_grad_into_reference(target: torch.Tensor, idx: torch.Tensor, grad: torch.Tensor) -> None:
    """``target[r] += sum of grad at the positions where idx == r``, for every row ``r`` that ``idx`` holds: each row's
    sum in fp32, added and rounded to ``target``'s dtype once. PyTorch ops (the CPU path; the tests' reference)."""
    flat = idx.reshape(-1)
    g = grad.reshape(-1, grad.shape[-1]).float()  # (N, C)
    rows, inverse = torch.unique(flat, return_inverse=True)
    sums = torch.zeros(rows.numel(), g.shape[1], dtype=torch.float32, device=g.device).index_add_(0, inverse, g)
    target[rows] = (target[rows].float() + sums).to(target.dtype)


@triton.jit
def _grad_into_kernel(sorted_idx, order, seg_end, grad, target, C, stride_g, stride_t, BLOCK_C: tl.constexpr):
    """Program ``(i, c)``: where sorted position ``i`` is the first of its row (``seg_end[i] > i``), the sum in fp32
    of columns ``c * BLOCK_C ...`` of the gradients at the positions ``order[i:seg_end[i]]``, added into that row of
    ``target`` (read and written once). Every other program writes nothing: each row has one writer, no atomics."""
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    row = tl.load(sorted_idx + i).to(tl.int64)
    end = tl.load(seg_end + i)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for j in range(i, end):
        src = tl.load(order + j).to(tl.int64)
        acc += tl.load(grad + src * stride_g + cols, mask=cmask, other=0.0).to(tl.float32)
    mine = cols < tl.where(end > i, C, 0)  # (the row's first occurrence writes it; the others nothing)
    ptr = target + row * stride_t + cols
    old = tl.load(ptr, mask=mine, other=0.0).to(tl.float32)
    tl.store(ptr, (old + acc).to(target.dtype.element_ty), mask=mine)


def embedding_grad_into_(target: torch.Tensor, idx: torch.Tensor, grad: torch.Tensor) -> None:
    """Add the embedding weight's gradient into ``target`` ``(V, C)``: ``idx`` the token ids ``(...)``, ``grad`` the
    output's gradient ``(..., C)``; see :func:`embedding_grad_into_reference` for what is computed. On CUDA (and the
    interpreter) a Triton kernel, without a host sync (capturable): the ids sorted (stable, so that each row sums in
    the same order every run), each row's run of positions found with device ops."""
    if target.dim() != 2 or grad.shape[-1] != target.shape[1] or grad.shape[:-1] != idx.shape:
        raise ValueError(f"embedding_grad_into_: target {tuple(target.shape)}, idx {tuple(idx.shape)} and grad "
                         f"{tuple(grad.shape)} do not pair up (target (V, C), grad idx.shape + (C,))")
    if not use_triton(target):
        embedding_grad_into_reference(target, idx, grad)
        return
    flat = idx.reshape(-1)
    g = grad.reshape(-1, grad.shape[-1])  # (N, C)
    if g.stride(-1) != 1:
        g = g.contiguous()
    n = flat.numel()
    if n == 0:
        return
    sorted_idx, order = torch.sort(flat, stable=True)
    pos = torch.arange(n, device=flat.device)
    first = torch.ones(n, dtype=torch.bool, device=flat.device)
    first[1:] = sorted_idx[1:] != sorted_idx[:-1]
    # the next first occurrence after each position (n past the last): a reversed running minimum
    heads = torch.where(first, pos, n)
    after = torch.cat([heads[1:], heads.new_full((1,), n)])
    nxt = torch.flip(torch.cummin(torch.flip(after, (0,)), 0).values, (0,))
    seg_end = torch.where(first, nxt, pos)
    block, warps = embedding_grad_plan(target.shape[1], target.device)
    _grad_into_kernel[(n, cdiv(target.shape[1], block))](sorted_idx, order, seg_end, g, target, target.shape[1],
                                                         g.stride(0), target.stride(0), BLOCK_C=block,
                                                         num_warps=warps)


class _EmbeddingIntoFn(torch.autograd.Function):
    """``F.embedding(idx, weight)`` whose weight gradient is added into ``target`` (:func:`embedding_grad_into_`);
    autograd is handed none for the weight."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(idx)
        ctx.target = target
        return F.embedding(idx, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            embedding_grad_into_(ctx.target, idx, grad)
            added_into(ctx.target)
        return None, None, None


def embedding(weight: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``F.embedding(idx, weight)``: weight ``(V, C)``, idx integer ``(...)`` -> ``(..., C)``; the weight's
    gradient comes from one op, or, inside ``grads_into`` for this weight, is added into its target (see the module
    docstring)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D (V, C) tensor, got {getattr(weight, 'shape', type(weight).__name__)}")
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"idx must be an int32/int64 tensor of token ids, got {getattr(idx, 'dtype', type(idx).__name__)}")
    target = target_for(weight) if torch.is_grad_enabled() and weight.requires_grad else None
    if target is not None:
        return _EmbeddingIntoFn.apply(weight, idx, target)
    return _EmbeddingFn.apply(weight, idx)
