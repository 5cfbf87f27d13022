"""Float8 casts with tensorwise scaling, fused into the kernels that compute the tensor being cast.

Tensorwise scaling (torchao's ``tensorwise`` recipe, which ``LigerConfig.fp8`` uses) casts a 16-bit tensor ``t`` as
``scale = fp8_max / max(|t|)`` (float64 math, rounded to float32; ``max(|t|)`` at least 1e-12) and
``t8 = saturate(t.float() * scale)`` rounded to the float8 dtype (round to nearest even). The GEMM then reads ``t8``
and ``1 / scale``. Done as separate ops this is a reduction over ``t`` and a cast of ``t`` (two reads of ``t``, after
whatever wrote ``t``), and a GEMM that needs an operand transposed (the weight gradient's ``x.t()``, the input
gradient's ``w.t()``) needs a transposed float8 copy as well.

Here one tile kernel (``_fp8_kernel``) computes the tensor's values itself from what produced them, and either
reduces them to per-tile max |t| (``AMAX``) or writes them as float8, row-major and/or transposed (``CAST``):

* ``OP_COPY``: ``t`` is a 16-bit tensor (a weight, an output gradient);
* ``OP_NORM``: ``t = rms_norm(x)`` from ``x``, the norm's saved ``rstd`` and weight (the same arithmetic as
  :mod:`.rms_norm`'s forward kernel, so the same bits); the norm's forward kernel gives each row's max |t|
  while it computes ``rstd`` (``rms_norm._rms_norm_amax_impl``), so ``t`` is never written in 16 bits;
* ``OP_GLU``: ``t = act(a) * b`` from ``a`` and ``b`` (:mod:`.swiglu`'s arithmetic).

The values are rounded to the 16-bit dtype before they are scaled, as the 16-bit tensor would hold them, so a cast
here has the bits torchao's cast of that tensor has (the GPU tests check it bit for bit). The scale is computed from
the reduced maximum on the device (:func:`fp8_scale`, torchao's formula): no host sync.

The Triton interpreter (CPU tests) converts float32 to float8 without carrying a round-up into the exponent
(125.76 becomes 64.0, not 128.0, in e4m3): under the interpreter the kernel first rounds the value to the float8 grid
itself (``_round_to_fp8_grid``), after which the conversion is exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import cdiv, fast_launch, fp8_scale_plan, fp8_tile_plan, interpret_mode, use_triton
from .rms_norm import _rms_norm_amax, _rms_norm_amax_impl
from .swiglu import ACTIVATIONS, _act_and_grad

__all__ = ["E4M3", "E5M2", "fp8_scale", "amax_scale", "fp8_cast", "norm_fp8", "norm_fp8_t", "glu_fp8", "cast_reference"]

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
_DTYPES = (E4M3, E5M2)
#: per float8 dtype: (largest finite value, mantissa bits, exponent of the smallest normal)
_FORMAT = {E4M3: (448.0, 3, -6), E5M2: (57344.0, 2, -14)}
OP_COPY, OP_NORM, OP_GLU = 0, 1, 2
#: torchao's lower bound on a tensor's max |t| before the scale's division (``float8_utils.EPS``)
AMAX_EPS = 1e-12
AMAX_EPS_F64 = tl.constexpr(AMAX_EPS)


# ----------------------------------------------------------------------------------------------
# Reference (CPU path and the tests' second opinion; the tests' primary reference is torchao's own cast)
# ----------------------------------------------------------------------------------------------
def fp8_scale(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torchao's ``amax_to_scale``: ``float32(fp8_max / max(amax, 1e-12))`` computed in float64."""
    return (torch.finfo(dtype).max / torch.clamp(amax.to(torch.float64), min=AMAX_EPS)).to(torch.float32)


