"""lit-liger's fused norm->Linear and GLU-product recompute feeding torchao's float8 GEMMs (``LigerConfig.fp8``).

``LigerConfig.fp8`` turns the Block projections into torchao ``Float8Linear`` modules (:func:`_convert_fp8`, the second part of this file: which projections convert, the all-gather decision, the scales FSDP2 precomputes).
Such a module computes ``matmul_with_hp_or_float8_args``: its input and weight cast to float8 with the recipe's
scaling, one ``_scaled_mm``, and in backward the same for the two gradient GEMMs from the 16-bit input it saved.
Called as a module behind lit-liger's norm or GLU kernel, it keeps that 16-bit input (the normalized tensor, the
GLU product) for the whole step: the memory lit-liger's fused paths exist to save.

The two autograd functions here run the same torchao GEMM math (its autograd function's own ``forward`` and
``backward``, called with a context of ours, so every cast and GEMM is torchao's for the module's config) and keep
what lit-liger's 16-bit paths keep:

* :func:`norm_linear_fp8` -- ``rms_norm`` (optionally of ``x + residual``) feeding one or two float8 Linears
  (``qkv``; ``fc_1`` and ``fc_2``): saves the norm's input and ``rstd``, and recomputes the normalized tensor in
  backward with the same kernel (the same bits), as :func:`lit_liger.kernels.rms_norm.rms_norm_linear` does;
* :func:`glu_linear_fp8` -- ``proj(act(a) * b)`` with a float8 ``proj``: saves ``a`` and ``b``, and recomputes the
  product in backward, as :func:`lit_liger.kernels.swiglu.glu_linear` does.

In eager mode the kernels are called directly; under ``torch.compile`` they are lit-liger's custom ops (opaque) and
torchao's casts are traced around them, so inductor fuses the casts as it does for a plain ``Float8Linear``. The
backward's GEMM part is an ``allow_in_graph`` function: dynamo does not trace a foreign autograd function's
``backward`` called with another context.

The ``tensorwise`` recipe on plain 16-bit weights (:func:`tensorwise_fusable`) takes another path: lit-liger's own
casts (:mod:`lit_liger.kernels.float8`, torchao's tensorwise arithmetic bit for bit) and ``torch._scaled_mm`` called
as torchao calls it. Three autograd functions:
- ``_NormLinearTW``: norm_1 -> qkv;
- ``_NormMlpTW``: the whole MLP;
- ``_LinearTW``: any other converted Linear, through ``LigerFloat8Linear.forward``.

In these the normalized tensor and the GLU product exist only as float8: written by the norm's and the GLU's
arithmetic in forward, and transposed in backward with the forward's scale. See the "Tensorwise" section below."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from litgpt import lora as litgpt_lora, model as lm
from torch import nn

from ..kernels import float8 as _f8
from ..kernels._checks import as_rows
from ..kernels._launch import use_triton
from ..kernels.rms_norm import _rms_norm_bwd, _rms_norm_bwd_impl, _rms_norm_fwd, _rms_norm_fwd_impl
from ..kernels.swiglu import _glu_bwd, _glu_bwd_amax, _glu_bwd_amax_impl, _glu_bwd_impl, _glu_fwd, _glu_fwd_impl
from ._common import _called_plainly, _is_dtensor
from .report import _abbrev, LigerReport


__all__ = ["glu_linear_fp8", "is_float8_linear", "is_tensorwise", "linear_fp8", "liger_float8_linear_class",
           "norm_linear_fp8", "norm_mlp_fp8", "tensorwise_fusable"]


def is_float8_linear(m: nn.Module) -> bool:
    """A torchao ``Float8Linear`` that ``LigerConfig.fp8`` made, whose weight its GEMMs can read as it is: a plain
    16-bit Parameter (FSDP2's gathered one included) or, in eager mode, one of torchao's FSDP2 float8 all-gather
    (``LigerConfig.fp8_all_gather``): the 16-bit weight in its wrapper before ``fully_shard``, the float8 weight that
    FSDP2 gathered for this forward or backward, which the tensorwise functions below take without casting it
    (checked bit for bit against the 16-bit all-gather on CPU and on 2 GPUs; not under ``torch.compile``, where the
    module's forward runs). Not a DTensor (a Linear sharded or parallelized on its own) or a DeepSpeed partition: the
    module's own forward runs those."""
    if "_liger_fp8_orig" not in m.__dict__:
        return False
    w = m.weight
    if type(w) is nn.Parameter:
        return not hasattr(w, "ds_id")
    return (type(w).__name__ in ("Float8TrainingTensor", "WeightWithDynamicFloat8CastTensor")
            and not torch.compiler.is_compiling())


class _Ctx:
    """What torchao's ``matmul_with_hp_or_float8_args.forward`` / ``backward`` read and write on their context."""

    def __init__(self, saved=(), linear_mm_config=None, config=None):
        self.saved_tensors = saved
        self.linear_mm_config = linear_mm_config
        self.config = config

    def save_for_backward(self, *tensors):  # the forward's saves are dropped: lit-liger saves its own
        pass


def _mm_fn():
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    return matmul_with_hp_or_float8_args


def _fp8_forward(x: torch.Tensor, weight: torch.Tensor, linear_mm_config, config) -> torch.Tensor:
    """``x @ weight.t()`` as torchao's float8 Linear computes it (no bias)."""
    return _mm_fn().forward(_Ctx(), x, weight.t(), linear_mm_config, config)


@torch._dynamo.allow_in_graph
def _fp8_backward(x: torch.Tensor, weight: torch.Tensor, dout: torch.Tensor, linear_mm_config, config
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d x, d weight)`` of :func:`_fp8_forward` as torchao's backward computes them (its casts, its GEMMs)."""
    dx, dweight_t, _, _ = _mm_fn().backward(_Ctx((x, weight.t()), linear_mm_config, config), dout)
    return dx, dweight_t.t()


def _configs(linears: list[nn.Module]) -> tuple:
    return tuple((m.linear_mm_config, m.config) for m in linears)


class _NormLinearFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, norm_w, eps, offset, configs, *wb):
        compiling = torch.compiler.is_compiling()
        y, s, rstd = (_rms_norm_fwd if compiling else _rms_norm_fwd_impl)(x, residual, norm_w, eps, offset)
        outs = []
        for i, (mm_config, config) in enumerate(configs):
            w, b = wb[2 * i], wb[2 * i + 1]
            out = _fp8_forward(y, w, mm_config, config)
            outs.append(out + b.to(out.dtype) if b is not None else out)
        ctx.save_for_backward(s if residual is not None else x, norm_w, rstd, *wb)
        ctx.has_residual, ctx.norm, ctx.configs = residual is not None, (eps, offset), configs
        if residual is None:
            ctx.mark_non_differentiable(s)
        return s, *outs

    @staticmethod
    def backward(ctx, ds, *douts):
        compiling = torch.compiler.is_compiling()
        saved, norm_w, rstd, *wb = ctx.saved_tensors
        eps, offset = ctx.norm
        needs = ctx.needs_input_grad  # x, residual, norm_w, eps, offset, configs, w0, b0, (w1, b1)
        y = (_rms_norm_fwd if compiling else _rms_norm_fwd_impl)(saved, None, norm_w, eps, offset)[0]  # recomputed
        dy, grads_wb = None, []
        for i, (mm_config, config) in enumerate(ctx.configs):
            w, b, dout = wb[2 * i], wb[2 * i + 1], douts[i]
            if dout is None:
                grads_wb += [None, None]
                continue
            dx_i, dw = _fp8_backward(y, w, dout, mm_config, config)
            if dy is None:
                dy = dx_i  # a new tensor of torchao's GEMM: eagerly, the next one is added into it
            else:
                dy = dy + dx_i if compiling else dy.add_(dx_i)
            db = dout.reshape(-1, dout.shape[-1]).sum(0).to(b.dtype) if b is not None and needs[7 + 2 * i] else None
            grads_wb += [dw if needs[6 + 2 * i] else None, db]
        del y
        if dy is None:
            dy = torch.zeros_like(saved)
        need_dw = needs[2]
        bwd = _rms_norm_bwd if compiling else _rms_norm_bwd_impl
        dx, dnorm_w = bwd(dy, ds if ctx.has_residual else None, saved, norm_w, rstd, offset, need_dw)
        return (dx, dx if ctx.has_residual else None, dnorm_w if need_dw else None, None, None, None, *grads_wb)


def norm_linear_fp8(x: torch.Tensor, norm: nn.Module, linears: list[nn.Module], residual: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``(s, [linear(rms_norm(s)) for linear in linears])`` with ``s = x + residual`` (``None`` without a residual)
    for lit-liger's swapped RMSNorm ``norm`` and float8 ``linears`` (:func:`is_float8_linear`): the normalized tensor
    is not kept for backward (see the module docstring)."""
    wb = [t for m in linears for t in (m.weight, m.bias)]
    offset = 1.0 if norm.add_unit_offset else 0.0
    if tensorwise_fusable(x, *linears):
        s, *outs = _NormLinearTW.apply(x, residual, norm.weight, float(norm.eps), offset, *wb)
        return (s if residual is not None else None), outs
    s, *outs = _NormLinearFp8.apply(x, residual, norm.weight, float(norm.eps), offset, _configs(linears), *wb)
    return (s if residual is not None else None), outs


class _GluLinearFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, weight, bias, activation, mm_config, config):
        h = (_glu_fwd if torch.compiler.is_compiling() else _glu_fwd_impl)(a, b, activation)
        out = _fp8_forward(h, weight, mm_config, config)
        ctx.save_for_backward(a, b, weight)  # not the product h: recomputed in backward
        ctx.activation, ctx.configs, ctx.has_bias = activation, (mm_config, config), bias is not None
        return out + bias.to(out.dtype) if bias is not None else out

    @staticmethod
    def backward(ctx, dout):
        compiling = torch.compiler.is_compiling()
        a, b, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        h = (_glu_fwd if compiling else _glu_fwd_impl)(a, b, ctx.activation)  # the same kernel: the same bits
        dh, dw = _fp8_backward(h, weight, dout, *ctx.configs)
        del h
        da, db = (_glu_bwd if compiling else _glu_bwd_impl)(dh, a, b, ctx.activation, needs[0], needs[1])
        dbias = dout.reshape(-1, dout.shape[-1]).sum(0) if ctx.has_bias and needs[3] else None
        return (da if needs[0] else None), (db if needs[1] else None), (dw if needs[2] else None), dbias, \
            None, None, None


def glu_linear_fp8(a: torch.Tensor, b: torch.Tensor, proj: nn.Module, activation: str) -> torch.Tensor:
    """``proj(act(a) * b)`` for a float8 ``proj`` (:func:`is_float8_linear`), the product not kept for backward."""
    if tensorwise_fusable(a, proj):
        return _GluLinearTW.apply(a, b, proj.weight, proj.bias, activation)
    return _GluLinearFp8.apply(a, b, proj.weight, proj.bias, activation, proj.linear_mm_config, proj.config)


# ----------------------------------------------------------------------------------------------
# Tensorwise: lit-liger's own casts (``kernels.float8``) and torch._scaled_mm, torchao's arithmetic
# ----------------------------------------------------------------------------------------------
def is_tensorwise(config) -> bool:
    """``config`` is torchao's ``tensorwise`` recipe (its float8 all-gather switch aside): the one the kernels of
    ``kernels.float8`` and the GEMM calls below reproduce (e4m3 inputs and weights, e5m2 output gradients, dynamic
    tensorwise scales not rounded to powers of 2, fast accumulation in the output GEMM only, no padding)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    return dataclasses.replace(config, enable_fsdp_float8_all_gather=False) == Float8LinearConfig()


def tensorwise_fusable(x: torch.Tensor, *linears: nn.Module) -> bool:
    """These float8 Linears (:func:`is_float8_linear`) run on lit-liger's own tensorwise casts: torchao's
    ``tensorwise`` recipe (:func:`is_tensorwise`, recorded at conversion), weights in ``x``'s dtype that are plain
    16-bit Parameters or, in eager mode, the float8 weights FSDP2 gathered (:func:`_gathered8`; not torchao's
    float8 all-gather wrapper itself, before ``fully_shard`` or in one process, whose cast torchao does), ``x`` on the
    Triton path (a GPU, or the interpreter)."""
    return (use_triton(x) and x.dtype in (torch.bfloat16, torch.float16)
            and all((type(m.weight) is nn.Parameter or _gathered8(m.weight)) and m.weight.dtype == x.dtype
                    and m.__dict__.get("_liger_tensorwise", False) for m in linears))


def _gathered8(w: torch.Tensor) -> bool:
    """``w`` is a float8 weight FSDP2 gathered with torchao's float8 all-gather (``LigerConfig.fp8_all_gather``), in
    eager mode: torchao's ``Float8TrainingTensor`` whose e4m3 data is the whole weight cast with its tensorwise scale
    on the shards (the same bits as casting the gathered 16-bit weight). The GEMMs below take its data and scale as
    they are: no cast of the weight here, and its transpose for the input gradient is a copy of the data. Under
    ``torch.compile`` torchao's own forward runs such weights (:func:`is_float8_linear`)."""
    return (type(w).__name__ == "Float8TrainingTensor" and not torch.compiler.is_compiling()
            and w._data.dtype == torch.float8_e4m3fn and w._data.dim() == 2 and w._scale.numel() == 1)


def _pad16(n_rows: int) -> int:
    """Zero columns after the tokens in a transposed float8 operand: the weight gradient's GEMM sums over the tokens,
    and ``torch._scaled_mm`` needs its inner size a multiple of 16."""
    return -n_rows % 16


def _mm(a8, b8_t, sa, sb, dtype, fast):
    """``a @ b`` from float8 ``a8`` (row-major) and ``b8_t`` (``b`` transposed, row-major), torchao's GEMM call."""
    return torch._scaled_mm(a8, b8_t.t(), scale_a=sa.reciprocal(), scale_b=sb.reciprocal(), out_dtype=dtype,
                            use_fast_accum=fast)


def _weights8(weights) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(w8, scale)]`` for the weights of a forward, cast once, row-major (the input gradient's transposed copy is
    :func:`_weight8_t`'s). A weight FSDP2 gathered in float8 (:func:`_gathered8`) is taken as it is."""
    return [(w._data, w._scale) if _gathered8(w) else _f8.fp8_cast(w, _f8.E4M3, write=True)[0::2] for w in weights]


def _weight8_t(weight: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight transposed in float8, its scale)`` for an input gradient: cast with the forward's scale, or, for a
    weight FSDP2 gathered in float8 (gathered again for the backward), its data transposed with its own scale."""
    if _gathered8(weight):
        return weight._data.t().contiguous(), weight._scale
    return _f8.fp8_cast(weight, _f8.E4M3, write=False, write_t=True, scale=w_scale)[1], w_scale


def _grad_gemms(dout: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor, x8_t, x_scale, need_dx: bool,
                need_dw: bool, pad: int, g_scale: torch.Tensor | None = None):
    """``(dx, dw)`` of ``out = x @ weight.t()`` (float8 tensorwise): ``dout`` cast once to e5m2 in both layouts (its
    scale computed, unless ``g_scale`` is given), the weight's transposed float8 from its forward scale, ``x8_t``
    (``(in, tokens + pad)``) for the weight gradient."""
    g2 = as_rows(dout)
    g8, g8_t, g_scale = _f8.fp8_cast(g2, _f8.E5M2, write=need_dx, write_t=need_dw, t_pad=pad, scale=g_scale)
    dx = dw = None
    if need_dx:
        w8_t, w_scale = _weight8_t(weight, w_scale)
        dx = _mm(g8, w8_t, g_scale, w_scale, dout.dtype, False)
        del g8, w8_t  # (not held through the next GEMM)
    if need_dw:
        dw = _mm(g8_t, x8_t, g_scale, x_scale, weight.dtype, False)
    return dx, dw


def _bias_grad(dout: torch.Tensor, b: torch.Tensor | None, need: bool):
    return dout.reshape(-1, dout.shape[-1]).sum(0).to(b.dtype) if b is not None and need else None


def _out(out2: torch.Tensor, lead: torch.Size, bias: torch.Tensor | None) -> torch.Tensor:
    out = out2.view(*lead, out2.shape[-1])
    return out + bias.to(out.dtype) if bias is not None else out


class _NormLinearTW(torch.autograd.Function):
    """:func:`norm_linear_fp8` on lit-liger's casts: the normalized tensor is written once, as float8, by the norm's
    own arithmetic (``kernels.float8.norm_fp8``), and again in backward, transposed, from the saved input and
    ``rstd`` with the forward's scale (``norm_fp8_t``): never in 16 bits."""

    @staticmethod
    def forward(ctx, x, residual, norm_w, eps, offset, *wb):
        x2 = as_rows(x)
        s2, rstd, y8, y_scale = _f8.norm_fp8(x2, as_rows(residual) if residual is not None else None, norm_w, eps,
                                             offset)
        weights, biases = wb[0::2], wb[1::2]
        casts = _weights8(weights)
        outs = [_out(_mm(y8, w8, y_scale, w_scale, x.dtype, True), x.shape[:-1], b)
                for (w8, w_scale), b in zip(casts, biases)]
        saved = s2 if residual is not None else x2
        ctx.save_for_backward(saved, norm_w, rstd, y_scale, *weights, *(c[1] for c in casts), *biases)
        ctx.has_residual, ctx.norm, ctx.n, ctx.x_shape = residual is not None, (eps, offset), len(weights), x.shape
        s = s2.view(x.shape) if residual is not None else x.new_empty(0)
        if residual is None:
            ctx.mark_non_differentiable(s)
        return s, *outs

    @staticmethod
    def backward(ctx, ds, *douts):
        compiling = torch.compiler.is_compiling()
        saved, norm_w, rstd, y_scale, *rest = ctx.saved_tensors
        n = ctx.n
        weights, w_scales, biases = rest[:n], rest[n:2 * n], rest[2 * n:]
        eps, offset = ctx.norm
        needs = ctx.needs_input_grad  # x, residual, norm_w, eps, offset, w0, b0, (w1, b1)
        pad = _pad16(saved.shape[0])
        need_dw = [douts[i] is not None and needs[5 + 2 * i] for i in range(n)]
        y8_t = _f8.norm_fp8_t(saved, rstd, norm_w, offset, y_scale, t_pad=pad) if any(need_dw) else None
        dy, grads_wb = None, []
        for i in range(n):
            if douts[i] is None:
                grads_wb += [None, None]
                continue
            dx_i, dw = _grad_gemms(douts[i], weights[i], w_scales[i], y8_t, y_scale, True, need_dw[i], pad)
            dy = dx_i if dy is None else (dy + dx_i if compiling else dy.add_(dx_i))
            grads_wb += [dw, _bias_grad(douts[i], biases[i], needs[6 + 2 * i])]
        del y8_t
        if dy is None:
            dy = torch.zeros_like(saved)
        bwd = _rms_norm_bwd if compiling else _rms_norm_bwd_impl
        dx, dnorm_w = bwd(dy, as_rows(ds) if ctx.has_residual else None, saved, norm_w, rstd, offset, needs[2])
        dx = dx.view(ctx.x_shape)
        return (dx, dx if ctx.has_residual else None, dnorm_w if needs[2] else None, None, None, *grads_wb)


class _GluLinearTW(torch.autograd.Function):
    """:func:`glu_linear_fp8` on lit-liger's casts: the GLU product written as float8 by the GLU's arithmetic
    (``kernels.float8.glu_fp8``) in forward, and transposed in backward from ``a`` and ``b``: never in 16 bits."""

    @staticmethod
    def forward(ctx, a, b, weight, bias, activation):
        a2, b2 = as_rows(a), as_rows(b)
        h8, _, h_scale = _f8.glu_fp8(a2, b2, activation)
        ((w8, w_scale),) = _weights8([weight])
        ctx.save_for_backward(a2, b2, weight, h_scale, w_scale, bias)
        ctx.activation, ctx.shape = activation, a.shape
        return _out(_mm(h8, w8, h_scale, w_scale, a.dtype, True), a.shape[:-1], bias)

    @staticmethod
    def backward(ctx, dout):
        compiling = torch.compiler.is_compiling()
        a2, b2, weight, h_scale, w_scale, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad
        pad = _pad16(a2.shape[0])
        h8_t = _f8.glu_fp8(a2, b2, ctx.activation, write=False, write_t=True, scale=h_scale, t_pad=pad)[1] \
            if needs[2] else None
        dh, dw = _grad_gemms(dout, weight, w_scale, h8_t, h_scale, True, needs[2], pad)
        del h8_t
        da, db = (_glu_bwd if compiling else _glu_bwd_impl)(dh, a2, b2, ctx.activation, needs[0], needs[1])
        shape = ctx.shape
        return (da.view(shape) if needs[0] else None), (db.view(shape) if needs[1] else None), dw, \
            _bias_grad(dout, bias, needs[3]), None


def frozen_base_fp8(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x2 @ weight.t() + bias, weight's scale)`` for the frozen float8 tensorwise base Linear of a LoRA layer
    (:func:`lit_liger.swap.lora.lora_linear`), on lit-liger's casts: the output is a fresh ``(N, out)`` tensor, into which
    the LoRA update is then accumulated; :func:`frozen_base_fp8_dx` is its input gradient."""
    x8, _, x_scale = _f8.fp8_cast(x2, _f8.E4M3, write=True)
    ((w8, w_scale),) = _weights8([weight])
    y = _mm(x8, w8, x_scale, w_scale, x2.dtype, True)
    return (y.add_(bias.to(y.dtype)) if bias is not None else y), w_scale


def frozen_base_fp8_dx(dy2: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """``dy2 @ weight`` of :func:`frozen_base_fp8` (``dy2`` cast to e5m2, the weight transposed with its forward
    scale), as torchao's tensorwise recipe computes a Linear's input gradient."""
    return _grad_gemms(dy2, weight, w_scale, None, None, True, False, 0)[0]


def _keep_x() -> bool:
    """:class:`_LinearTW` keeps its 16-bit input for backward (under ``torch.compile``), not a float8 copy."""
    return torch.compiler.is_compiling()


class _LinearTW(torch.autograd.Function):
    """A float8 Linear's ``x @ w.t() + b`` on lit-liger's casts (the attention's ``proj``, a LoRA layer's frozen base,
    a projection outside the fused paths): ``x`` cast once, row-major for the forward GEMM and, where the weight
    needs a gradient, transposed; that float8 copy is what backward keeps of ``x`` (half of ``x``'s bytes).

    Under ``torch.compile`` backward keeps ``x`` itself and casts it transposed there (with the forward's scale: the
    same bits). The partitioner can then rebuild ``x`` from what it keeps anyway: the attention's ``proj`` input is a
    transposed copy of the attention output, which the attention's backward keeps. Keeping the float8 copy there
    cost 32 MiB per layer at Llama-3.1-8B widths, B2 x T4096 (``h100-2026-11-26d``)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = as_rows(x)
        need_dw = ctx.needs_input_grad[1]
        pad = _pad16(x2.shape[0])
        ctx.x_later = _keep_x()  # x kept, its transposed cast made in backward
        x8, x8_t, x_scale = _f8.fp8_cast(x2, _f8.E4M3, write=True, write_t=need_dw and not ctx.x_later, t_pad=pad)
        ((w8, w_scale),) = _weights8([weight])
        ctx.save_for_backward(x2 if ctx.x_later and need_dw else x8_t, x_scale, weight, w_scale, bias)
        ctx.pad, ctx.x_shape = pad, x.shape
        return _out(_mm(x8, w8, x_scale, w_scale, x.dtype, True), x.shape[:-1], bias)

    @staticmethod
    def backward(ctx, dout):
        kept, x_scale, weight, w_scale, bias = ctx.saved_tensors  # kept: x8_t, or x itself (ctx.x_later)
        needs = ctx.needs_input_grad
        x8_t = _f8.fp8_cast(kept, _f8.E4M3, write=False, write_t=True, t_pad=ctx.pad, scale=x_scale)[1] \
            if ctx.x_later and needs[1] else kept
        dx, dw = _grad_gemms(dout, weight, w_scale, x8_t, x_scale, needs[0], needs[1], ctx.pad)
        return (dx.view(ctx.x_shape) if needs[0] else None), dw, _bias_grad(dout, bias, needs[2])


class _NormMlpTW(torch.autograd.Function):
    """``proj(act(fc_1(y)) * fc_2(y))`` with ``y = rms_norm(x + residual)``, all three float8 tensorwise, as one
    function: :class:`_NormLinearTW` and :class:`_GluLinearTW` in one, whose backward also has the GLU backward
    kernel reduce max |da| and max |db| while it writes them (``swiglu._glu_bwd_amax``), so that the two largest
    gradients of the layer are cast to float8 without a pass of their own over them."""

    @staticmethod
    def forward(ctx, x, residual, norm_w, eps, offset, activation, w1, bias1, w2, bias2, w3, bias3):
        x2, r2 = as_rows(x), as_rows(residual)
        s2, rstd, y8, y_scale = _f8.norm_fp8(x2, r2, norm_w, eps, offset)
        (w1_8, s1), (w2_8, s2w), (w3_8, s3) = _weights8([w1, w2, w3])
        lead = x.shape[:-1]
        a = _out(_mm(y8, w1_8, y_scale, s1, x.dtype, True), lead, bias1)
        b = _out(_mm(y8, w2_8, y_scale, s2w, x.dtype, True), lead, bias2)
        del y8, w1_8, w2_8
        a2, b2 = as_rows(a), as_rows(b)
        h8, _, h_scale = _f8.glu_fp8(a2, b2, activation)
        out = _out(_mm(h8, w3_8, h_scale, s3, x.dtype, True), lead, bias3)
        ctx.save_for_backward(s2, norm_w, rstd, y_scale, a2, b2, h_scale, w1, w2, w3, s1, s2w, s3, bias1, bias2, bias3)
        ctx.norm, ctx.activation, ctx.x_shape = (eps, offset), activation, x.shape
        return s2.view(x.shape), out

    @staticmethod
    def backward(ctx, ds, dout):
        compiling = torch.compiler.is_compiling()
        saved, norm_w, rstd, y_scale, a2, b2, h_scale, w1, w2, w3, s1, s2w, s3, bias1, bias2, bias3 = ctx.saved_tensors
        eps, offset = ctx.norm
        needs = ctx.needs_input_grad  # x, residual, norm_w, eps, offset, activation, w1, bias1, w2, bias2, w3, bias3
        pad = _pad16(saved.shape[0])
        h8_t = _f8.glu_fp8(a2, b2, ctx.activation, write=False, write_t=True, scale=h_scale, t_pad=pad)[1] \
            if needs[10] else None
        dh, dw3 = _grad_gemms(dout, w3, s3, h8_t, h_scale, True, needs[10], pad)
        del h8_t
        da, db, amax = (_glu_bwd_amax if compiling else _glu_bwd_amax_impl)(dh, a2, b2, ctx.activation)
        del dh
        g_scales = _f8.fp8_scale(amax, _f8.E5M2) if compiling else \
            [_f8.amax_scale(amax[i:i + 1], _f8.E5M2) for i in range(2)]
        y8_t = _f8.norm_fp8_t(saved, rstd, norm_w, offset, y_scale, t_pad=pad) if needs[6] or needs[8] else None
        dy, dw1 = _grad_gemms(da, w1, s1, y8_t, y_scale, True, needs[6], pad, g_scales[0])
        dy_2, dw2 = _grad_gemms(db, w2, s2w, y8_t, y_scale, True, needs[8], pad, g_scales[1])
        del y8_t
        dy = dy + dy_2 if compiling else dy.add_(dy_2)
        del dy_2
        bwd = _rms_norm_bwd if compiling else _rms_norm_bwd_impl
        dx, dnorm_w = bwd(dy, as_rows(ds), saved, norm_w, rstd, offset, needs[2])
        dx = dx.view(ctx.x_shape)
        return (dx, dx, dnorm_w if needs[2] else None, None, None, None, dw1, _bias_grad(da, bias1, needs[7]), dw2,
                _bias_grad(db, bias2, needs[9]), dw3, _bias_grad(dout, bias3, needs[11]))


def norm_mlp_fp8(x: torch.Tensor, residual: torch.Tensor, norm: nn.Module, mlp: nn.Module, activation: str
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, mlp(rms_norm(s)))`` with ``s = x + residual`` for a GLU MLP whose three Linears :func:`tensorwise_fusable`
    takes (the caller checks): :class:`_NormMlpTW`."""
    fc_1, fc_2, proj = mlp.fc_1, mlp.fc_2, mlp.proj
    return _NormMlpTW.apply(x, residual, norm.weight, float(norm.eps), 1.0 if norm.add_unit_offset else 0.0,
                            activation, fc_1.weight, fc_1.bias, fc_2.weight, fc_2.bias, proj.weight, proj.bias)


def linear_fp8(x: torch.Tensor, m: nn.Module) -> torch.Tensor:
    """``m(x)`` for a float8 Linear ``m`` that :func:`tensorwise_fusable` takes, on lit-liger's casts."""
    return _LinearTW.apply(x, m.weight, m.bias)


_LIGER_FLOAT8_LINEAR = []


def liger_float8_linear_class() -> type:
    """torchao's ``Float8Linear`` whose forward runs on lit-liger's casts (:func:`linear_fp8`) where
    :func:`tensorwise_fusable` takes it (the ``tensorwise`` recipe on a GPU), and is torchao's forward elsewhere (the
    rowwise recipes, torchao's FSDP2 float8 all-gather weights, CPU tensors): the class ``LigerConfig.fp8`` gives the
    projections it converts."""
    if not _LIGER_FLOAT8_LINEAR:
        from torchao.float8.float8_linear import Float8Linear

        class LigerFloat8Linear(Float8Linear):
            def forward(self, input: torch.Tensor) -> torch.Tensor:
                if tensorwise_fusable(input, self) and not torch.is_autocast_enabled(input.device.type):
                    return linear_fp8(input, self)
                return super().forward(input)

        _LIGER_FLOAT8_LINEAR.append(LigerFloat8Linear)
    return _LIGER_FLOAT8_LINEAR[0]


def _fp8_fusable(x: torch.Tensor, *linears: nn.Module) -> bool:
    """lit-liger's fused norm->Linear / GLU-product paths may call these float8 Linears' GEMMs themselves
    (``lit_liger.swap.fp8``): the Triton path, no autocast, weights in ``x``'s dtype, no hooks on the modules."""
    return (use_triton(x) and not torch.is_autocast_enabled(x.device.type)
            and all(m.weight.dtype == x.dtype for m in linears) and _called_plainly(*linears))


#: below this many tokens in a training micro-batch ``LigerConfig.fp8`` warns (once) that float8 is likely slower than
#: bf16 there. Measured on an H100 (Llama-3.2-1B): 1.16x lit-liger + compile in bf16 at 8,192 tokens per micro-batch
#: (B4 x T2048); against lit-liger bf16 in litgpt's recipes, 0.78x (LoRA) and 0.74x (full fine-tuning) at micro-batch
#: 4 of Alpaca-length samples (~800 tokens), 0.71x (LoRA) at micro-batch 1, where casting every weight at each step
#: costs more than the smaller GEMMs save (``benchmarks/results/h100-2026-11-26d``). Between the two, not measured.
FP8_SMALL_TOKENS = 4096


def _warn_fp8_small(gpt: nn.Module, n_tokens: int) -> None:
    """Once per model: a training micro-batch of ``n_tokens`` < :data:`FP8_SMALL_TOKENS` with ``LigerConfig.fp8``."""
    gpt._liger_fp8_small_warning = False
    import warnings

    warnings.warn(
        f"lit-liger: fp8 with {n_tokens} tokens in a training micro-batch. Float8 GEMMs pay off at large ones: on an "
        "H100, Llama-3.2-1B ran 1.16x bf16 at 8,192 tokens per micro-batch, but 0.78x (LoRA) and 0.74x (full "
        "fine-tuning) in litgpt's recipes at ~800, where casting every weight at each step costs more than the GEMMs "
        "save (benchmarks/results/h100-2026-11-26d). Leave fp8 off for small micro-batches, or measure yours.",
        stacklevel=3)


def _warn_fp8_eager(gpt: nn.Module) -> None:
    """Once per model: ``LigerConfig.fp8`` trains without ``torch.compile`` where torchao casts (a rowwise recipe),
    which is slow eagerly. The tensorwise recipe runs on lit-liger's own casts (FSDP2's float8 all-gather and DeepSpeed
    ZeRO-3 partitions included), fast in eager mode too, and does not warn."""
    gpt._liger_fp8_eager_warning = False
    import warnings

    warnings.warn(
        "lit-liger: fp8 is training without torch.compile. Here torchao's float8 casts run (a rowwise recipe), as "
        "several separate kernels eagerly: on an H100 this measured "
        "0.40-0.55x the speed of bf16 with torch.compile, slower than lit-liger in bf16 "
        "(benchmarks/results/h100-2026-11-25e). Compile the model, use fp8=tensorwise (lit-liger's own casts, fast "
        "eagerly: benchmarks/results/h100-2026-11-26c), or leave fp8 off.", stacklevel=3)


#: the Block projections ``LigerConfig.fp8`` runs in float8 (their paths inside a Block)
FP8_PROJECTIONS = ("attn.qkv", "attn.proj", "mlp.fc_1", "mlp.fc_2", "mlp.proj")


def fp8_why(recipe: str) -> str | None:
    """Why float8 training cannot run here (torchao missing, a GPU without float8 tensor cores), or None."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return f"fp8={recipe!r} needs torchao: pip install 'lit-liger[fp8]'"
    if torch.cuda.is_available():
        if torch.version.hip is not None:
            return "float8 training on AMD GPUs is not supported by lit-liger yet (not measured)"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            return f"this GPU (sm_{major}{minor}) has no float8 tensor cores (sm_89 and newer: Ada, Hopper, Blackwell)"
    return None


#: inside ``LigerCallback``'s swap: (the Trainer's strategy shards with FSDP2, its class name), for
#: ``LigerConfig.fp8_all_gather``'s automatic choice (:func:`fp8_all_gather_why`): a call's context (set and unset
#: around one ``apply_liger`` call by :func:`wrapping_strategy`), not a run's state
_WRAPPING_STRATEGY: list[tuple[bool, str]] = []


@contextlib.contextmanager
def wrapping_strategy(fsdp2: bool, name: str) -> Iterator[None]:
    """``apply_liger`` calls inside know which strategy wraps the model next (``LigerCallback`` says so)."""
    _WRAPPING_STRATEGY.append((fsdp2, name))
    try:
        yield
    finally:
        _WRAPPING_STRATEGY.pop()


#: ``fp8_all_gather``'s automatic choice under FSDP2 on one host, and why (h200x2-2026-11-26b)
ONE_HOST_WHY = ("all processes on one host, where FSDP2's 16-bit all-gather measured faster (2 x H200, 8B widths: "
                "1.22x stock against 1.11x with float8 all-gather; LoRA at 1B widths: 0.93x of it): the all-gathers "
                "overlap the compute over NVLink and torchao's cast of each shard costs more than the halved bytes "
                "save; fp8_all_gather true to gather float8")


def fp8_all_gather_why(recipe: str, setting: bool | None, weight: torch.Tensor) -> tuple[bool, str]:
    """Whether the float8 projections' weights (``weight``: one of them, as found) get torchao's FSDP2 float8 all-gather
    (``LigerConfig.fp8_all_gather``), and why. torchao wraps each weight in ``WeightWithDynamicFloat8CastTensor``, which
    ``fully_shard`` (FSDP2) must find when it shards: only FSDP2 gathers it in float8, only for tensorwise scaling."""
    if setting is False:
        return False, "fp8_all_gather false"
    if recipe != "tensorwise":
        return False, f"torchao gathers float8 weights for the tensorwise recipe only, not {recipe!r}"
    if hasattr(weight, "ds_id"):
        return False, ("DeepSpeed ZeRO-3 partitions: DeepSpeed gathers them in 16 bits, the GEMMs cast after (torchao "
                       "gathers float8 weights under FSDP2 only)")
    if _is_dtensor(weight):
        return False, ("the weights were sharded before apply_liger (it must run before fully_shard): FSDP gathers "
                       "them in 16 bits, the GEMMs cast after")
    if setting:
        return True, "fp8_all_gather true"
    from .._dist import one_host, several_processes

    if not several_processes():
        return False, "one process"
    if _WRAPPING_STRATEGY:
        fsdp2, name = _WRAPPING_STRATEGY[-1]
        if fsdp2:
            return (False, ONE_HOST_WHY) if one_host() else (True, f"the Trainer's {name} shards with FSDP2")
        return False, f"the Trainer's {name}: torchao gathers float8 weights under FSDP2 (ModelParallelStrategy) only"
    try:
        from torch.distributed.fsdp.wrap import _ConfigAutoWrap  # (FSDP1's enable_wrap: Fabric's FSDPStrategy
    except ImportError:                                            # builds its model inside it)
        _ConfigAutoWrap = None
    if getattr(_ConfigAutoWrap, "in_autowrap_context", False):
        return False, "FSDP1 (FSDPStrategy): torchao gathers float8 weights under FSDP2 only"
    if weight.is_meta:
        if one_host():
            return False, ONE_HOST_WHY
        return True, ("a multi-process model built on the meta device outside FSDP1: FSDP2 (Fabric's "
                      "ModelParallelStrategy) shards it")
    return False, ("several processes, but not known to shard with FSDP2 next (fp8_all_gather true if fully_shard "
                   "follows)")


def _float8_all_gather_weight(w: torch.Tensor) -> bool:
    """A weight torchao's FSDP2 float8 all-gather wrapped, sharded by ``fully_shard`` or not."""
    w = w._local_tensor if _is_dtensor(w) else w
    return type(w).__name__ == "WeightWithDynamicFloat8CastTensor"


def _convert_fp8(pre: str, gpt: lm.GPT, recipe: str, report: LigerReport, all_gather: bool | None = None,
                 prior: dict[int, tuple] | None = None) -> None:
    """``LigerConfig.fp8``: the Block projections (a LoRA layer's frozen base Linear) become torchao ``Float8Linear``
    modules in place: each Linear's class changes to ``Float8Linear`` and it gains that class's attributes (its config),
    the same module object with the same Parameters, so that FSDP / DeepSpeed bookkeeping made before still points at
    it (:func:`remove_liger` changes them back). With ``fp8_all_gather`` (:func:`fp8_all_gather_why`) each weight
    becomes a new Parameter of torchao's ``WeightWithDynamicFloat8CastTensor`` around the old one (build the optimizer
    after ``apply_liger``). Projections whose sizes float8 GEMMs cannot take (not multiples of 16) stay.

    ``prior``: a previous ``apply_liger``'s all-gather decisions, by module (:func:`_fp8_decisions`). Applied again
    after ``fully_shard`` sharded what the first application converted (``LigerCallback`` applies in ``setup`` and
    again after ``configure_model``), the report gives the first decision's reason, not the order."""
    why = fp8_why(recipe)
    if why is not None:
        report.skip(pre.rstrip("."), gpt, f"fp8 off: {why}; the model stays in 16 bits")
        return
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    targets, odd, kept = [], [], []
    for i, block in enumerate(gpt.transformer.h):
        for path in FP8_PROJECTIONS:
            parent_path, _, name = path.rpartition(".")
            m = getattr(getattr(block, parent_path, None), name, None)  # (in "attn" / "mlp")
            if isinstance(m, litgpt_lora.LoRALinear):  # (LoRAQKVLinear too) the frozen base; the adapters stay 16-bit
                m, name = m.linear, "linear"
            full = f"{pre}transformer.h.{i}.{path}" + (".linear" if name == "linear" else "")
            if isinstance(m, Float8Linear) and "_liger_fp8_orig" in m.__dict__:
                targets.append((full, None))  # left converted by _restore_fp8: its float8 weights are sharded
                kept.append(m)
            elif type(m) is not nn.Linear:
                continue  # quantized (bitsandbytes), or no such projection (MoE experts)
            elif m.in_features % 16 or m.out_features % 16:
                odd.append(full)
            else:
                targets.append((full, m))
    if targets:
        first = next((m for _, m in targets if m is not None), None)
        ag, ag_why = (True, "its weights are already sharded in float8") if first is None else \
            fp8_all_gather_why(recipe, all_gather, first.weight)
        before = (prior or {}).get(id(first if first is not None else kept[0]))
        shown = ag_why
        if before is not None and (before[0], before[2]) == (ag, all_gather) and \
                (first is None or _is_dtensor(first.weight)):
            ag_why = before[1]  # (what the first application decided, before fully_shard sharded it that way)
            shown = f"{ag_why} (decided when apply_liger first ran, before fully_shard)"
        config = Float8LinearConfig.from_recipe_name(recipe)
        if ag and first is not None:
            import dataclasses

            config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
        for _, m in targets:
            if m is not None:
                _to_float8(m, Float8Linear.from_float(m, config=config))
        for m in [m for _, m in targets if m is not None] + kept:
            m.__dict__["_liger_fp8_ag"] = (ag, ag_why, all_gather)  # (read by the next apply_liger: _fp8_decisions)
        # eager is slow where torchao casts (the rowwise recipes); tensorwise runs on lit-liger's casts: FSDP2's
        # float8-gathered weights (lit_liger.swap.fp8._gathered8) and DeepSpeed ZeRO-3 partitions (each projection's own
        # forward, its weight gathered by DeepSpeed's module hook) included: on 2 GPUs none of their GEMMs is torchao's
        gpt._liger_fp8_eager_warning = recipe != "tensorwise"
        gpt._liger_fp8_small_warning = True  # (see _warn_fp8_small)
        fed = ("each in its own forward (DeepSpeed ZeRO-3 partitions, gathered in their modules' hooks: the fused "
               "norm->Linear and GLU paths do not take them)" if first is not None and hasattr(first.weight, "ds_id")
               else "fed by lit-liger's fused norm->Linear and GLU-product recompute (lit_liger.swap.fp8)")
        report.swapped.append((
            _abbrev([p for p, _ in targets]), "Linear",
            f"float8 GEMMs, torchao's {recipe!r} recipe (fp8): {len(targets)} projections, {fed}; FSDP2 float8 "
            f"all-gather {'on' if ag else 'off'}: {shown}"))
    if odd:
        report.skip(_abbrev(odd), gpt, "fp8: sizes not multiples of 16 (float8 GEMMs need them): kept in 16 bits")


def _to_float8(m: nn.Linear, template: nn.Module) -> None:
    """Make the Linear ``m`` the ``Float8Linear`` ``template`` (torchao's ``from_float`` of ``m``) in place."""
    added = tuple(k for k in vars(template) if k not in vars(m))  # (its config, scaling types, GEMM configs)
    for k in added:
        m.__dict__[k] = template.__dict__[k]
    m.__dict__["_liger_fp8_orig"] = (type(m), (*added, "_liger_tensorwise", "_liger_fp8_ag"))  # (_restore_fp8 undoes)
    m.__dict__["_liger_tensorwise"] = is_tensorwise(template.config)  # (read by fp8.tensorwise_fusable)
    m.__class__ = liger_float8_linear_class()  # torchao's Float8Linear, on lit-liger's casts where they apply
    if template.weight is not m.weight:
        m.weight = template.weight  # torchao's float8 all-gather wrapper around it


def precompute_fp8_scales(model: nn.Module, clear: bool = False) -> int:
    """After an optimizer step, with FSDP2's float8 all-gather (``LigerConfig.fp8_all_gather``): compute the scales of
    every sharded float8 weight in ``model`` for its next all-gathers, with one all-reduce (torchao's
    ``precompute_float8_dynamic_scale_for_fsdp``; a collective: every rank calls it). Without it each all-gather
    computes its weight's scale with an all-reduce of its own; the scales are the same. A weight changed after this
    call (another optimizer step, a checkpoint loaded) needs another call, or ``clear=True``: back to computing them in
    each all-gather (no collective). Returns how many weights it covered."""
    weights = [m.weight for m in model.modules() if "_liger_fp8_orig" in m.__dict__ and _is_dtensor(m.weight)
               and _float8_all_gather_weight(m.weight)]
    if clear:
        for w in weights:
            w._local_tensor._precomputed_scale = None
    elif weights:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)
    return len(weights)


def _restore_fp8(model: nn.Module) -> int:
    """Change the projections that :func:`_convert_fp8` converted back into Linears, with their weights as they were
    (unwrapped from torchao's float8 all-gather wrapper). One whose wrapped weight ``fully_shard`` has sharded stays a
    ``Float8Linear`` (FSDP2 gathers it in float8 from then on; :func:`_convert_fp8` takes it as converted). Returns
    how many it changed back."""
    n = 0
    for m in list(model.modules()):
        m.__dict__.pop("_liger_fp8_eager_warning", None)  # (a GPT whose class was not swapped keeps it)
        m.__dict__.pop("_liger_fp8_small_warning", None)
        record = m.__dict__.get("_liger_fp8_orig")
        if record is None:
            continue
        w = m.weight
        if _float8_all_gather_weight(w):
            if _is_dtensor(w):
                continue
            inner = w._tensor  # (the Parameter it wrapped, unless the model moved since)
            m.weight = inner if isinstance(inner, nn.Parameter) else nn.Parameter(inner, requires_grad=w.requires_grad)
            m.weight.requires_grad_(w.requires_grad)
        cls, added = record
        for k in (*added, "_liger_fp8_orig"):
            m.__dict__.pop(k, None)
        m.__class__ = cls
        n += 1
    return n


def _fp8_decisions(model: nn.Module) -> dict[int, tuple]:
    """The FSDP2 float8 all-gather decision (on or off, why, the ``fp8_all_gather`` setting) that
    :func:`_convert_fp8` recorded on each projection it converted, by ``id`` of the module (read before
    :func:`remove_liger` clears them)."""
    return {id(m): m.__dict__["_liger_fp8_ag"] for m in model.modules() if "_liger_fp8_ag" in m.__dict__}
