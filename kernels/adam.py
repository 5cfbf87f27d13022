"""Adam / AdamW's step over many tensors in one launch (the optimizer step of ``lit_liger.optim``).

``adam_step_(params, grads, exp_avgs, exp_avg_sqs, steps, lr=..., ...)`` updates each parameter and its two moments
in place, as PyTorch's ``torch.optim.Adam`` / ``AdamW`` with ``fused=True`` computes them (fp32 math, each value read
once and written once, rounded once to its tensor's dtype)::

    g = -g if maximize                                       # every value read as fp32
    p = p - lr * wd * p          (AdamW: decoupled decay)    or   g = g + wd * p   (Adam)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

where ``t`` is the tensor's step count, a float32 tensor on the device that the caller has already advanced (as
PyTorch's fused and capturable optimizers keep it): nothing is read back to the host.

Why a kernel of lit-liger's: PyTorch's fused kernel launches groups of at most a few hundred blocks of 65,536 elements
(its multi-tensor apply), which leaves part of an H100 / H200 idle in every launch; the step of a 1B model's full
fine-tuning (17-21 GB read and written) ran at ~1.6-1.9 TB/s on an H200 (``benchmarks/results/h200x2-2026-11-27b``).
Here one launch covers every tensor of a dtype group: a table on the device holds each tensor's addresses (parameter,
gradient, both moments, step count) and size, and one program per chunk of ``BLOCK * ITERS`` elements looks its
tensor up. Every program reads a parameter, gradient and moment chunk once and writes the parameter and moments once:
14 bytes per bf16 element, the floor of the step's memory traffic. Measured on an H100 (``python -m benchmarks diag
adam-step``): at Llama-3.1-8B's widths 0.80-0.86 of the device's copy rate against PyTorch's fused kernel's 0.72; at
Llama-3.2-1B's, both 0.72 (``kernels/_launch.py``'s ``adam_plan`` has the numbers).

A tensor that is not contiguous goes through :func:`adam_reference_` (the same math in PyTorch), as do CPU tensors
without ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._checks import check_float
from ._launch import adam_plan, cdiv, use_triton

__all__ = ["adam_step_", "adam_reference_"]


# ----------------------------------------------------------------------------------------------
# Reference (CPU path, non-contiguous tensors, and the tests' second opinion)
# ----------------------------------------------------------------------------------------------
def adam_reference_(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: torch.Tensor, *,
                    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
                    maximize: bool = False) -> None:
    """One tensor's step in PyTorch ops, fp32 math, in place (the bias corrections in fp64 from ``step``, a tensor:
    no host read)."""
    pf, gf, mf, vf = p.float(), g.float(), m.float(), v.float()
    if maximize:
        gf = -gf
    if weight_decay != 0:
        if decoupled:
            pf = pf - (lr * weight_decay) * pf
        else:
            gf = gf + pf * weight_decay
    mf = mf * beta1 + gf * (1 - beta1)
    vf = vf * beta2 + gf * gf * (1 - beta2)
    t = step.to(torch.float64)
    step_size = (lr / (1 - torch.pow(beta1, t))).to(torch.float32)
    bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, t)).to(torch.float32)
    pf = pf - step_size * mf / (vf.sqrt() / bc2_sqrt + eps)
    p.copy_(pf)
    m.copy_(mf)
    v.copy_(vf)


# ----------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------
#: columns of the tensor table: the addresses of the parameter, gradient, first and second moment, the step count
#: (float32), then the number of elements
_COLS = 6


@triton.jit
def _adam_kernel(table, chunk_tensor, chunk_start, P, G, M, V, lr, beta1, one_minus_beta1, beta2, one_minus_beta2,
                 eps, weight_decay, lr_decay, log_beta1, log_beta2, DECOUPLED: tl.constexpr, DECAY: tl.constexpr, MAXIMIZE: tl.constexpr,
                 ALIGNED: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Program ``pid`` steps ``BLOCK * ITERS`` elements of one tensor, from ``chunk_start[pid]`` of tensor
    ``chunk_tensor[pid]`` (a row of ``table``: its addresses and size). ``P``/``G``/``M``/``V``: any tensors of the
    group's four dtypes (their pointer types are the ones the table's addresses are read as). ``ALIGNED``: every
    address is a multiple of 16 bytes and every size a multiple of 16 elements, so that loads and stores are 16-byte
    vectors (the mask is constant over each)."""
    pid = tl.program_id(0)
    row = table + tl.load(chunk_tensor + pid).to(tl.int64) * 6
    start = tl.load(chunk_start + pid)
    p_addr = tl.load(row)
    g_addr = tl.load(row + 1)
    m_addr = tl.load(row + 2)
    v_addr = tl.load(row + 3)
    n = tl.load(row + 5)
    if ALIGNED:  # (hints: the mask is constant over 16 elements, the chunk starts on a block)
        n = tl.multiple_of(n, 16)
        start = tl.multiple_of(start, BLOCK)
    p_ptr = p_addr.to(P.dtype)
    g_ptr = g_addr.to(G.dtype)
    m_ptr = m_addr.to(M.dtype)
    v_ptr = v_addr.to(V.dtype)
    if ALIGNED:  # (16-byte aligned addresses; a hint on the integer before the cast is not carried over)
        p_ptr = tl.multiple_of(p_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        m_ptr = tl.multiple_of(m_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
    # bias corrections in fp64 from the tensor's step count (as PyTorch's fused kernel computes them)
    t = tl.load(tl.load(row + 4).to(tl.pointer_type(tl.float32))).to(tl.float64)
    bc1 = 1.0 - tl.exp(t * log_beta1)  # (fp64: t is)
    bc2 = 1.0 - tl.exp(t * log_beta2)
    step_size = (lr / bc1).to(tl.float32)
    bc2_sqrt = tl.sqrt(bc2).to(tl.float32)
    offs = start + tl.arange(0, BLOCK)
    for _ in range(ITERS):
        mask = offs < n
        p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
        if MAXIMIZE:
            g = -g
        if DECAY:
            if DECOUPLED:
                p = p - lr_decay * p
            else:
                g = g + p * weight_decay
        m = beta1 * m + one_minus_beta1 * g
        v = beta2 * v + one_minus_beta2 * g * g
        # (IEEE-rounded square root and divisions, as PyTorch's kernel computes them: Triton's `/` is approximate)
        p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps)
        tl.store(p_ptr + offs, p.to(P.dtype.element_ty), mask=mask)
        tl.store(m_ptr + offs, m.to(M.dtype.element_ty), mask=mask)
        tl.store(v_ptr + offs, v.to(V.dtype.element_ty), mask=mask)
        offs += BLOCK


#: (device, the group's sizes, chunk) -> the chunk tables on the device (``chunk_tensor``, ``chunk_start``); a few
#: entries: an optimizer steps the same groups every step (the replica's chunked step: one per chunk)
_CHUNKS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_CHUNKS_MAX = 32


def _chunk_tables(sizes: tuple[int, ...], chunk: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device, sizes, chunk)
    hit = _CHUNKS.get(key)
    if hit is None:
        counts = torch.tensor([cdiv(n, chunk) for n in sizes], dtype=torch.int64)
        first = torch.cumsum(counts, 0) - counts  # (T,) each tensor's first chunk
        ids = torch.repeat_interleave(torch.arange(len(sizes), dtype=torch.int32), counts)
        starts = (torch.arange(int(counts.sum()), dtype=torch.int64) - torch.repeat_interleave(first, counts)) * chunk
        hit = (_to_device(ids, device), _to_device(starts, device))
        if len(_CHUNKS) >= _CHUNKS_MAX:
            _CHUNKS.pop(next(iter(_CHUNKS)))
        _CHUNKS[key] = hit
    return hit


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without the host waiting for the device (a pinned copy, stream-ordered; the
    caching host allocator keeps the pinned block until the copy is done)."""
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _aligned(*ts: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts) and ts[0].numel() % 16 == 0


def _launch(group: list[tuple], hyper: dict, flags: tuple[bool, bool, bool], aligned: bool) -> None:
    p0, g0, m0, v0, _ = group[0]
    device = p0.device
    block, iters, warps = adam_plan(device)
    sizes = tuple(p.numel() for p, *_ in group)
    ids, starts = _chunk_tables(sizes, block * iters, device)
    table = torch.tensor([[p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), s.data_ptr(), p.numel()]
                          for p, g, m, v, s in group], dtype=torch.int64)
    table = _to_device(table, device)
    decoupled, decay, maximize = flags
    _adam_kernel[(ids.numel(),)](
        table, ids, starts, p0, g0, m0, v0, hyper["lr"], hyper["beta1"], 1.0 - hyper["beta1"], hyper["beta2"],
        1.0 - hyper["beta2"], hyper["eps"], hyper["weight_decay"], hyper["lr"] * hyper["weight_decay"], math.log(hyper["beta1"]) if hyper["beta1"] > 0 else -math.inf,
        math.log(hyper["beta2"]) if hyper["beta2"] > 0 else -math.inf, DECOUPLED=decoupled, DECAY=decay,
        MAXIMIZE=maximize, ALIGNED=aligned, BLOCK=block, ITERS=iters, num_warps=warps)


def adam_step_(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor], *, lr: float, beta1: float, beta2: float,
               eps: float, weight_decay: float = 0.0, decoupled: bool = True, maximize: bool = False) -> None:
    """Adam (``decoupled=False``) or AdamW's step of every tensor, in place (see the module's docstring).

    ``params[i]``, ``grads[i]``, ``exp_avgs[i]``, ``exp_avg_sqs[i]``: floating tensors of one shape on one device
    (plain tensors: a DTensor's local shard); ``steps[i]``: its step count, a float32 tensor of one element on the same
    device, already advanced for this step. Hyperparameters are Python numbers."""
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == len(steps) == n):
        raise ValueError(f"adam_step_: {n} params, {len(grads)} grads, {len(exp_avgs)} exp_avgs, "
                         f"{len(exp_avg_sqs)} exp_avg_sqs and {len(steps)} steps; they must pair up")
    for name, value in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", weight_decay)):
        if isinstance(value, torch.Tensor) or not isinstance(value, (int, float)):
            raise TypeError(f"adam_step_: {name} must be a Python number, got {type(value).__name__}")
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"adam_step_: betas must lie in [0, 1), got ({beta1}, {beta2})")
    hyper = dict(lr=float(lr), beta1=float(beta1), beta2=float(beta2), eps=float(eps),
                 weight_decay=float(weight_decay))
    groups: dict[tuple, list[tuple]] = {}
    for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        for name, t in (("param", p), ("grad", g), ("exp_avg", m), ("exp_avg_sq", v)):
            check_float(f"adam_step_: a {name}", t)
            if t.shape != p.shape or t.device != p.device:
                raise ValueError(f"adam_step_: a {name} of shape {tuple(t.shape)} on {t.device} pairs with a "
                                 f"parameter of shape {tuple(p.shape)} on {p.device}")
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.numel() != 1 or s.device != p.device:
            raise ValueError("adam_step_: each step count must be a float32 tensor of one element on its parameter's "
                             f"device ({p.device}), got {s.dtype if isinstance(s, torch.Tensor) else type(s)}")
        if p.numel() == 0:
            continue
        if not use_triton(p) or not all(t.is_contiguous() for t in (p, g, m, v)):
            adam_reference_(p, g, m, v, s, **hyper, decoupled=decoupled, maximize=maximize)
            continue
        key = (p.device, p.dtype, g.dtype, m.dtype, v.dtype, _aligned(p, g, m, v))
        groups.setdefault(key, []).append((p, g, m, v, s))
    flags = (bool(decoupled), hyper["weight_decay"] != 0.0, bool(maximize))
    for key, group in groups.items():
        _launch(group, hyper, flags, aligned=key[-1])