def cast_reference(t: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t8, scale)``: ``t`` cast to float8 ``dtype`` with tensorwise scaling (``scale`` computed if not given)."""
    if scale is None:
        scale = fp8_scale(t.abs().max(), dtype)
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _round_to_fp8_grid(v, MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """``v`` (float32, within the float8 range) rounded to the nearest float8 value, ties to even. Normal values:
    the float32 mantissa rounded to MANT bits on its bits; below 2**MIN_EXP (float8 subnormals, spaced
    2**(MIN_EXP - MANT)): adding and subtracting 1.5 * 2**(MIN_EXP - MANT + 23), whose float32 spacing is that."""
    DROP: tl.constexpr = 23 - MANT
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + ((1 << (DROP - 1)) - 1) + ((bits >> DROP) & 1)) & (-(1 << DROP))
    normal = bits.to(tl.float32, bitcast=True)
    magic: tl.constexpr = 1.5 * 2.0 ** (MIN_EXP - MANT + 23)
    sub = (tl.abs(v) + magic) - magic
    sub = tl.where(v.to(tl.int32, bitcast=True) < 0, -sub, sub)  # (the sign bit: -0.0 stays -0.0)
    return tl.where(tl.abs(v) < 2.0 ** MIN_EXP, sub, normal)


@fast_launch
@triton.jit
def _fp8_kernel(
    SRC0, SRC1, ROWV, COLV, SCALE, OUT, OUT_T, PARTIAL,
    n_rows, n_cols, stride0, stride1, ld_t, offset, n_col_tiles,
    OP: tl.constexpr, ACTIVATION: tl.constexpr, AMAX: tl.constexpr, WRITE: tl.constexpr, WRITE_T: tl.constexpr,
    FP8_MAX: tl.constexpr, MANT: tl.constexpr, MIN_EXP: tl.constexpr, INTERPRET: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):
    """One program per BM x BN tile of the (n_rows, n_cols) tensor t that OP computes (module docstring). AMAX:
    writes the tile's max |t| to PARTIAL[pid]. Otherwise writes t * scale, saturated, as float8: to OUT
    (row-major, (n_rows, n_cols)) if WRITE and to OUT_T (transposed, (n_cols, ld_t): row length ld_t >= n_rows)
    if WRITE_T. SRC0 (and SRC1 for OP_GLU) have a contiguous last dim and row strides stride0 / stride1."""
    pid = tl.program_id(0)
    pm = pid // n_col_tiles
    pn = pid - pm * n_col_tiles
    rows = (pm * BM + tl.arange(0, BM)).to(tl.int64)
    cols = pn * BN + tl.arange(0, BN)
    rmask = rows < n_rows
    cmask = cols < n_cols
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(SRC0 + rows[:, None] * stride0 + cols[None, :], mask=mask, other=0.0)
    if OP == 1:  # rms_norm's y = x * rstd * (w + offset), as its forward kernel computes it
        rstd = tl.load(ROWV + rows, mask=rmask, other=0.0)
        w = tl.load(COLV + cols, mask=cmask, other=0.0).to(tl.float32) + offset
        v = (x.to(tl.float32) * rstd[:, None] * w[None, :]).to(SRC0.dtype.element_ty).to(tl.float32)
    elif OP == 2:  # the GLU product act(a) * b
        b = tl.load(SRC1 + rows[:, None] * stride1 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        act, _ = _act_and_grad(x.to(tl.float32), ACTIVATION, False)
        v = (act * b).to(SRC0.dtype.element_ty).to(tl.float32)
    else:
        v = x.to(tl.float32)
    if AMAX:  # masked lanes hold 0 (act(0) * 0 = 0, 0 * rstd * w = 0)
        tl.store(PARTIAL + pid, tl.max(tl.max(tl.abs(v), axis=1), axis=0))
    else:
        q = tl.minimum(tl.maximum(v * tl.load(SCALE), -FP8_MAX), FP8_MAX)
        if INTERPRET:
            q = _round_to_fp8_grid(q, MANT, MIN_EXP)
        if WRITE:
            tl.store(OUT + rows[:, None] * n_cols + cols[None, :], q.to(OUT.dtype.element_ty), mask=mask)
        if WRITE_T:
            tl.store(OUT_T + cols[None, :] * ld_t + rows[:, None], q.to(OUT_T.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def _scale_kernel(PARTIAL, n, OUT, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr):
    """OUT[0] = float32(FP8_MAX / max(max(PARTIAL[:n]), 1e-12)) with the division in float64: :func:`fp8_scale` of
    the reduced maxima (``n`` may be 0: the maximum is then 0), one launch for what is otherwise five kernels."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(PARTIAL + offs, mask=offs < n, other=0.0))
    amax = tl.max(acc, axis=0).to(tl.float64)
    eps = tl.full((), AMAX_EPS_F64, tl.float64)
    tl.store(OUT, (tl.full((), FP8_MAX, tl.float64) / tl.maximum(amax, eps)).to(tl.float32))


