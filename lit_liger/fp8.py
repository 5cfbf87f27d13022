"""lit-liger's fused norm->Linear and GLU-product recompute feeding torchao's float8 GEMMs (``LigerConfig.fp8``).

``LigerConfig.fp8`` turns the Block projections into torchao ``Float8Linear`` modules (``adapter._convert_fp8``).
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
``backward`` called with another context."""

from __future__ import annotations

import torch
from torch import nn

from .kernels.rms_norm import _rms_norm_bwd, _rms_norm_bwd_impl, _rms_norm_fwd, _rms_norm_fwd_impl
from .kernels.swiglu import _glu_bwd, _glu_bwd_impl, _glu_fwd, _glu_fwd_impl

__all__ = ["glu_linear_fp8", "is_float8_linear", "norm_linear_fp8"]


def is_float8_linear(m: nn.Module) -> bool:
    """A torchao ``Float8Linear`` that ``LigerConfig.fp8`` made, whose weight its GEMMs can read as it is: a plain
    16-bit Parameter (FSDP2's gathered one included) or, in eager mode, one of torchao's FSDP2 float8 all-gather
    (``LigerConfig.fp8_all_gather``): the 16-bit weight in its wrapper before ``fully_shard``, the float8 weight that
    FSDP2 gathered for this forward or backward (checked bit for bit against the module's own forward on CPU, one and
    2 processes; not yet under ``torch.compile``, where the module's forward runs). Not a DTensor (a Linear sharded
    or parallelized on its own) or a DeepSpeed partition: the module's own forward runs those."""
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
    return _GluLinearFp8.apply(a, b, proj.weight, proj.bias, activation, proj.linear_mm_config, proj.config)
