"""Weight gradients that their GEMM adds straight into a tensor named for the weight (lit-liger's CUDA graphs).

``lit_liger.graphs`` captures a training step's backward with the trainable parameters' ``.grad`` tensors as the
gradient buffers (``DIRECT_GRADS``). A weight gradient that a GEMM writes into a new tensor and a separate pass then
adds to ``.grad`` costs two more reads and one more write of every gradient per micro-batch (for a 1B model's full
fine-tuning, ~7 GB of memory traffic per iteration). Where the GEMM itself adds into ``.grad`` (``beta=1``: the
accumulator read once inside cuBLAS, one rounding instead of two), that pass is gone.

:func:`grads_into` names, for the duration of a ``with`` block, the tensor each weight's gradient goes into. The ops
whose forward runs inside the block record it on their autograd node (:func:`target_for`); their backward, whenever it
runs, adds the weight's gradient there (:func:`weight_grad`) and hands autograd none for that weight. The ops that do:
``rms_norm_linear`` (norm -> qkv / fc_1, fc_2), ``glu_linear`` (the MLP's proj), :func:`linear` (a plain Linear such
as the attention's proj) and, where ``lit_liger.adapter.EMBEDDING_GRAD_INTO`` is on, ``kernels.embedding.embedding``
(each touched row's gradients summed and added in once). Everything else (norm weights, biases) returns its gradient
as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

__all__ = ["added_into", "grads_into", "linear", "target_for", "weight_grad"]

_INTO: dict[int, torch.Tensor] = {}  # id(weight) -> the tensor its gradient is added into, inside grads_into
_WRITTEN: list[set[int]] = []  # per open grads_into block: ids of the targets a backward added into


@contextlib.contextmanager
def grads_into(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[set[int]]:
    """``(weight, target)`` pairs: ops built inside the block add ``weight``'s gradient into ``target`` (same shape
    and dtype) in their backward. Yields the set of ``id(target)`` that a backward has added into while the block is
    open."""
    pairs = list(pairs)
    for w, t in pairs:
        if t.shape != w.shape or t.dtype != w.dtype or t.device != w.device:
            raise ValueError(f"grads_into: a target of {tuple(t.shape)} {t.dtype} on {t.device} for a weight of "
                             f"{tuple(w.shape)} {w.dtype} on {w.device}")
    saved = dict(_INTO)
    written: set[int] = set()
    _INTO.update({id(w): t for w, t in pairs})
    _WRITTEN.append(written)
    try:
        yield written
    finally:
        _INTO.clear()
        _INTO.update(saved)
        _WRITTEN.remove(written)


def target_for(weight: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor ``weight``'s gradient goes into, inside :func:`grads_into`; None elsewhere (and while
    ``torch.compile`` traces)."""
    if not _INTO or weight is None or torch.compiler.is_compiling():
        return None
    return _INTO.get(id(weight))


def weight_grad(target: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """``a @ b``, a weight's gradient: returned, or, with a ``target`` (:func:`target_for` at the op's forward),
    added into it by the GEMM (``beta=1``) and None returned."""
    if target is None:
        return a.mm(b)
    target.addmm_(a, b)
    added_into(target)
    return None


def added_into(target: torch.Tensor) -> None:
    """Record that a backward has added a weight's gradient into ``target`` (the open :func:`grads_into` blocks yield
    it)."""
    for written in _WRITTEN:
        written.add(id(target))


class _LinearFn(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose weight gradient goes into ``target`` (see :func:`linear`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor):
        ctx.save_for_backward(x, weight)
        ctx.target, ctx.has_bias = target, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dy2 = dy.reshape(-1, dy.shape[-1])  # (N, out)
        dx = dy.matmul(weight) if need_x else None  # (..., in)
        dw = weight_grad(ctx.target, dy2.t(), x.reshape(-1, x.shape[-1])) if need_w else None
        db = dy2.sum(0) if ctx.has_bias and need_b else None
        return dx, dw, db, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; inside :func:`grads_into`, for a weight named there, an op whose backward adds
    the weight's gradient into its target."""
    target = target_for(weight) if torch.is_grad_enabled() and weight.requires_grad else None
    if target is None:
        return F.linear(x, weight, bias)
    return _LinearFn.apply(x, weight, bias, target)