def amax_scale(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`fp8_scale` of ``partial.max()`` (``partial``: maxima of |t| over parts of a tensor, float32,
    contiguous, possibly empty). Eagerly on the Triton path one kernel (:func:`_scale_kernel`); under torch.compile
    (where inductor fuses the reduction and the arithmetic) and on CPU without the interpreter, PyTorch ops."""
    if torch.compiler.is_compiling() or not use_triton(partial) or not partial.is_contiguous():
        return fp8_scale(partial.max() if partial.numel() else partial.new_zeros(()), dtype)
    out = torch.empty((), dtype=torch.float32, device=partial.device)
    block, warps = fp8_scale_plan(partial.device)
    _scale_kernel[(1,)](partial, partial.numel(), out, FP8_MAX=_FORMAT[dtype][0], BLOCK=block, num_warps=warps)
    return out


# ----------------------------------------------------------------------------------------------
# Launch wrapper
# ----------------------------------------------------------------------------------------------
@torch.compiler.assume_constant_result
def _plan(device: torch.device) -> tuple[int, int, int, bool]:
    """``(block_rows, block_cols, num_warps, interpreter)`` (a constant to torch.compile)."""
    return (*fp8_tile_plan(device), interpret_mode())


def _launch(op: int, src0: torch.Tensor, src1: torch.Tensor | None, rowv: torch.Tensor | None,
            colv: torch.Tensor | None, offset: float, activation: str, scale: torch.Tensor | None,
            dtype: torch.dtype | None, write: bool, write_t: bool, t_pad: int):
    """AMAX when ``scale`` is None (returns the per-tile maxima), else CAST (returns ``(out, out_t)``, each empty
    where not asked for; ``out_t`` has ``t_pad`` zero columns after the last row of the tensor).

    Under torch.compile the JIT kernel itself is called: dynamo records it as a user-defined Triton kernel, which
    inductor launches from its generated code with the amax reduction and scale arithmetic around it fused into
    its own kernels. (As ``torch.library`` custom ops the ~35 casts of a layer each paid the op dispatcher's host
    time: on an H100 the 1B step's GPU idled 27 ms of 130.)"""
    n_rows, n_cols = src0.shape
    bm, bn, warps, interpret = _plan(src0.device)
    n_col_tiles = cdiv(n_cols, bn)
    grid = (cdiv(n_rows, bm) * n_col_tiles,)
    amax = scale is None
    fmt = _FORMAT[dtype if dtype is not None else E4M3]
    partial = torch.empty(grid[0] if amax else 0, dtype=torch.float32, device=src0.device)
    out = torch.empty((n_rows, n_cols) if write and not amax else (0,), dtype=dtype or E4M3, device=src0.device)
    ld_t = n_rows + t_pad
    if write_t and not amax:
        out_t = torch.empty((n_cols, ld_t), dtype=dtype, device=src0.device)
        if t_pad:
            out_t[:, n_rows:].zero_()  # only the pad columns: the kernel writes the rest
    else:
        out_t = torch.empty(0, dtype=dtype or E4M3, device=src0.device)
    if n_rows * n_cols > 0:
        if not torch.compiler.is_compiling():
            kernel = _fp8_kernel
        else:  # (the interpreter, CPU tests only, cannot be traced: it runs outside the graph)
            kernel = _interpreted if interpret else _fp8_kernel.fn
        kernel[grid](
            src0, src1 if src1 is not None else src0, rowv if rowv is not None else partial,
            colv if colv is not None else partial, scale if scale is not None else partial, out, out_t, partial,
            n_rows, n_cols, src0.stride(0), (src1 if src1 is not None else src0).stride(0), ld_t, offset, n_col_tiles,
            OP=op, ACTIVATION=ACTIVATIONS[activation], AMAX=amax, WRITE=write, WRITE_T=write_t,
            FP8_MAX=fmt[0], MANT=fmt[1], MIN_EXP=fmt[2], INTERPRET=interpret, BM=bm, BN=bn, num_warps=warps,
        )
    elif amax:
        partial = torch.zeros(1, dtype=torch.float32, device=src0.device)
    return partial if amax else (out, out_t)


class _Interpreted:
    @torch.compiler.disable
    def __getitem__(self, grid):
        return torch.compiler.disable(_fp8_kernel[grid])


_interpreted = _Interpreted()


def _run(op, src0, src1, rowv, colv, offset, activation, dtype, scale, write, write_t, t_pad):
    if scale is None:
        scale = amax_scale(_launch(op, src0, src1, rowv, colv, offset, activation, None, None, False, False, 0), dtype)
    out, out_t = _launch(op, src0, src1, rowv, colv, offset, activation, scale, dtype, write, write_t, t_pad)
    return (out if write else None), (out_t if write_t else None), scale


# ----------------------------------------------------------------------------------------------
# Functional API (2-D tensors, last dim contiguous; float8 outputs contiguous)
# ----------------------------------------------------------------------------------------------
def _check(dtype: torch.dtype, *tensors: torch.Tensor) -> None:
    if dtype not in _DTYPES:
        raise ValueError(f"float8 dtype must be one of {_DTYPES}, got {dtype}")
    for t in tensors:
        if t.dim() != 2 or t.stride(-1) != 1:
            raise ValueError(f"expected a 2-D tensor with a contiguous last dim, got shape {tuple(t.shape)} "
                             f"strides {t.stride()}")
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"expected a floating-point tensor, got {t.dtype}")


def fp8_cast(t: torch.Tensor, dtype: torch.dtype, *, write: bool = True, write_t: bool = False,
             scale: torch.Tensor | None = None, t_pad: int = 0):
    """``(t8, t8_t, scale)``: 2-D ``t`` cast to float8 ``dtype``, tensorwise (``scale`` computed unless given),
    row-major if ``write`` and transposed (``(cols, rows + t_pad)``, the pad zero) if ``write_t``; None where not."""
    _check(dtype, t)
    return _run(OP_COPY, t, None, None, None, 0.0, "silu", dtype, scale, write, write_t, t_pad)


def norm_fp8(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float,
             dtype: torch.dtype = E4M3):
    """``(s, rstd, y8, scale)`` for ``y = rms_norm(s)`` (``s = x + residual``, or ``x``; ``s`` returned only with a
    residual) without writing ``y`` in 16 bits: the norm kernel reduces max |y| while it computes ``rstd``, then
    ``y`` is recomputed tile by tile and written as float8 (row-major)."""
    _check(dtype, x)
    fwd = _rms_norm_amax if torch.compiler.is_compiling() else _rms_norm_amax_impl
    row_amax, s, rstd = fwd(x, residual, weight, eps, offset)
    src = s if residual is not None else x
    scale = amax_scale(row_amax, dtype)
    y8, _, _ = _run(OP_NORM, src, None, rstd, weight, offset, "silu", dtype, scale, True, False, 0)
    return (s if residual is not None else None), rstd, y8, scale


def norm_fp8_t(x: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor, offset: float, scale: torch.Tensor,
               dtype: torch.dtype = E4M3, t_pad: int = 0) -> torch.Tensor:
    """``rms_norm(x)`` (from its saved ``rstd``) as float8 with ``scale``, transposed: ``(C, N + t_pad)``."""
    _check(dtype, x)
    return _run(OP_NORM, x, None, rstd, weight, offset, "silu", dtype, scale, False, True, t_pad)[1]


def glu_fp8(a: torch.Tensor, b: torch.Tensor, activation: str, dtype: torch.dtype = E4M3, *, write: bool = True,
            write_t: bool = False, scale: torch.Tensor | None = None, t_pad: int = 0):
    """``(h8, h8_t, scale)`` for ``h = act(a) * b`` (as :func:`fp8_cast` lays them out), ``h`` never written in 16
    bits."""
    _check(dtype, a, b)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    return _run(OP_GLU, a, b, None, None, 0.0, activation, dtype, scale, write, write_t, t_pad)

