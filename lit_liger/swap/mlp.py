"""LitGPT's MLPs on lit-liger's kernels: the GLU MLPs (SwiGLU: LLaMAMLP; GeGLU: GemmaMLP) and GptNeoxMLP's GELU; any
of them over sequence tiles (:func:`tiled_mlp`) for long sequences."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.gelu import gelu, gelu_linear
from ..kernels.swiglu import geglu, glu_linear, glu_mlp, swiglu
from ._common import (_called_plainly, _CHECKPOINTED, _fresh_outputs, _frozen_linear, _in_scope, _MLP_RECOMPUTED,
                      _plain_linear, _stock_under_compile)
from .fp8 import _fp8_fusable, glu_linear_fp8, is_float8_linear
from .lora import call_lora


class _TiledMLP(torch.autograd.Function):
    """``mlp(x)`` over sequence tiles of ``tile`` rows of ``x`` seen as ``(1, N, C)``: the forward runs each tile
    without grad and writes it into the output; the backward runs each tile's forward again with grad and takes its
    gradients (``x``'s tile, and every trainable parameter's, summed over the tiles in fp32). Only ``x`` is kept:
    no ``(N, intermediate)`` tensor exists whole, at one more MLP forward per tile. Random ops inside (LoRA's
    dropout) draw the same numbers in the backward's reruns: the generators' states at the forward are restored for
    them (as ``torch.utils.checkpoint`` does)."""

    @staticmethod
    def forward(ctx, mlp: nn.Module, tile: int, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.mlp, ctx.tile, ctx.shape, ctx.params = mlp, tile, x.shape, params
        ctx.devices = [x.device] if x.device.type == "cuda" else []
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.devices]
        ctx.save_for_backward(x)
        rows = x.reshape(1, -1, x.size(-1))
        out = None
        with torch.no_grad():
            for s in range(0, rows.size(1), tile):
                o = mlp(rows[:, s:s + tile])
                if out is None:
                    out = o.new_empty(1, rows.size(1), o.size(-1))
                out[:, s:s + tile] = o
        return out.view(*x.shape[:-1], out.size(-1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        mlp, tile, params = ctx.mlp, ctx.tile, list(ctx.params)
        rows = x.detach().reshape(1, -1, x.size(-1))
        grows = grad.reshape(1, rows.size(1), grad.size(-1))
        dx = torch.empty_like(rows) if ctx.needs_input_grad[2] else None
        sums: list[torch.Tensor | None] = [None] * len(params)
        with torch.random.fork_rng(devices=ctx.devices):
            torch.set_rng_state(ctx.cpu_rng)
            for d, state in zip(ctx.devices, ctx.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            for s in range(0, rows.size(1), tile):
                xt = rows[:, s:s + tile].requires_grad_(dx is not None)
                with torch.enable_grad():
                    o = mlp(xt)
                wrt = ([xt] if dx is not None else []) + params
                got = torch.autograd.grad(o, wrt, grows[:, s:s + tile], allow_unused=True)
                if dx is not None:
                    dx[:, s:s + tile] = got[0]
                    got = got[1:]
                for i, g in enumerate(got):
                    if g is not None:
                        sums[i] = g.float() if sums[i] is None else sums[i].add_(g)
        return (None, None, None if dx is None else dx.view(ctx.shape),
                *(None if g is None else g.to(p.dtype) for p, g in zip(params, sums)))


def tiled_mlp(mlp: nn.Module, x: torch.Tensor, tile: int, norm: tuple | None = None) -> torch.Tensor:
    """``mlp(x)`` (any LitGPT MLP, swapped or not: its Linears plain, LoRA or 4-bit, frozen or trained) over sequence
    tiles of ``tile`` tokens of ``x`` ``(B, T, C)`` in the forward and in the backward's rerun (:class:`_TiledMLP`):
    its ``(B, T, intermediate)`` tensors exist one tile at a time. ``mlp(x)`` itself where one tile holds every
    token; there, given ``norm = (s, norm_weight, eps, offset)``, a swapped GLU MLP (called without hooks, in eager
    mode: the caller checks) is told that ``x`` is the RMSNorm of ``s`` (:func:`_mlp_out`; the tiles rerun their MLP
    and ignore it)."""
    if tile <= 0 or x.size(0) * x.size(1) <= tile:
        return mlp(x) if norm is None else _mlp_out(mlp, x, mlp._liger_activation, norm)
    params = tuple(p for p in mlp.parameters() if p.requires_grad)
    return _TiledMLP.apply(mlp, tile, x, *params)


def _mlp_out(mlp: nn.Module, x: torch.Tensor, activation: str,
             norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None) -> torch.Tensor:
    """``mlp.proj(act(fc_1(x)) * fc_2(x))`` (see :func:`_glu_proj`). Inside a checkpointed Block
    (``LigerConfig.activation_checkpointing``) a frozen MLP runs as :func:`glu_mlp`: its ``(B, T, I)``
    tensors exist one chunk of rows at a time, in the Block's recompute and in its backward. ``norm = (s,
    norm_weight, eps, offset)``: ``x`` is the Block's RMSNorm of ``s``, which LoRA ``fc_1`` / ``fc_2`` form again
    in backward instead of keeping ``x`` (:func:`lit_liger.swap.lora.lora_linear`)."""
    if (_in_scope(mlp, _CHECKPOINTED) or _in_scope(mlp, _MLP_RECOMPUTED)) \
            and (weights := _frozen_mlp_weights(mlp, x)) is not None:
        return glu_mlp(x, *weights, activation=activation)
    reuse = _fresh_outputs(mlp.fc_1, mlp.fc_2)
    # LoRA fc_1 and fc_2 read one x: kept once for both (or formed again from the norm's input), each LoRA
    # dropout's mask as bits beside it (lora.call_lora)
    a = call_lora(mlp.fc_1, x, keep_input=True, norm=norm)  # (B, T, I)
    b = call_lora(mlp.fc_2, x, keep_input=True, norm=norm)  # (B, T, I)
    return _glu_proj(mlp.proj, a, b, activation, reuse)


def _glu_proj(proj: nn.Module, a: torch.Tensor, b: torch.Tensor, activation: str, reuse: bool) -> torch.Tensor:
    """``proj(act(a) * b)``: with a plain Linear ``proj`` (no LoRA, no autocast) the GLU product is not kept
    for backward (``glu_linear`` recomputes it): one (B, T, I) tensor per layer fewer. ``reuse``: ``a`` and
    ``b`` are fresh tensors that nothing else holds, so the backward writes their gradients over them
    (``reuse_inputs``): two (B, T, I) tensors fewer at the backward's peak."""
    if (
        type(proj) is nn.Linear
        and a.device.type in ("cuda", "cpu")
        and proj.weight.dtype == a.dtype
        and not torch.is_autocast_enabled(a.device.type)
    ):
        return glu_linear(a, b, proj.weight, proj.bias, activation, reuse_inputs=reuse)  # (B, T, C)
    if is_float8_linear(proj) and _fp8_fusable(a, proj):  # LigerConfig.fp8: the same, the GEMMs torchao's float8
        return glu_linear_fp8(a, b, proj, activation)
    if activation == "silu":
        glu = swiglu(a, b, reuse_inputs=reuse)
    else:
        glu = geglu(a, b, "tanh" if activation == "gelu_tanh" else "none", reuse_inputs=reuse)
    # a LoRA proj keeps no copy of glu: its backward forms it again from a and b, which the GLU's backward keeps
    return call_lora(proj, glu, glu=(a, b, activation))  # (B, T, I) -> (B, T, C)


