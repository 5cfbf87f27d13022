"""Packed micro-batches (``LigerConfig.packing``): the batch's samples laid end to end, no padding computed.

litgpt's collate pads each micro-batch to its longest sample (input ids with 0 on the right, targets with
``ignore_index``): on instruction data a third of the positions a step computes are padding. Attention is causal
and the padding comes last, so a sample's real positions never see its padding; dropping the padding and running
the samples as one sequence, with attention that stays inside each sample (variable-length attention over
cumulative sequence lengths) and RoPE positions that restart at each sample, computes the same numbers for every
real position. What a step computes then is the real tokens, not the padded rectangle.

How a batch is packed (:func:`plan`): each row's length is the position after its last non-zero token id (at
least 1): the trailing zeros are the collate's padding. The rows are laid end to end, and the packed length is
padded up to a bucket (``LigerConfig.seq_buckets``, :func:`lit_liger.buckets.packed_bucket_length`; the pad is a
segment of its own at the end, whose outputs nothing reads), so that a run sees few shapes (CUDA graphs). One host
sync per step reads the lengths. A sample whose real last token is id 0 is shortened by this rule: its left-out
positions' targets are checked at the loss (:class:`lit_liger.loss.LigerLogits`), and where one is not ignored the
loss comes from an unpacked forward instead (with a warning), so a packed step is never silently different.

Attention (:func:`attend`): on CUDA, PyTorch's flash attention over cumulative sequence lengths
(``aten::_flash_attention_forward``/``_backward``: GQA without copies, a sliding window as its left window,
capturable in CUDA graphs); on CPU (tests, Triton's interpreter) LitGPT's own attention per sample. Layers with
attention logit softcapping (Gemma-2) are not packed (flash attention has no softcap here): such models run
padded, as before, and the report says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .kernels._launch import device_limits

__all__ = ["Pack", "Plan", "attend", "flash_varlen_ok", "plan"]


@dataclasses.dataclass
class Pack:
    """Where the samples of a packed sequence start and end: ``cu_seqlens`` ``(S + 1,)`` int32 on the device (the
    samples, then the bucket's pad segment, which may be empty), ``max_len`` a bound on a segment's length (the
    packed length: static, so that a captured graph serves any batch of that length), and ``bounds``, the same
    boundaries on the host (the per-sample reference path; None where only the device has them, inside a replay)."""

    cu_seqlens: torch.Tensor
    max_len: int
    bounds: tuple[int, ...] | None = None


@dataclasses.dataclass
class Plan:
    """One packed micro-batch: ``idx`` ``(1, N)`` token ids (samples end to end, then the bucket's pad),
    ``positions`` ``(N,)`` each token's position inside its sample (RoPE), ``pack`` the attention's boundaries, and
    ``rows`` ``(B, T)`` for each position of the caller's batch its row in the packed sequence (-1: padding left
    out)."""

    idx: torch.Tensor
    positions: torch.Tensor
    pack: Pack
    rows: torch.Tensor
    real: int  # tokens of the samples (N without the bucket's pad)


def row_lengths(idx: torch.Tensor) -> list[int]:
    """Each row's length without its trailing zeros (the collate's right padding), at least 1 (one host sync)."""
    B, T = idx.shape
    nonzero = idx != 0
    last = T - torch.flip(nonzero, dims=(1,)).to(torch.int8).argmax(dim=1)  # (B,) one past the last non-zero
    last = torch.where(nonzero.any(dim=1), last, torch.ones_like(last))
    return last.tolist()


def plan(idx: torch.Tensor, bucket: Callable[[int], int] | None, max_position: int) -> Plan | None:
    """The packed form of the ``(B, T)`` batch ``idx``, or None where packing saves nothing (one row, or no row with
    padding). ``bucket``: the packed length's bucket (None: exact); ``max_position``: positions stay below it (the
    RoPE cache's length)."""
    B, T = idx.shape
    if B < 2:
        return None
    lengths = row_lengths(idx)
    real = sum(lengths)
    if real == B * T:
        return None
    n = bucket(real) if bucket is not None else real
    n = max(n, real)
    starts = [0]
    for L in lengths:
        starts.append(starts[-1] + L)
    bounds = (*starts, n)  # the samples, then the pad segment [real, n)
    src = torch.cat([torch.arange(L) + b * T for b, L in enumerate(lengths)])  # (real,) flat (b, t) of each row
    positions = torch.cat([torch.arange(L) for L in lengths] + [torch.arange(n - real).clamp_(max=max_position - 1)])
    rows = torch.full((B * T,), -1, dtype=torch.long)
    rows[src] = torch.arange(real)
    host = torch.cat([src, positions, rows, torch.tensor(bounds)])  # one copy to the device, not four
    if idx.device.type == "cuda":
        host = host.pin_memory().to(idx.device, non_blocking=True)
    src, positions, rows, cu = host.to(idx.device).split([real, n, B * T, len(bounds)])
    cu = cu.to(torch.int32)
    packed = F.pad(idx.reshape(-1)[src], (0, n - real), value=0).unsqueeze(0)  # (1, n)
    return Plan(packed, positions, Pack(cu, n, bounds), rows.view(B, T), real)


def flash_varlen_ok(device: torch.device, dtype: torch.dtype, head_size: int) -> bool:
    """PyTorch's flash attention serves packed attention here: an NVIDIA CUDA device of sm_80 or newer, 16-bit, head
    size <= 256, flash enabled, a PyTorch with the variable-length op."""
    return (
        device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and head_size <= 256
        and torch.version.hip is None and torch.backends.cuda.flash_sdp_enabled()
        and hasattr(torch.ops.aten, "_flash_attention_forward") and device_limits(device).capability >= (8, 0)
    )


def _window_args(window: int | None) -> dict:
    # LitGPT's window W: query i sees keys i - W < j <= i, flash's left window W - 1 (right 0: causal)
    return {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}


class _FlashVarlen(torch.autograd.Function):
    """Causal flash attention over packed samples: q ``(N, nh, hs)``, k/v ``(N, ng, hs)`` -> ``(N, nh, hs)``."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                scale: float, window: int | None) -> torch.Tensor:
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale, **_window_args(window))
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale, ctx.window = max_len, scale, window
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out, lse, cu, cu, ctx.max_len, ctx.max_len, 0.0, True, rng, unused,
            scale=ctx.scale, **_window_args(ctx.window))
        return dq, dk, dv, None, None, None, None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: Pack, scale: float, window: int | None,
           per_sample: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """Causal attention inside each packed sample: q ``(1, nh, N, hs)``, k/v ``(1, ng, N, hs)`` -> ``(1, N, nh, hs)``.
    ``per_sample(q, k, v, T)``: the layer's own attention of one ``(1, heads, T, hs)`` sample (LitGPT's math: the
    reference path), returning ``(1, T, nh, hs)``."""
    if flash_varlen_ok(q.device, q.dtype, q.shape[-1]):
        y = _FlashVarlen.apply(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                               pack.cu_seqlens, pack.max_len, scale, window)  # (N, nh, hs)
        return y.unsqueeze(0)
    if pack.bounds is None:
        raise RuntimeError("lit-liger packing: this attention needs the samples' boundaries on the host (a packed "
                           "step captured on a device without flash attention); turn packing off")
    b = pack.bounds
    parts = [per_sample(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], e - s) for s, e in zip(b[:-1], b[1:]) if e > s]
    return torch.cat(parts, dim=1)  # (1, N, nh, hs)
