"""Fused linear + cross-entropy: ``cross_entropy(softcap(x @ W^T + b))`` without the N x V logits.

``fused_linear_cross_entropy(x, weight, target, bias, ...)`` equals

    logits = F.linear(x, weight, bias).float()                 # (N, V), never held whole here
    logits = softcap * tanh(logits / softcap)                  # litgpt's ``do_softcapping`` (optional)
    loss = F.cross_entropy(logits, target, ignore_index=..., reduction=..., label_smoothing=...)
    loss += z_loss * logsumexp(logits, -1) ** 2                # over non-ignored rows, reduced like the loss

The logits of one chunk at a time come from cuBLAS (``torch.mm``/``addmm`` in the input dtype,
fp32 accumulation inside the GEMM); one Triton kernel turns a chunk of logits into the row losses
and overwrites it in place with ``dloss/dlogits``; two more GEMMs give the input and weight
gradients. The gradients are formed during the forward (the loss is a scalar at the end of the
graph), so the backward only scales them by ``grad_output``. Two operating points, ``mode``:

* ``"fast"`` (default): chunks of rows. Per chunk: logits ``(Nc, V)``, one kernel, ``dx_c`` and
  ``dW += dlogits^T x_c`` into an fp32 ``(V, H)`` accumulator (kept until the backward, which casts
  it to the weight dtype in the same pass that scales it by ``grad_output``; with a single chunk, dW
  is written in the weight dtype directly). 3 GEMMs in all (6·N·H·V flops); extra memory ≈ one
  logits chunk + the fp32 dW (none with one chunk).
* ``"lean"``: chunks of the vocabulary. Pass 1 computes each row's log-sum-exp online over the V
  chunks; pass 2 recomputes each chunk's logits, turns them into dlogits, writes
  ``dW[v0:v1] = dlogits_c^T x`` straight into the weight gradient (one complete GEMM, exact) and
  accumulates ``dx += dlogits_c W_c`` in fp32. 4 GEMMs (8·N·H·V flops); extra memory ≈ one
  ``(N, Vc)`` chunk + an fp32 ``(N, H)`` accumulator — no ``(V, H)`` fp32 buffer.

``chunk_size`` is rows per chunk in "fast" mode and vocabulary entries per chunk in "lean" mode;
by default it comes from the shapes and the device's free memory (``_row_chunk``/``_vocab_chunk``).

No host synchronization in the hot path: the number of valid targets (the mean's divisor) stays
a device tensor, nothing calls ``.item()``, and no Python branch depends on tensor values, so the
op runs under CUDA graphs and ``torch.compile(fullgraph=True)`` traces it (a ``torch.library``
custom op with a fake implementation) with the same loss.

Targets outside ``[0, V)`` that are not ``ignore_index``:

* CPU (interpreter or reference path): checked eagerly, ``ValueError``.
* CUDA, by default: never read out of bounds; such a row's loss is NaN (so the reduced loss is
  NaN and the mistake cannot pass unnoticed) and it contributes no gradient. The kernel also
  carries a ``tl.device_assert`` that fires when Triton runs with ``TRITON_DEBUG=1``.
* CUDA with ``LIT_LIGER_CHECK_TARGETS=1`` in the environment (or ``CHECK_TARGETS = True`` on this
  module): checked eagerly before the launch, ``ValueError`` — one host sync per call, for
  debugging; skipped while ``torch.compile`` traces.

A LoRA head (LitGPT's ``LoRALinear`` as the lm_head, ``lora_head: true``) joins the same pass: with ``lora_a``
``(r, H)``, ``lora_b`` ``(V, r)``, ``lora_scale`` ``s`` and the LoRA branch's input ``x_lora`` (the dropout's output;
``x`` itself without dropout) the logits are ``x W^T (+ b) + s (x_lora A^T) B^T``. ``xa = s x_lora A^T`` ``(N, r)`` is
computed once; each logits chunk adds ``xa_c B^T`` (a GEMM of inner size r). In the gradient pass ``dB += g^T xa_c``
and ``gB = g B`` ``(n, r)`` come from each chunk's dlogits ``g``; then ``dA = s gB^T x_lora`` and
``dx_lora = s gB A`` (added to ``dx`` when ``x_lora`` is ``x``), fp32 accumulation throughout. The frozen base weight
gets no gradient GEMM; the (V, H) weight is never copied.

``reduction="none"`` returns per-row losses (0 for ignored rows). Its gradient depends on a
per-row ``grad_output`` that is unknown in the forward, so that case stores nothing in the forward
and recomputes the chunks in the backward (one extra logits GEMM per chunk).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._checks import as_rows, check_float, check_last_dim, check_same_device, check_same_dtype
from ._launch import cdiv, elementwise_plan, fast_launch, next_pow2, row_plan, use_triton

__all__ = ["fused_linear_cross_entropy", "fused_linear_cross_entropy_reference", "CHECK_TARGETS"]

# Opt-in eager target check on CUDA (costs one host sync per call). CPU always checks.
CHECK_TARGETS = os.environ.get("LIT_LIGER_CHECK_TARGETS", "0") == "1"

# The kernels walk a row of logits in blocks of at most this many columns (online max / sum-exp),
# so any V works; 4096 columns of bf16 is 8 KB per row block, 16 elements per thread at 8 warps.
_MAX_V_BLOCK = 4096
# Default size of the logits chunk buffer. "fast": big enough that the three GEMMs per chunk run
# at full rate ((Nc, H) x (H, V) with Nc ~ 1024 for V = 128k in bf16). "lean": an (N, Vc) chunk;
# Vc ~ 2048 keeps the four GEMMs efficient at N = 8192..16384.
_FAST_CHUNK_BYTES = 512 << 20  # H100 sweep (V=128256): 2-4 row chunks balance GEMM size and fp32-dW passes
# ... and at least this many rows where the device has room: each "fast" chunk's dW GEMM reads and writes the
# whole (V, H) fp32 accumulator (8·V·H bytes) against the chunk's 6·Nc·V·H GEMM flops, about 300 / Nc of the GEMM
# time on an H100 (~3 TB/s, ~700 TFLOP/s) whatever V is. gemma-2 (V = 256k) got 1024-row chunks from the byte
# budget alone: each dW GEMM took 2.76 ms against the logits GEMM's 1.66 (h100-2026-11-24h/step-gemma2-lc-prof/)
_FAST_MIN_ROWS = 2048
_LEAN_CHUNK_BYTES = 32 << 20
# CPU tensors only reach the kernels under Triton's interpreter (tests): small chunks.
_CPU_CHUNK_BYTES = 1 << 20
# Rows per program under the interpreter (the GPU runs one row per program; see _kernel_plan).
_INTERPRET_ROWS = 64
# GEMM-friendly multiples for automatic chunk sizes on the GPU.
_ROW_ALIGN = 128
_VOCAB_ALIGN = 256

_REDUCTIONS = ("mean", "sum", "none")
_MODES = ("fast", "lean")


# ----------------------------------------------------------------------------------------------
# Reference (CPU path without the interpreter, meta tensors; plain PyTorch, logits in fp32)
# ----------------------------------------------------------------------------------------------
def _mean_divisor(target: torch.Tensor, ignore_index: int, num_valid_targets) -> torch.Tensor:
    """Device fp32 scalar: the number of valid targets (local, or the caller's global count), >= 1
    so that an all-ignored batch divides 0 by 1 instead of 0 by 0."""
    if num_valid_targets is None:
        n = (target != ignore_index).sum().to(torch.float32)
    elif isinstance(num_valid_targets, torch.Tensor):
        n = num_valid_targets.to(device=target.device, dtype=torch.float32).reshape(())
    else:
        n = torch.full((), float(num_valid_targets), dtype=torch.float32, device=target.device)
    return n.clamp(min=1.0)


def fused_linear_cross_entropy_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: float | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    num_valid_targets: int | torch.Tensor | None = None,
    lora_a: torch.Tensor | None = None,
    lora_b: torch.Tensor | None = None,
    lora_scale: float = 1.0,
    x_lora: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same semantics as ``fused_linear_cross_entropy``, holding the whole (N, V) fp32 logits. The LoRA term is
    LitGPT's ``LoRALinear`` forward: ``(x_lora @ A^T @ B^T) * s`` added to ``F.linear``'s output, in the input dtype."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, H)
    t = target.reshape(-1).long()  # (N,)
    logits = F.linear(x2, weight, bias)  # (N, V)
    if lora_a is not None:
        xl = x2 if x_lora is None else x_lora.reshape(-1, x_lora.shape[-1])  # (N, H)
        logits = logits + (xl @ lora_a.t() @ lora_b.t()) * lora_scale  # (N, r) -> (N, V)
    logits = logits.float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    rows = F.cross_entropy(
        logits, t, ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing
    )  # (N,), 0 where ignored
    if z_loss:
        lse = torch.logsumexp(logits, dim=-1)  # (N,)
        rows = rows + torch.where(t != ignore_index, z_loss * lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        return rows.reshape(target.shape)
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / _mean_divisor(t, ignore_index, num_valid_targets)


# ----------------------------------------------------------------------------------------------
# Triton kernels
#
# Every kernel handles a tile of ROWS rows (1 on a GPU: a program streams one row of V logits; a
# whole chunk under Triton's interpreter, whose cost is per operation, not per element) and walks
# the columns in BLOCKs, so any V works. Row statistics (max, sum of exp, lse) are fp32 (ROWS,).
# ----------------------------------------------------------------------------------------------
@triton.jit
def _tanh(x):
    """fp32 tanh as ``1 - 2 / (1 + e^2x)``: one exp and one division (no libdevice, which Triton's interpreter lacks);
    ``e^2x`` overflows to inf for large ``x`` (tanh 1) and underflows to 0 for very negative ``x`` (tanh -1). Near 0
    its error is absolute (~1e-7), not relative: the softcap multiplies it by at most a few tens, far below the
    16-bit logits' own rounding. (It replaced an odd Taylor branch near 0 computed beside the exp form for every
    element: gemma2-2b's recipe's loss, with the head's LoRA change below, 2.52 -> 2.33 ms an iteration on an H200,
    benchmarks/results/h200-2026-12-04e.)"""
    return 1.0 - 2.0 / (1.0 + tl.exp(2.0 * x))


@triton.jit
def _capped(raw, softcap, HAS_SOFTCAP: tl.constexpr):
    """Final logits in fp32 from the GEMM's logits: ``softcap * tanh(raw / softcap)`` or ``raw``."""
    raw = raw.to(tl.float32)
    if HAS_SOFTCAP:
        return softcap * _tanh(raw / softcap)
    return raw


@triton.jit
def _scan_stats(row_ptr, row_mask, n_cols, softcap, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Reads ``n_cols`` logits of each row (``row_ptr`` (ROWS, 1)) block by block; returns per row
    (max, sum of exp(z - max), sum of z), the last only with label smoothing. The max/sum pair is
    updated online. Rows outside the tile (``row_mask`` False) read zeros and are never stored."""
    cols = tl.arange(0, BLOCK)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    s = tl.zeros([ROWS], tl.float32)
    zsum = tl.zeros([ROWS], tl.float32)
    for off in range(0, n_cols, BLOCK):
        c = off + cols  # (BLOCK,)
        col_ok = (c < n_cols)[None, :]  # (1, BLOCK)
        raw = tl.load(row_ptr + c[None, :], mask=row_mask[:, None] & col_ok, other=0.0)  # (ROWS, BLOCK)
        z = _capped(raw, softcap, HAS_SOFTCAP)
        if HAS_SMOOTHING:
            zsum += tl.sum(tl.where(col_ok, z, 0.0), axis=1)
        z = tl.where(col_ok, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))  # finite: every block has >= 1 column
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m = m_new
    return m, s, zsum


@triton.jit
def _row_loss(lse, zt, zsum, vocab, valid, in_range, label_smoothing, z_loss):
    """``lse - (1-eps) z_t - eps/V sum_j z_j + z_loss lse^2`` per row; 0 for ignored rows, NaN for
    a non-ignored target outside [0, V) (never read: ``zt`` is 0 there)."""
    loss = lse - (1.0 - label_smoothing) * zt - (label_smoothing / vocab) * zsum + z_loss * lse * lse
    loss = tl.where(in_range, loss, float("nan"))
    return tl.where(valid, loss, 0.0)


@triton.jit
def _write_grad(row_ptr, row_mask, col0, n_cols, vocab, target, lse, coef, softcap, label_smoothing, z_loss,
                HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """Overwrites ``n_cols`` logits of each row (global columns ``col0 + c``) with
    ``coef * (softmax * (1 + 2 z_loss lse) - (1-eps) onehot - eps/V) * dsoftcap``
    where ``dsoftcap = 1 - tanh^2``; ``coef`` (ROWS,) is 0 for rows that get no gradient."""
    cols = tl.arange(0, BLOCK)
    p_coef = (coef * (1.0 + 2.0 * z_loss * lse))[:, None]  # (ROWS, 1)
    smooth = (coef * (label_smoothing / vocab))[:, None]
    hot = (coef * (1.0 - label_smoothing))[:, None]
    lse = lse[:, None]
    target = target[:, None]
    for off in range(0, n_cols, BLOCK):
        c = off + cols  # (BLOCK,)
        mask = row_mask[:, None] & (c < n_cols)[None, :]  # (ROWS, BLOCK)
        raw = tl.load(row_ptr + c[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            th = _tanh(raw / softcap)
            z = softcap * th
        else:
            z = raw
        g = tl.exp(z - lse) * p_coef - smooth - tl.where((col0 + c)[None, :] == target, hot, 0.0)
        if HAS_SOFTCAP:
            g = g * (1.0 - th * th)
        tl.store(row_ptr + c[None, :], g.to(row_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _flce_rows_kernel(
    LOGITS, TARGET, ROW_LOSS, SCALE,
    n_rows, stride_row, stride_scale, n_cols, ignore_index,
    softcap, label_smoothing, z_loss,
    HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, WRITE_GRAD: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """"fast" mode, one program per ROWS rows of an (Nc, V) logits chunk. Reads the rows and their
    targets; pass 1 (online max/sum-exp over V in BLOCKs) gives lse and writes each row's fp32 loss
    to ROW_LOSS; with WRITE_GRAD, pass 2 reads the rows again and overwrites them in place with
    ``SCALE[row * stride_scale] * dloss/dlogits`` (zero for ignored rows)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    row_mask = rows < n_rows
    row_ptr = LOGITS + rows[:, None] * stride_row  # (ROWS, 1)
    target = tl.load(TARGET + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    valid = target != ignore_index
    in_range = (target >= 0) & (target < n_cols)
    tl.device_assert(in_range | ~valid, "fused_linear_cross_entropy: target outside [0, V)")
    m, s, zsum = _scan_stats(row_ptr, row_mask, n_cols, softcap, HAS_SOFTCAP, HAS_SMOOTHING, ROWS, BLOCK)
    lse = m + tl.log(s)  # (ROWS,)
    t_safe = tl.where(in_range, target, 0)
    zt = _capped(tl.load(LOGITS + rows * stride_row + t_safe, mask=row_mask, other=0.0), softcap, HAS_SOFTCAP)
    zt = tl.where(in_range, zt, 0.0)
    loss = _row_loss(lse, zt, zsum, n_cols, valid, in_range, label_smoothing, z_loss)
    tl.store(ROW_LOSS + rows, loss, mask=row_mask)
    if WRITE_GRAD:
        scale = tl.load(SCALE + rows * stride_scale, mask=row_mask, other=0.0)
        coef = tl.where(valid & in_range, scale, 0.0)
        _write_grad(row_ptr, row_mask, 0, n_cols, n_cols, target, lse, coef, softcap, label_smoothing, z_loss,
                    HAS_SOFTCAP, BLOCK)


@fast_launch
@triton.jit
def _flce_lean_stats_kernel(
    LOGITS, TARGET, M, S, ZT, ZSUM, LSE, ROW_LOSS,
    n_rows, stride_row, col0, n_cols, vocab, ignore_index,
    softcap, label_smoothing, z_loss,
    HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, LAST: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """"lean" pass 1, one program per ROWS rows of an (N, Vc) chunk holding vocabulary columns
    [col0, col0 + n_cols). Merges the chunk's (max, sum-exp, sum z) into the rows' running fp32
    M/S/ZSUM and picks up the target logit into ZT where the target falls in this chunk. On the
    LAST chunk it also writes LSE and the rows' losses ROW_LOSS."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    row_mask = rows < n_rows
    row_ptr = LOGITS + rows[:, None] * stride_row  # (ROWS, 1)
    target = tl.load(TARGET + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    m_c, s_c, zsum_c = _scan_stats(row_ptr, row_mask, n_cols, softcap, HAS_SOFTCAP, HAS_SMOOTHING, ROWS, BLOCK)
    m_old = tl.load(M + rows, mask=row_mask, other=0.0)
    m = tl.maximum(m_old, m_c)
    s = tl.load(S + rows, mask=row_mask, other=0.0) * tl.exp(m_old - m) + s_c * tl.exp(m_c - m)
    local = target - col0
    hit = (local >= 0) & (local < n_cols)
    zt_c = tl.load(LOGITS + rows * stride_row + tl.where(hit, local, 0), mask=row_mask, other=0.0)
    zt = tl.load(ZT + rows, mask=row_mask, other=0.0) + tl.where(hit, _capped(zt_c, softcap, HAS_SOFTCAP), 0.0)
    zsum = tl.load(ZSUM + rows, mask=row_mask, other=0.0) + zsum_c
    tl.store(M + rows, m, mask=row_mask)
    tl.store(S + rows, s, mask=row_mask)
    tl.store(ZT + rows, zt, mask=row_mask)
    tl.store(ZSUM + rows, zsum, mask=row_mask)
    if LAST:
        valid = target != ignore_index
        in_range = (target >= 0) & (target < vocab)
        tl.device_assert(in_range | ~valid, "fused_linear_cross_entropy: target outside [0, V)")
        lse = m + tl.log(s)
        tl.store(LSE + rows, lse, mask=row_mask)
        loss = _row_loss(lse, zt, zsum, vocab, valid, in_range, label_smoothing, z_loss)
        tl.store(ROW_LOSS + rows, loss, mask=row_mask)


@fast_launch
@triton.jit
def _flce_lean_grad_kernel(
    LOGITS, TARGET, LSE, SCALE,
    n_rows, stride_row, stride_scale, col0, n_cols, vocab, ignore_index,
    softcap, label_smoothing, z_loss,
    HAS_SOFTCAP: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """"lean" pass 2, one program per ROWS rows of an (N, Vc) chunk (columns [col0, col0 + n_cols)).
    Reads the rows' LSE and targets and overwrites the chunk's logits in place with
    ``SCALE[row * stride_scale] * dloss/dlogits`` (zero for ignored rows)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    row_mask = rows < n_rows
    target = tl.load(TARGET + rows, mask=row_mask, other=ignore_index).to(tl.int64)
    keep = (target != ignore_index) & (target >= 0) & (target < vocab)
    coef = tl.where(keep, tl.load(SCALE + rows * stride_scale, mask=row_mask, other=0.0), 0.0)
    lse = tl.load(LSE + rows, mask=row_mask, other=0.0)
    _write_grad(LOGITS + rows[:, None] * stride_row, row_mask, col0, n_cols, vocab, target, lse, coef, softcap,
                label_smoothing, z_loss, HAS_SOFTCAP, BLOCK)


# ----------------------------------------------------------------------------------------------
# GEMM helpers
# ----------------------------------------------------------------------------------------------
_FP32_ADDMM: dict[int, bool] = {}


def _cuda_fp32_addmm(device_index: int) -> bool:
    """Whether this torch can run ``addmm`` of 16-bit matrices into an fp32 tensor in place
    (``aten::addmm.dtype_out``, torch >= 2.8 on CUDA), both accumulating (``beta=1``) and
    overwriting (``beta=0``: the old contents, NaN here, must be ignored). Which ``self`` dtypes it
    accepts changed across versions, so the exact calls are tried once and their results checked,
    instead of comparing version numbers. The check syncs the host once per device and process, at
    the first call (not while a CUDA graph is being captured: that call takes the fallback and asks
    again later)."""
    if device_index in _FP32_ADDMM:
        return _FP32_ADDMM[device_index]
    if torch.cuda.is_current_stream_capturing():
        return False
    dev = torch.device("cuda", device_index)
    try:
        a = torch.ones(2, 2, device=dev, dtype=torch.bfloat16)
        acc = torch.ones(2, 2, device=dev)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
        fresh = torch.full((2, 2), float("nan"), device=dev)
        torch.addmm(fresh, a, a, beta=0, out_dtype=torch.float32, out=fresh)
        ok = bool((acc == 3.0).all()) and bool((fresh == 2.0).all())
    except (RuntimeError, TypeError, NotImplementedError):
        ok = False
    _FP32_ADDMM[device_index] = ok
    return ok


def _mm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    """``acc += a @ b`` (``accumulate``) or ``acc = a @ b``, with ``acc`` in fp32 and ``a``, ``b`` in
    the input dtype; the product is kept in fp32 (never rounded to 16 bits before it is added),
    except in the fallback for CUDA builds without ``addmm.dtype_out``, where each chunk's product is
    rounded once. Overwriting the first chunk saves a zero-fill and one read of the accumulator."""
    if a.dtype == torch.float32:
        if accumulate:
            acc.addmm_(a, b)
        else:
            torch.mm(a, b, out=acc)
    elif acc.device.type == "cuda":
        if _cuda_fp32_addmm(acc.device.index if acc.device.index is not None else torch.cuda.current_device()):
            torch.addmm(acc, a, b, beta=1 if accumulate else 0, out_dtype=torch.float32, out=acc)
        elif accumulate:
            acc.add_(torch.mm(a, b))
        else:
            acc.copy_(torch.mm(a, b))
    elif accumulate:  # CPU (interpreter tests): fp32 GEMM of the exactly upcast 16-bit operands
        acc.addmm_(a.float(), b.float())
    else:
        torch.mm(a.float(), b.float(), out=acc)


def _logits_gemm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """out (rows, cols) = x (rows, H) @ weight (cols, H)^T (+ bias (cols,)), in the input dtype."""
    if bias is None:
        torch.mm(x, weight.t(), out=out)
    else:
        torch.addmm(bias, x, weight.t(), out=out)


def _grad_weight_gemm(out: torch.Tensor, dlogits: torch.Tensor, x: torch.Tensor, accumulate: bool | None) -> None:
    """dW rows: out (cols, H) = dlogits (rows, cols)^T @ x (rows, H) in the input dtype (``None``), or
    into an fp32 ``out``: overwritten (``False``) or accumulated (``True``)."""
    if accumulate is None:
        torch.mm(dlogits.t(), x, out=out)
    else:
        _mm_fp32(out, dlogits.t(), x, accumulate)


def _grad_input_gemm(out: torch.Tensor, dlogits: torch.Tensor, weight: torch.Tensor, accumulate: bool | None) -> None:
    """dx rows: out (rows, H) = dlogits (rows, cols) @ weight (cols, H), with ``accumulate`` as in
    :func:`_grad_weight_gemm`."""
    if accumulate is None:
        torch.mm(dlogits, weight, out=out)
    else:
        _mm_fp32(out, dlogits, weight, accumulate)


class _LoRAPass:
    """The LoRA head's share of one chunked pass: ``logits += xa_c B_c^T`` per chunk, its gradients from each chunk's
    dlogits, then the input-side gradients once. ``lora`` is ``(A (r, H), B (V, r), x_lora (N, H) | None, s)``
    (x_lora None: the LoRA branch reads ``x``); ``needs`` is ``(dA, dB, dx_lora)``; ``need_dx``: ``x``'s gradient,
    which takes the LoRA branch's share when ``x_lora`` is ``x``. ``lean``: dB rows are complete per vocabulary
    chunk (written in B's dtype), gB accumulates over the chunks; otherwise dB accumulates over row chunks in fp32."""

    def __init__(self, lora, needs, x, need_dx, lean):
        a, b, x_lora, s = lora
        self.a, self.b, self.s = a, b, float(s)
        self.shared = x_lora is None
        self.xl = x if x_lora is None else x_lora  # (N, H)
        self.need_da, self.need_dlb, self.need_dxl = needs
        self.need_dxl = self.need_dxl and not self.shared
        self.to_dx = need_dx and self.shared
        n_rows, rank, dev = x.shape[0], a.shape[0], x.device
        # xa = s * x_lora A^T, once: (N, r) in the input dtype, the scale applied inside the GEMM (one rounding)
        self.xa = torch.empty((n_rows, rank), dtype=x.dtype, device=dev)  # (N, r)
        if n_rows > 0:
            torch.addmm(self.xa, self.xl, a.t(), beta=0, alpha=self.s, out=self.xa)
        self.needs_gb = self.need_da or self.need_dxl or self.to_dx
        self.gb32 = torch.empty((n_rows, rank) if self.needs_gb else (0,), dtype=torch.float32, device=dev)  # (N, r)
        self.lean = lean
        vocab = b.shape[0]
        if lean:
            self.dlb = torch.empty((vocab, rank) if self.need_dlb else (0,), dtype=b.dtype, device=dev)  # (V, r)
        else:
            self.dlb = torch.zeros((vocab, rank) if self.need_dlb else (0,), dtype=torch.float32, device=dev)

    @property
    def grads(self) -> bool:
        return self.needs_gb or self.need_dlb

    def logits(self, out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, r0: int,
               r1: int, v0: int, v1: int) -> None:
        """out (rows, cols) = x (rows, H) @ weight (cols, H)^T (+ bias) + xa[r0:r1] (rows, r) @ B[v0:v1]^T (r, cols), in
        the input dtype: the rank-r product written first and the frozen product added onto it inside its GEMM (an
        (rows, cols) pass fewer than adding the update after it)."""
        _logits_gemm(out, self.xa[r0:r1], self.b[v0:v1], bias)
        out.addmm_(x, weight.t())

    def grad_chunk(self, dlogits: torch.Tensor, r0: int, r1: int, v0: int, v1: int) -> None:
        """From one chunk's dlogits (rows, cols): dB rows and gB = dlogits B (rows, r), both fp32-accumulated."""
        if self.need_dlb:
            if self.lean:  # (Vc, r), complete: every row is in the chunk
                torch.mm(dlogits.t(), self.xa, out=self.dlb[v0:v1])
            else:  # (V, r) fp32, accumulated over the row chunks
                _mm_fp32(self.dlb, dlogits.t(), self.xa[r0:r1], accumulate=r0 > 0)
        if self.needs_gb:  # (rows, r) fp32; "lean" accumulates over the vocabulary chunks
            _mm_fp32(self.gb32[r0:r1], dlogits, self.b[v0:v1], accumulate=self.lean and v0 > 0)

    def finish(self, dx_acc: torch.Tensor | None, accumulate32: bool):
        """After the last chunk: ``dA = (s gB)^T x_lora``, ``dx_lora = (s gB) A``, added into ``dx_acc`` ((N, H),
        fp32 where ``accumulate32``) when ``x_lora`` is ``x``. Returns (dA (r, H), dB (V, r), dx_lora (N, H)), empty
        where not asked for."""
        a, dev = self.a, self.a.device
        n_rows = self.xl.shape[0]
        da = torch.empty(a.shape if self.need_da else (0,), dtype=a.dtype, device=dev)  # (r, H)
        dxl = torch.empty(self.xl.shape if self.need_dxl else (0,), dtype=self.xl.dtype, device=dev)  # (N, H)
        if n_rows == 0:
            da.zero_()
            dxl.zero_()
            self.dlb.zero_()
        elif self.needs_gb:
            gs = (self.gb32 * self.s).to(a.dtype)  # (N, r): dloss/d(x_lora A^T)
            if self.need_da:
                torch.mm(gs.t(), self.xl, out=da)  # (r, H)
            if self.need_dxl:
                torch.mm(gs, a, out=dxl)  # (N, H)
            if self.to_dx:
                if accumulate32:
                    _mm_fp32(dx_acc, gs, a, accumulate=True)  # (N, H) fp32
                else:
                    dx_acc.addmm_(gs, a)  # (N, H)
        dlb = self.dlb if self.lean or not self.need_dlb else self.dlb.to(self.b.dtype)  # (V, r)
        return da, dlb, dxl


# ----------------------------------------------------------------------------------------------
# Chunk sizes and launch parameters
# ----------------------------------------------------------------------------------------------
def _chunk_budget(device: torch.device, default: int, free_memory: bool = True) -> int:
    """Bytes for the logits chunk: the default, shrunk (``free_memory``) to a quarter of what the device has left
    (driver-free memory plus what torch's caching allocator holds unused). CPU (the interpreter): small chunks,
    within the default too (a caller's cap applies)."""
    if device.type != "cuda":
        return min(_CPU_CHUNK_BYTES, default)
    if not free_memory:
        return default
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(1, min(default, (free + cached) // 4))


def _balanced(total: int, chunk: int, align: int) -> int:
    """Same number of chunks, equal sizes rounded up to ``align`` (no tiny tail chunk)."""
    chunk = max(1, min(chunk, total))
    n_chunks = cdiv(total, chunk)
    return min(total, cdiv(cdiv(total, n_chunks), align) * align)


def _capped_budget(default: int, chunk_size: int) -> int:
    """The default budget, capped by the caller's ``max_chunk_bytes`` (passed to the ops as ``-chunk_size``)."""
    return min(default, -chunk_size) if chunk_size < 0 else default


def _row_chunk(n_rows: int, vocab: int, element_size: int, device: torch.device, chunk_size: int,
               need_dw: bool = True) -> int:
    """Rows per chunk in "fast" mode: a (rows, V) logits buffer within the budget, a multiple of
    128 rows on the GPU (full GEMM tiles); with the weight's gradient, at least ``_FAST_MIN_ROWS`` on the GPU
    (a frozen head has no fp32 dW pass to save). ``chunk_size`` > 0: that many rows; < 0: a byte cap."""
    return _rows(n_rows, vocab, element_size, device, chunk_size, need_dw, free_memory=True)


def _rows(n_rows, vocab, element_size, device, chunk_size, need_dw, free_memory):
    """:func:`_row_chunk`; ``free_memory=False``: the budget from the shapes alone, without the device's free
    memory (an upper bound of the rows; see :func:`_keeps_fp32_dw`)."""
    if chunk_size > 0:
        return max(1, min(chunk_size, n_rows))
    align = _ROW_ALIGN if device.type == "cuda" else 1
    default = _FAST_CHUNK_BYTES
    if device.type == "cuda" and need_dw:
        default = max(default, _FAST_MIN_ROWS * vocab * element_size)
    rows = _chunk_budget(device, _capped_budget(default, chunk_size), free_memory) // (vocab * element_size)
    return _balanced(n_rows, max(align, rows // align * align), align)


def _keeps_fp32_dw(n_rows, vocab: int, element_size: int, device: torch.device, chunk_size: int, need_dw: bool,
                   mode: str, weight_dtype: torch.dtype) -> bool:
    """Whether the "fast" forward hands its fp32 ``(V, H)`` dW accumulator to the backward, which casts it to the
    weight's dtype in the same pass that scales it by ``grad_output`` (:func:`_scale_into`), instead of casting it at
    the end of the forward and scaling the result in a second pass: where the rows take more than one chunk at the
    budget of the shapes alone. A question of shapes only, so that the fake implementation answers it too (the
    device's free memory can only shrink the chunks: rows that fit one chunk by the shapes but not by the memory
    left accumulate in a temporary fp32 buffer, cast at the end of the forward)."""
    if mode != "fast" or not need_dw or weight_dtype == torch.float32:
        return False
    return n_rows > _rows(n_rows, vocab, element_size, device, chunk_size, need_dw, free_memory=False)


def _vocab_chunk(n_rows: int, vocab: int, element_size: int, device: torch.device, chunk_size: int) -> int:
    """Vocabulary entries per chunk in "lean" mode: an (N, Vc) logits buffer within the budget, a
    multiple of 256 columns on the GPU. ``chunk_size`` > 0: that many entries; < 0: a byte cap."""
    if chunk_size > 0:
        return max(1, min(chunk_size, vocab))
    align = _VOCAB_ALIGN if device.type == "cuda" else 1
    cols = _chunk_budget(device, _capped_budget(_LEAN_CHUNK_BYTES, chunk_size)) // (max(n_rows, 1) * element_size)
    return _balanced(vocab, max(align, cols // align * align), align)


def _kernel_plan(n_rows: int, n_cols: int, logits: torch.Tensor) -> dict:
    """Launch parameters of the kernels above for an (n_rows, n_cols) logits chunk.

    A row is walked in blocks of ``min(n_cols, _MAX_V_BLOCK)`` columns (a power of two), warps from
    the shared row heuristic sized for one block. Rows per program: 1 on the GPU (n_rows programs
    stream their rows in parallel); under the interpreter a tile of up to 64 rows, since its cost is
    per operation and a (64, BLOCK) tile costs about what one row does (``_INTERPRET_ROWS``).
    """
    plan = row_plan(min(n_cols, _MAX_V_BLOCK), logits.element_size(), logits.device)
    rows = 1 if logits.device.type == "cuda" else min(next_pow2(n_rows), _INTERPRET_ROWS)
    return dict(grid=(cdiv(n_rows, rows),), ROWS=rows, BLOCK=plan.block, num_warps=plan.num_warps)


# ----------------------------------------------------------------------------------------------
# The two operating points (plain functions; the custom ops below call them)
# ----------------------------------------------------------------------------------------------
def _fast(x, weight, target, bias, scale, ignore_index, softcap, label_smoothing, z_loss, chunk_size,
          need_dx, need_dw, need_db, keep_fp32_dw=False, lora=None, lora_needs=(False, False, False)):
    """Row chunks. Returns (row_loss (N,) fp32, dx (N, H) | empty, dW (V, H) | empty, db (V,) | empty) and, with
    ``lora`` (see :class:`_LoRAPass`), (dA (r, H), dB (V, r), dx_lora (N, H)) after them, empty where not asked for;
    the gradients already multiplied by ``scale`` (0-dim, or one value per row); dW in the weight's dtype, or its
    fp32 accumulator itself with ``keep_fp32_dw`` (:func:`_keeps_fp32_dw` true: more than one chunk)."""
    n_rows, hidden = x.shape
    vocab = weight.shape[0]
    dev = x.device
    lo = _LoRAPass(lora, lora_needs, x, need_dx, lean=False) if lora is not None else None
    write_grad = need_dx or need_dw or need_db or (lo is not None and lo.grads)
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=dev)  # (N,)
    dx = torch.empty((n_rows, hidden) if need_dx else (0,), dtype=x.dtype, device=dev)  # (N, H)
    rows = _row_chunk(n_rows, vocab, x.element_size(), dev, chunk_size, need_dw) if n_rows > 0 else 0
    # dW accumulates over row chunks in fp32 (in the output itself for an fp32 weight); the first
    # chunk's GEMM writes it, so it needs no zero-fill (except when there are no rows at all). With a
    # single chunk there is nothing to accumulate across: its GEMM (fp32 accumulation inside cuBLAS,
    # one rounding, as the fp32 buffer's final cast) writes dW in the weight's dtype directly, without
    # the (V, H) fp32 buffer (1 GB at V=128k, H=2048) that small batches would otherwise pay for.
    direct_dw = need_dw and 0 < n_rows <= rows and weight.dtype != torch.float32
    dw32 = (torch.zeros if n_rows == 0 else torch.empty)(
        (vocab, hidden) if need_dw else (0,), dtype=weight.dtype if direct_dw else torch.float32,
        device=dev)  # (V, H)
    db32 = torch.zeros((vocab,) if need_db else (0,), dtype=torch.float32, device=dev)  # (V,)
    if n_rows > 0:
        buf = torch.empty((rows, vocab), dtype=x.dtype, device=dev)  # (Nc, V), reused by every chunk
        per_row = scale.dim() == 1
        for r0 in range(0, n_rows, rows):
            r1 = min(r0 + rows, n_rows)
            x_c = x[r0:r1]  # (Nc, H)
            logits = buf[: r1 - r0]  # (Nc, V)
            if lo is not None:
                lo.logits(logits, x_c, weight, bias, r0, r1, 0, vocab)  # (Nc, V): x W^T + xa B^T
            else:
                _logits_gemm(logits, x_c, weight, bias)
            scale_c = scale[r0:r1] if per_row else scale
            plan = _kernel_plan(r1 - r0, vocab, logits)
            _flce_rows_kernel[plan.pop("grid")](
                logits, target[r0:r1], row_loss[r0:r1], scale_c,
                r1 - r0, logits.stride(0), 1 if per_row else 0, vocab, ignore_index,
                softcap or 1.0, label_smoothing, z_loss,
                HAS_SOFTCAP=bool(softcap), HAS_SMOOTHING=label_smoothing > 0, WRITE_GRAD=write_grad, **plan,
            )
            dlogits = logits  # (Nc, V), overwritten in place by the kernel
            if need_dx:
                _grad_input_gemm(dx[r0:r1], dlogits, weight, accumulate=None)  # (Nc, H)
            if need_dw:  # (V, H): fp32, or the weight's dtype for a single chunk
                _grad_weight_gemm(dw32, dlogits, x_c, accumulate=None if direct_dw else r0 > 0)
            if need_db:
                db32 += dlogits.sum(0, dtype=torch.float32)  # (V,)
            if lo is not None and write_grad:
                lo.grad_chunk(dlogits, r0, r1, 0, vocab)  # dB (V, r) fp32, gB (Nc, r) fp32
        del buf
    if not need_dw:
        dw = weight.new_empty(0)
    elif keep_fp32_dw:
        dw = dw32  # (V, H) fp32: the backward casts it while it scales it
    else:
        dw = dw32.to(weight.dtype)  # no copy when already in that dtype
    db = db32.to(bias.dtype) if need_db else weight.new_empty(0)
    if lo is None:
        return row_loss, dx, dw, db
    return (row_loss, dx, dw, db, *lo.finish(dx, accumulate32=False))


def _lean(x, weight, target, bias, scale, ignore_index, softcap, label_smoothing, z_loss, chunk_size,
          need_dx, need_dw, need_db, lora=None, lora_needs=(False, False, False)):
    """Vocabulary chunks, two passes. Same returns as ``_fast``."""
    n_rows, hidden = x.shape
    vocab = weight.shape[0]
    dev = x.device
    lo = _LoRAPass(lora, lora_needs, x, need_dx, lean=True) if lora is not None else None

    def out(*grads):
        return (row_loss, *grads) if lo is None else (row_loss, *grads, *lo.finish(grads[0], accumulate32=False))
    row_loss = torch.zeros(n_rows, dtype=torch.float32, device=dev)  # (N,)
    dx = torch.empty((n_rows, hidden) if need_dx else (0,), dtype=x.dtype, device=dev)  # (N, H)
    dw = torch.empty((vocab, hidden) if need_dw else (0,), dtype=weight.dtype, device=dev)  # (V, H)
    db = torch.empty((vocab,) if need_db else (0,), dtype=weight.dtype, device=dev)  # (V,)
    if n_rows == 0:
        dw.zero_()
        db.zero_()
        return out(dx, dw, db)
    cols = _vocab_chunk(n_rows, vocab, x.element_size(), dev, chunk_size)
    buf = torch.empty(n_rows * cols, dtype=x.dtype, device=dev)  # holds one (N, Vc) chunk
    chunks = [(v0, min(v0 + cols, vocab)) for v0 in range(0, vocab, cols)]
    plan = _kernel_plan(n_rows, cols, buf)
    grid = plan.pop("grid")
    launch = dict(HAS_SOFTCAP=bool(softcap), **plan)

    # pass 1: per-row online log-sum-exp, target logit and (label smoothing) sum of logits
    m = torch.full((n_rows,), float("-inf"), dtype=torch.float32, device=dev)  # (N,) running max
    s = torch.zeros(n_rows, dtype=torch.float32, device=dev)  # (N,) running sum of exp(z - m)
    zt = torch.zeros(n_rows, dtype=torch.float32, device=dev)  # (N,) target logit
    zsum = torch.zeros(n_rows, dtype=torch.float32, device=dev)  # (N,) sum of logits
    lse = torch.empty(n_rows, dtype=torch.float32, device=dev)  # (N,)
    for i, (v0, v1) in enumerate(chunks):
        logits = buf[: n_rows * (v1 - v0)].view(n_rows, v1 - v0)  # (N, Vc)
        if lo is not None:  # (N, Vc): x W^T + xa B^T
            lo.logits(logits, x, weight[v0:v1], None if bias is None else bias[v0:v1], 0, n_rows, v0, v1)
        else:
            _logits_gemm(logits, x, weight[v0:v1], None if bias is None else bias[v0:v1])
        _flce_lean_stats_kernel[grid](
            logits, target, m, s, zt, zsum, lse, row_loss,
            n_rows, logits.stride(0), v0, v1 - v0, vocab, ignore_index,
            softcap or 1.0, label_smoothing, z_loss,
            HAS_SMOOTHING=label_smoothing > 0, LAST=i == len(chunks) - 1, **launch,
        )
    del m, s, zt, zsum
    if not (need_dx or need_dw or need_db or (lo is not None and lo.grads)):
        del buf
        return out(dx, dw, db)

    # pass 2: recompute each chunk, turn it into dlogits, complete dW/db rows, accumulate dx
    # (N, H) fp32 accumulator over the vocabulary chunks, written by the first chunk's GEMM
    dx32 = dx if x.dtype == torch.float32 else torch.empty_like(dx, dtype=torch.float32)
    per_row = scale.dim() == 1
    for v0, v1 in chunks:
        logits = buf[: n_rows * (v1 - v0)].view(n_rows, v1 - v0)  # (N, Vc)
        if lo is not None:  # (N, Vc): x W^T + xa B^T
            lo.logits(logits, x, weight[v0:v1], None if bias is None else bias[v0:v1], 0, n_rows, v0, v1)
        else:
            _logits_gemm(logits, x, weight[v0:v1], None if bias is None else bias[v0:v1])
        _flce_lean_grad_kernel[grid](
            logits, target, lse, scale,
            n_rows, logits.stride(0), 1 if per_row else 0, v0, v1 - v0, vocab, ignore_index,
            softcap or 1.0, label_smoothing, z_loss, **launch,
        )
        dlogits = logits  # (N, Vc), overwritten in place
        if need_dw:
            _grad_weight_gemm(dw[v0:v1], dlogits, x, accumulate=None)  # (Vc, H), complete
        if need_db:
            db[v0:v1] = dlogits.sum(0, dtype=torch.float32)  # (Vc,)
        if need_dx:
            _grad_input_gemm(dx32, dlogits, weight[v0:v1], accumulate=v0 > 0)  # (N, H) fp32
        if lo is not None:
            lo.grad_chunk(dlogits, 0, n_rows, v0, v1)  # dB[v0:v1] (Vc, r), gB (N, r) fp32
    del buf
    lora_grads = lo.finish(dx32, accumulate32=True) if lo is not None else ()  # (its dx share into dx32)
    if need_dx and dx32 is not dx:
        dx.copy_(dx32)
    return (row_loss, dx, dw, db, *lora_grads)


def _compute(x, weight, target, bias, scale, ignore_index, softcap, label_smoothing, z_loss, mode, chunk_size,
             need_dx, need_dw, need_db, keep_fp32_dw=False, lora=None, lora_needs=(False, False, False)):
    # the GEMMs run in the dtype the caller chose (the public function already applied autocast)
    with torch.autocast(x.device.type, enabled=False):
        if mode == "fast":
            return _fast(x, weight, target.contiguous(), bias, scale, ignore_index, softcap, label_smoothing, z_loss,
                         chunk_size, need_dx, need_dw, need_db, keep_fp32_dw, lora, lora_needs)
        return _lean(x, weight, target.contiguous(), bias, scale, ignore_index, softcap, label_smoothing, z_loss,
                     chunk_size, need_dx, need_dw, need_db, lora, lora_needs)


def _lora_arg(lora_a, lora_b, x_lora, lora_scale):
    """The ops' LoRA inputs as :class:`_LoRAPass` takes them, or None without a LoRA head."""
    return None if lora_a is None else (lora_a, lora_b, x_lora, lora_scale)


def _lora_fakes(lora_a, lora_b, x_lora, x, need_da, need_dlb, need_dxl):
    """Empty (dA, dB, dx_lora) of the shapes the ops return (fake implementations)."""
    if lora_a is None:
        return x.new_empty(0), x.new_empty(0), x.new_empty(0)
    return (lora_a.new_empty(lora_a.shape if need_da else (0,)),
            lora_b.new_empty(lora_b.shape if need_dlb else (0,)),
            x.new_empty(x_lora.shape if need_dxl and x_lora is not None else (0,)))


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, traced through their fake implementations)
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("lit_liger::flce_fwd", mutates_args=())
def _flce_fwd(
    x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
    num_valid: torch.Tensor | None, num_valid_count: int, ignore_index: int, reduction: str, softcap: float,
    label_smoothing: float, z_loss: float, mode: str, chunk_size: int,
    need_dx: bool, need_dw: bool, need_db: bool,
    lora_a: torch.Tensor | None = None, lora_b: torch.Tensor | None = None, x_lora: torch.Tensor | None = None,
    lora_scale: float = 1.0, need_da: bool = False, need_dlb: bool = False, need_dxl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, H), target (N,); a LoRA head: lora_a (r, H), lora_b (V, r), x_lora (N, H) or None (x). Returns (loss,
    dx, dW, db, dA, dB, dx_lora): loss is 0-dim fp32 ("mean"/"sum") or (N,) fp32 ("none"); the gradients are those
    of the loss (grad_output 1), empty where not asked for, and always empty for "none" (its backward recomputes).
    dW is fp32 where :func:`_keeps_fp32_dw`."""
    if reduction == "none":
        need_dx = need_dw = need_db = need_da = need_dlb = need_dxl = False
    if reduction == "mean":
        count = num_valid if num_valid is not None else (num_valid_count if num_valid_count >= 0 else None)
        scale = 1.0 / _mean_divisor(target, ignore_index, count)  # 0-dim fp32 on the device
    else:
        scale = torch.ones((), dtype=torch.float32, device=x.device)
    keep32 = _keeps_fp32_dw(x.shape[0], weight.shape[0], x.element_size(), x.device, chunk_size, need_dw, mode,
                            weight.dtype)
    lora = _lora_arg(lora_a, lora_b, x_lora, lora_scale)
    row_loss, dx, dw, db, *lora_grads = _compute(
        x, weight, target, bias, scale, ignore_index, softcap, label_smoothing, z_loss, mode, chunk_size,
        need_dx, need_dw, need_db, keep32, lora, (need_da, need_dlb, need_dxl),
    )
    if not lora_grads:
        lora_grads = [x.new_empty(0) for _ in range(3)]
    if reduction == "none":
        loss = row_loss  # (N,)
    elif reduction == "sum":
        loss = row_loss.sum()
    else:
        loss = row_loss.sum() * scale
    return (loss, dx, dw, db, *lora_grads)


@_flce_fwd.register_fake
def _(x, weight, target, bias, num_valid, num_valid_count, ignore_index, reduction, softcap, label_smoothing,
      z_loss, mode, chunk_size, need_dx, need_dw, need_db, lora_a=None, lora_b=None, x_lora=None, lora_scale=1.0,
      need_da=False, need_dlb=False, need_dxl=False):
    grads = reduction != "none"
    loss = x.new_empty((x.shape[0],) if reduction == "none" else (), dtype=torch.float32)
    dx = x.new_empty(x.shape if need_dx and grads else (0,))
    keep32 = grads and _keeps_fp32_dw(x.shape[0], weight.shape[0], x.element_size(), x.device, chunk_size, need_dw,
                                      mode, weight.dtype)
    dw = weight.new_empty(weight.shape if need_dw and grads else (0,), dtype=torch.float32 if keep32 else None)
    db = weight.new_empty((weight.shape[0],) if need_db and grads else (0,))
    return (loss, dx, dw, db, *_lora_fakes(lora_a, lora_b, x_lora, x, need_da and grads, need_dlb and grads,
                                           need_dxl and grads))


@torch.library.custom_op("lit_liger::flce_bwd_rows", mutates_args=())
def _flce_bwd_rows(
    grad_rows: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
    bias: torch.Tensor | None, ignore_index: int, softcap: float, label_smoothing: float, z_loss: float,
    mode: str, chunk_size: int, need_dx: bool, need_dw: bool, need_db: bool,
    lora_a: torch.Tensor | None = None, lora_b: torch.Tensor | None = None, x_lora: torch.Tensor | None = None,
    lora_scale: float = 1.0, need_da: bool = False, need_dlb: bool = False, need_dxl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of reduction="none": recomputes the chunks with each row's dlogits scaled by its
    grad_rows (N,) entry. Returns (dx, dW, db, dA, dB, dx_lora), empty where not asked for."""
    scale = grad_rows.to(torch.float32).contiguous()  # (N,)
    _, dx, dw, db, *lora_grads = _compute(
        x, weight, target, bias, scale, ignore_index, softcap, label_smoothing, z_loss, mode, chunk_size,
        need_dx, need_dw, need_db, False, _lora_arg(lora_a, lora_b, x_lora, lora_scale), (need_da, need_dlb, need_dxl),
    )
    if not lora_grads:
        lora_grads = [x.new_empty(0) for _ in range(3)]
    return (dx, dw, db, *lora_grads)


@_flce_bwd_rows.register_fake
def _(grad_rows, x, weight, target, bias, ignore_index, softcap, label_smoothing, z_loss, mode, chunk_size,
      need_dx, need_dw, need_db, lora_a=None, lora_b=None, x_lora=None, lora_scale=1.0, need_da=False,
      need_dlb=False, need_dxl=False):
    return (
        x.new_empty(x.shape if need_dx else (0,)),
        weight.new_empty(weight.shape if need_dw else (0,)),
        weight.new_empty((weight.shape[0],) if need_db else (0,)),
        *_lora_fakes(lora_a, lora_b, x_lora, x, need_da, need_dlb, need_dxl),
    )


@fast_launch
@triton.jit
def _scale_kernel(SRC, DST, G, n_elements, BLOCK: tl.constexpr):
    """``DST = SRC * g`` over a flat contiguous range, in fp32, rounded once to DST's dtype (``G``: one fp32)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: (V, H) may pass 2**31 elements
    mask = offs < n_elements
    g = tl.load(G)
    v = tl.load(SRC + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DST + offs, (v * g).to(DST.dtype.element_ty), mask=mask)


@torch.library.custom_op("lit_liger::flce_scale_grad", mutates_args=("dst",))
def _scale_into(dst: torch.Tensor, g: torch.Tensor, src: torch.Tensor | None = None) -> None:
    """``dst = src * g`` (``src`` None: ``dst`` itself, in place), computed in fp32 and rounded once to ``dst``'s
    dtype; ``g`` a 0-dim tensor (``grad_output``). One pass: ``dW.mul_(g)`` on a 16-bit dW with an fp32 device scalar
    ran as a non-vectorized mixed-dtype kernel, 2.7 ms per gemma-2 step on an H100 over its (256k, 2304) dW, after a
    separate fp32 -> 16-bit cast pass in the forward (h100-2026-11-24h/step-gemma2-prof/)."""
    src = dst if src is None else src
    g32 = g.detach().to(torch.float32).reshape(())
    if use_triton(dst) and dst.numel() > 0 and dst.is_contiguous() and src.is_contiguous():
        plan = elementwise_plan(dst.numel(), dst.device)
        _scale_kernel[plan.grid](src, dst, g32, dst.numel(), BLOCK=plan.block, num_warps=plan.num_warps)
    else:
        dst.copy_(src.to(torch.float32) * g32)


@_scale_into.register_fake
def _(dst, g, src=None):
    return None


_N_INPUTS = 23  # _flce_fwd's inputs: the backward returns one gradient (or None) for each


def _setup_context(ctx, inputs, output):
    (x, weight, target, bias, _nv, _nvc, ignore_index, reduction, softcap, label_smoothing, z_loss, mode,
     chunk_size, need_dx, need_dw, need_db, *lora_inputs) = inputs
    lora_a, lora_b, x_lora, lora_scale, need_da, need_dlb, need_dxl = (lora_inputs + [None, None, None, 1.0, False,
                                                                                      False, False][len(lora_inputs):])
    _, dx, dw, db, da, dlb, dxl = output
    ctx.mark_non_differentiable(dx, dw, db, da, dlb, dxl)  # internal: the public function returns only the loss
    # Their incoming gradients stay None: materialized, they would be zero-filled (V, H) and (N, H)
    # tensors allocated at the start of the backward, next to the stored gradients (+533 MiB at
    # V=128k, H=2048, N=8192: measured, benchmarks/results/h100-2026-11-22/flce-diag).
    ctx.set_materialize_grads(False)
    ctx.reduction = reduction
    ctx.needs = (need_dx, need_dw, need_db)
    ctx.lora_needs = (need_da, need_dlb, need_dxl and x_lora is not None)
    ctx.weight_dtype = weight.dtype
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias, lora_a, lora_b, x_lora)
        ctx.config = (ignore_index, softcap, label_smoothing, z_loss, mode, chunk_size)
        ctx.lora_scale = lora_scale
    else:
        ctx.save_for_backward(dx, dw, db, da, dlb, dxl)


def _backward(ctx, grad_loss, _gdx, _gdw, _gdb, _gda, _gdlb, _gdxl):
    need_dx, need_dw, need_db = ctx.needs
    need_da, need_dlb, need_dxl = ctx.lora_needs
    if grad_loss is None:  # not reachable through the public function (it returns the loss)
        return (None,) * _N_INPUTS
    if ctx.reduction == "none":
        x, weight, target, bias, lora_a, lora_b, x_lora = ctx.saved_tensors
        dx, dw, db, da, dlb, dxl = _flce_bwd_rows(
            grad_loss, x, weight, target, bias, *ctx.config, need_dx, need_dw, need_db,
            lora_a, lora_b, x_lora, ctx.lora_scale, need_da, need_dlb, need_dxl,
        )
    else:
        dx, dw, db, da, dlb, dxl = ctx.saved_tensors
        # The stored gradients belong to this graph alone: scale them in place (no second copy of
        # dW). A second backward through the same graph then fails autograd's saved-tensor
        # version check instead of returning wrong gradients. An fp32 dW accumulator (more than one
        # chunk: _keeps_fp32_dw) is cast to the weight's dtype in the pass that scales it; the new
        # tensor takes the place of the cast the forward would have made (and the accumulator is freed).
        g = grad_loss.to(torch.float32)  # 0-dim
        if need_dx:
            _scale_into(dx, g)  # (N, H)
        if need_dw:
            if dw.dtype != ctx.weight_dtype:
                out = torch.empty(dw.shape, dtype=ctx.weight_dtype, device=dw.device)  # (V, H)
                _scale_into(out, g, dw)
                dw = out
            else:
                _scale_into(dw, g)  # (V, H)
        if need_db:
            db = db.mul_(g)  # (V,)
        for t, need in ((da, need_da), (dlb, need_dlb), (dxl, need_dxl)):
            if need:
                _scale_into(t, g)  # (r, H), (V, r), (N, H)
    return ((dx if need_dx else None, dw if need_dw else None, None, db if need_db else None) + (None,) * 12
            + (da if need_da else None, dlb if need_dlb else None, dxl if need_dxl else None) + (None,) * 4)


_flce_fwd.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------
def _check(x, weight, target, bias, ignore_index, reduction, softcap, label_smoothing, z_loss, num_valid_targets,
           mode, chunk_size, max_chunk_bytes=None) -> None:
    check_float("x", x)
    check_float("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (V, H), got shape {tuple(weight.shape)}")
    check_last_dim("x", x, weight.shape[1], "the hidden size, weight.shape[1]")
    check_same_dtype(x=x, weight=weight, bias=bias)
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype == torch.bool or target.is_floating_point() or target.is_complex():
        raise TypeError(f"target must hold integer class indices, got {target.dtype}")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"target shape {tuple(target.shape)} must equal x.shape[:-1] = {tuple(x.shape[:-1])}")
    if bias is not None:
        check_float("bias", bias)
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape (V,) = ({weight.shape[0]},), got {tuple(bias.shape)}")
    check_same_device(x=x, weight=weight, target=target, bias=bias)
    if isinstance(num_valid_targets, torch.Tensor):
        if num_valid_targets.numel() != 1:
            raise ValueError(f"num_valid_targets must be a scalar, got shape {tuple(num_valid_targets.shape)}")
        check_same_device(x=x, num_valid_targets=num_valid_targets)
    elif num_valid_targets is not None and (
        isinstance(num_valid_targets, bool) or not isinstance(num_valid_targets, int) or num_valid_targets < 0
    ):
        raise ValueError(f"num_valid_targets must be a non-negative int or a tensor, got {num_valid_targets!r}")
    if num_valid_targets is not None and reduction != "mean":
        raise ValueError(f"num_valid_targets is the divisor of reduction='mean'; it means nothing for {reduction!r}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be None or > 0, got {softcap!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not z_loss >= 0.0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
    if max_chunk_bytes is not None and (isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, int)
                                        or max_chunk_bytes < 1):
        raise ValueError(f"max_chunk_bytes must be None or a positive int, got {max_chunk_bytes!r}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")


def _check_lora(x, weight, lora_a, lora_b, lora_scale, x_lora) -> None:
    """The LoRA head's inputs: both matrices or neither, A (r, H), B (V, r), x_lora shaped like x, one dtype and
    device with x, a finite real scale."""
    if lora_a is None and lora_b is None:
        if x_lora is not None:
            raise ValueError("x_lora is the LoRA branch's input: it needs lora_a and lora_b")
        return
    if lora_a is None or lora_b is None:
        raise ValueError("a LoRA head needs both lora_a (r, H) and lora_b (V, r)")
    check_float("lora_a", lora_a)
    check_float("lora_b", lora_b)
    vocab, hidden = weight.shape
    if lora_a.dim() != 2 or lora_a.shape[1] != hidden or lora_a.shape[0] < 1:
        raise ValueError(f"lora_a must have shape (r, H) = (r, {hidden}) with r >= 1, got {tuple(lora_a.shape)}")
    if lora_b.dim() != 2 or tuple(lora_b.shape) != (vocab, lora_a.shape[0]):
        raise ValueError(f"lora_b must have shape (V, r) = ({vocab}, {lora_a.shape[0]}), got {tuple(lora_b.shape)}")
    if x_lora is not None:
        check_float("x_lora", x_lora)
        if tuple(x_lora.shape) != tuple(x.shape):
            raise ValueError(f"x_lora (the LoRA branch's input) must have x's shape {tuple(x.shape)}, "
                             f"got {tuple(x_lora.shape)}")
    check_same_dtype(x=x, lora_a=lora_a, lora_b=lora_b, x_lora=x_lora)
    check_same_device(x=x, lora_a=lora_a, lora_b=lora_b, x_lora=x_lora)
    if isinstance(lora_scale, bool) or not isinstance(lora_scale, (int, float)) or not abs(lora_scale) < float("inf"):
        raise ValueError(f"lora_scale must be a finite number, got {lora_scale!r}")


def _chunk_arg(chunk_size: int | None, max_chunk_bytes: int | None) -> int:
    """The ops' one ``chunk_size`` int: > 0 a fixed chunk, < 0 a cap in bytes on the automatic one, 0 automatic."""
    if chunk_size:
        return int(chunk_size)
    return -int(max_chunk_bytes) if max_chunk_bytes else 0


def _check_target_values(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Eager (host-syncing) check: every target is in [0, V) or is ignore_index."""
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        value = int(target[tuple(where)])
        raise ValueError(
            f"target[{', '.join(map(str, where))}] = {value} is outside [0, {vocab}) and is not "
            f"ignore_index={ignore_index}; {int(bad.sum())} target(s) are out of range"
        )


def _autocast(x, weight, bias, *more):
    """Inside ``torch.autocast`` the lm_head GEMMs (a LoRA head's too: ``more``) run in the autocast dtype, as
    ``F.linear`` and ``@`` would."""
    dev = x.device.type if isinstance(x, torch.Tensor) else None
    if dev in ("cuda", "cpu") and torch.is_autocast_enabled(dev):
        dtype = torch.get_autocast_dtype(dev)

        def cast(t):
            return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

        x, weight, bias = cast(x), cast(weight), cast(bias)
        more = tuple(cast(t) for t in more)
    return (x, weight, bias, *more) if more else (x, weight, bias)


def fused_linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    softcap: float | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    num_valid_targets: int | torch.Tensor | None = None,
    mode: str = "fast",
    chunk_size: int | None = None,
    max_chunk_bytes: int | None = None,
    lora_a: torch.Tensor | None = None,
    lora_b: torch.Tensor | None = None,
    lora_scale: float = 1.0,
    x_lora: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(softcap(F.linear(x, weight, bias)).float(), target, ...)`` (+ z-loss)
    without materializing the (N, V) logits.

    x ``(..., H)``, weight ``(V, H)``, target ``(...)`` integer, bias ``(V,)``. The loss is fp32.
    ``num_valid_targets`` (int or device scalar tensor; gradient accumulation / data parallel)
    replaces the local count of non-ignored targets as the divisor of ``reduction="mean"``; an
    all-ignored batch gives 0 and zero gradients. ``mode``: "fast" (row chunks, fp32 dW
    accumulator) or "lean" (vocabulary chunks, one more GEMM, no (V, H) buffer). ``chunk_size``:
    rows per chunk ("fast") or vocabulary entries per chunk ("lean"); default from shapes and free
    memory. ``max_chunk_bytes`` caps that default's logits buffer (it never goes below one GEMM tile:
    128 rows / 256 entries on the GPU); ignored when ``chunk_size`` is given. Gradients are computed
    only for the inputs that require them.

    A LoRA head (LitGPT's ``LoRALinear``): ``lora_a`` ``(r, H)``, ``lora_b`` ``(V, r)``, ``lora_scale`` (its
    ``scaling``, ``lora_alpha / r``) add ``(x_lora @ lora_a^T @ lora_b^T) * lora_scale`` to the logits, where
    ``x_lora`` ``(..., H)`` is the LoRA branch's input (LitGPT's ``lora_dropout(x)``; None: ``x`` itself).
    """
    x, weight, bias, lora_a, lora_b, x_lora = _autocast(x, weight, bias, lora_a, lora_b, x_lora)
    _check(x, weight, target, bias, ignore_index, reduction, softcap, label_smoothing, z_loss, num_valid_targets,
           mode, chunk_size, max_chunk_bytes)
    _check_lora(x, weight, lora_a, lora_b, lora_scale, x_lora)
    vocab = weight.shape[0]
    if not use_triton(x):
        if x.device.type != "meta" and not torch.compiler.is_compiling():
            _check_target_values(target, vocab, ignore_index)
        return fused_linear_cross_entropy_reference(
            x, weight, target, bias, ignore_index=ignore_index, reduction=reduction, softcap=softcap,
            label_smoothing=label_smoothing, z_loss=z_loss, num_valid_targets=num_valid_targets,
            lora_a=lora_a, lora_b=lora_b, lora_scale=lora_scale, x_lora=x_lora,
        )
    if (x.device.type == "cpu" or CHECK_TARGETS) and not torch.compiler.is_compiling():
        _check_target_values(target, vocab, ignore_index)
    grad = torch.is_grad_enabled()
    need_dx = grad and x.requires_grad
    need_dw = grad and weight.requires_grad
    need_db = grad and bias is not None and bias.requires_grad
    nv_tensor = num_valid_targets if isinstance(num_valid_targets, torch.Tensor) else None
    nv_count = num_valid_targets if isinstance(num_valid_targets, int) else -1
    x2 = as_rows(x)  # (N, H)
    t = target.reshape(-1)  # (N,)
    lora = ()
    if lora_a is not None:
        xl2 = as_rows(x_lora) if x_lora is not None else None  # (N, H)
        lora = (lora_a, lora_b, xl2, float(lora_scale), grad and lora_a.requires_grad, grad and lora_b.requires_grad,
                grad and xl2 is not None and xl2.requires_grad)
    loss, *_ = _flce_fwd(
        x2, weight, t, bias, nv_tensor, nv_count, int(ignore_index), reduction, float(softcap or 0.0),
        float(label_smoothing), float(z_loss), mode, _chunk_arg(chunk_size, max_chunk_bytes), need_dx, need_dw,
        need_db, *lora,
    )
    return loss.reshape(target.shape) if reduction == "none" else loss