def _frozen_mlp_weights(mlp: nn.Module, x: torch.Tensor) -> tuple | None:
    """``(w1, b1, w2, b2, w3, b3)`` where the MLP's three projections are frozen plain Linears (r = 0 LoRA
    included) of ``x``'s dtype and device, called without hooks, in eager mode without autocast; else None."""
    if torch.compiler.is_compiling() or torch.is_autocast_enabled(x.device.type):
        return None
    mods = (mlp.fc_1, mlp.fc_2, mlp.proj)
    parts = [_frozen_linear(m) for m in mods]
    if any(p is None for p in parts):
        return None
    if any(w.dtype != x.dtype or w.device != x.device for w, _ in parts):
        return None
    inner = [m.linear for m in mods if type(m) is not nn.Linear]
    if not _called_plainly(*mods, *inner):
        return None
    return tuple(t for wb in parts for t in wb)


class _SwiGLUMixin:
    _liger_activation = "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return _mlp_out(self, x, "silu")


class _GeGLUMixin:
    @property
    def _liger_activation(self) -> str:
        return "gelu_tanh" if self.config.gelu_approximate == "tanh" else "gelu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return _mlp_out(self, x, self._liger_activation)


class _GeluMLPMixin:
    """LitGPT's ``GptNeoxMLP``, ``proj(gelu(fc(x)))`` (Pythia, Falcon, phi, StableLM-alpha, RedPajama-INCITE): the GELU
    (``gelu_approximate``) on lit-liger's kernel, fp32 math, only its input kept for backward. With a plain Linear
    ``proj`` (no LoRA, float8 or hooks, no autocast) the GELU and ``proj`` run as :func:`gelu_linear`, which keeps
    ``fc``'s output but not the GELU's for backward: one ``(B, T, I)`` tensor per layer fewer (a plain ``proj``
    keeps its input for its weight gradient). ``fc`` and ``proj`` are called as modules otherwise (LitGPT's LoRA
    layers, swapped or not)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        approximate = self.config.gelu_approximate
        h = self.fc(x)  # (B, T, I)
        proj = self.proj
        if (
            _plain_linear(proj) and _called_plainly(proj) and h.device.type in ("cuda", "cpu")
            and proj.weight.dtype == h.dtype and not torch.is_autocast_enabled(h.device.type)
        ):
            return gelu_linear(h, proj.weight, proj.bias, approximate)  # (B, T, C)
        return proj(gelu(h, approximate))  # (B, T, I) -> (B, T, C)
