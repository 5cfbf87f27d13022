"""LitGPT's Block on lit-liger's kernels: the norms fused into the projections after them, the residual adds fused
into the norms, for every residual layout ``Config`` flags give."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels._launch import use_triton
from ..kernels.layer_norm import layer_norm_dual, layer_norm_residual
from ..kernels.rms_norm import rms_norm_add, rms_norm_linear, rms_norm_residual
from ..kernels.swiglu import rms_norm_glu_mlp
from ._common import (_called_plainly, _CHECKPOINTED, _in_scope, _MLP_RECOMPUTED, _plain_linear, _stock_under_compile,
                      mlp_tile)
from .attention import _AttentionMixin
from .fp8 import _fp8_fusable, is_float8_linear, norm_linear_fp8, norm_mlp_fp8, tensorwise_fusable
from .lora import call_lora
from .mlp import _frozen_mlp_weights, _GeGLUMixin, _glu_proj, _SwiGLUMixin, tiled_mlp
from .norms import _LayerNormMixin, _RMSNormMixin


class _BlockMixin:
    """LitGPT's Block on lit-liger's kernels, for every residual layout ``Config`` flags give (no per-family code).

    Non-parallel residual: ``x = attn + x; norm_2(x)`` in one kernel, :func:`rms_norm_residual` for an RMSNorm
    ``norm_2`` (Llama-like), :func:`layer_norm_residual` for a LayerNorm one (OLMo-1, StableLM-3B); without a
    ``norm_2`` (OLMo-2: Identity) LitGPT's add. A swapped RMSNorm post-norm before a residual add (Gemma-2/3's and
    OLMo-2's ``post_attention_norm`` and ``post_mlp_norm``) runs with the add in one kernel, :func:`rms_norm_add`, and
    with ``norm_2`` after it too where the MLP's input is not formed by :func:`rms_norm_linear` (Gemma-2's LoRA).

    Parallel residual (``parallel_residual``: Pythia, Falcon, phi, StableLM-alpha, RedPajama-INCITE):
    ``x = mlp(norm_2(x)) + attn(norm_1(x)) + x`` with the adds in LitGPT's order; where ``norm_1`` and ``norm_2``
    are two LayerNorms of the same ``x`` they run as :func:`layer_norm_dual` (``x`` read once, one ``dx``), with
    ``shared_attention_norm`` (Falcon-7B, phi) the MLP reads ``norm_1``'s output as in LitGPT.

    With ``recompute_norm``, where the norm's readers are plain Linears (full fine-tuning and
    pretraining; LoRA layers read it themselves), an RMSNorm ``norm_1 -> attn.qkv`` and ``norm_2 -> mlp.fc_1, fc_2``
    (GLU MLP) run as :func:`rms_norm_linear`: their normalized input is recomputed in backward instead of
    kept (two ``(B, T, C)`` tensors per layer less). The KV-cache calls (``input_pos``) take the same paths, the
    attention module running LitGPT's cached attention."""

    def _liger_fuse_norm_1(self, input_pos=None, structure_only: bool = False, x: torch.Tensor | None = None
                           ) -> bool:
        """Whether ``norm_1 -> attn.qkv`` runs as :func:`rms_norm_linear` (``structure_only``: the
        modules allow it, ignoring the call's state, for the report). The same under ``torch.compile``,
        which traces these checks (guarding on them) and the fused op as an opaque custom op. With
        ``LigerConfig.fp8`` the Linear is torchao's float8 one, whose GEMMs :mod:`lit_liger.swap.fp8` calls."""
        attn = self.attn
        ok = (
            getattr(self, "_liger_recompute_norm", False) and not self.config.parallel_residual
            and isinstance(self.norm_1, _RMSNormMixin) and isinstance(attn, _AttentionMixin)
            and (_plain_linear(attn.qkv) or is_float8_linear(attn.qkv))
        )
        if structure_only or not ok:
            return ok
        return (
            input_pos is None and torch.is_grad_enabled() and attn.qkv.weight.requires_grad
            and _called_plainly(self.norm_1, attn, attn.qkv)
            and (x is None or not is_float8_linear(attn.qkv) or _fp8_fusable(x, attn.qkv))
        )

    def _liger_fuse_norm_2(self, structure_only: bool = False, x: torch.Tensor | None = None) -> bool:
        """Whether ``norm_2 -> mlp.fc_1, fc_2`` runs as :func:`rms_norm_linear` (see above)."""
        mlp = self.mlp
        ok = (
            getattr(self, "_liger_recompute_norm", False) and isinstance(self.norm_2, _RMSNormMixin)
            and not self.config.parallel_residual and isinstance(mlp, (_SwiGLUMixin, _GeGLUMixin))
            and ((_plain_linear(mlp.fc_1) and _plain_linear(mlp.fc_2))
                 or (is_float8_linear(mlp.fc_1) and is_float8_linear(mlp.fc_2)))
        )
        if structure_only or not ok:
            return ok
        return (
            torch.is_grad_enabled() and (mlp.fc_1.weight.requires_grad or mlp.fc_2.weight.requires_grad)
            and _called_plainly(self.norm_2, mlp, mlp.fc_1, mlp.fc_2)
            and (x is None or not is_float8_linear(mlp.fc_1) or _fp8_fusable(x, mlp.fc_1, mlp.fc_2))
        )

    def _liger_lora_reads_norm(self, norm: nn.Module, module: nn.Module, *linears: nn.Module, x: torch.Tensor,
                               input_pos=None) -> bool:
        """A swapped RMSNorm's output is read by LoRA layers (``linears``, inside ``module``: the attention or the
        GLU MLP) that may form it again in backward from the norm's input instead of keeping it
        (:func:`lit_liger.swap.lora.lora_linear`'s ``norm``): training in eager mode (the LoRA function runs
        there), no KV cache, every module called without hooks, some of ``linears`` swapped LoRA layers. Off
        with ``LigerConfig.recompute_norm`` false."""
        return (
            getattr(self, "_liger_recompute_norm", False) and isinstance(norm, _RMSNormMixin)
            and input_pos is None and torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and any(getattr(m, "_liger_lora_mixin", False) for m in linears)
            and (not isinstance(module, _AttentionMixin) or not _stock_under_compile(module, x))
            and _called_plainly(norm, module, *linears)
        )

    def _liger_recompute_mlp_here(self, x: torch.Tensor) -> bool:
        """``LigerConfig.recompute_mlp`` applies to this call (the fused norm_2 path already chosen): the Triton
        path (eager or compiled), outside a checkpointed Block, a plain ``proj`` Linear in the input's dtype, no
        autocast."""
        proj = self.mlp.proj
        return ((getattr(self, "_liger_recompute_mlp", False) or _in_scope(self, _MLP_RECOMPUTED))
                and not _in_scope(self, _CHECKPOINTED)
                and use_triton(x) and type(proj) is nn.Linear
                and proj.weight.dtype == x.dtype and not torch.is_autocast_enabled(x.device.type)
                and _called_plainly(proj))

    def _liger_tile(self, x: torch.Tensor) -> int:
        """Tokens per sequence tile of this call's MLP (:func:`lit_liger.swap.mlp.tiled_mlp`; 0: whole): the memory
        plan's tile (``MemPlan.tile``, set for a recomputed Block), for a training call (or the forward of a
        reentrant checkpoint, without grad) in eager mode, not captured,
        longer than one tile, its MLP called without hooks, and not a frozen GLU MLP inside the checkpoint (which
        ``glu_mlp`` runs a chunk of rows at a time already)."""
        tile = mlp_tile(self)
        if not tile or x.size(0) * x.size(1) <= tile:
            return 0
        if not torch.is_grad_enabled() and not _in_scope(self, _CHECKPOINTED):
            return 0  # (the reentrant checkpoint's forward runs without grad: its MLP is tiled too)
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return 0
        mlp = self.mlp
        if not _called_plainly(*mlp.modules()):
            return 0
        if isinstance(mlp, (_SwiGLUMixin, _GeGLUMixin)) and _in_scope(mlp, _CHECKPOINTED) \
                and _frozen_mlp_weights(mlp, x) is not None:
            return 0
        return tile

    def _liger_mlp(self, x_normed: torch.Tensor, norm: tuple | None = None) -> torch.Tensor:
        """``self.mlp(x_normed)``, over sequence tiles where :meth:`_liger_tile` says (``norm``: see
        :func:`tiled_mlp`)."""
        return tiled_mlp(self.mlp, x_normed, self._liger_tile(x_normed), norm=norm)

    def _liger_post_rms(self, norm: nn.Module) -> bool:
        """A post-norm (``post_attention_norm``, ``post_mlp_norm``: Gemma-2/3, OLMo-2) that runs inside
        :func:`rms_norm_add` with the add after it: a swapped RMSNorm called without hooks (LitGPT's Identity where
        a family has none)."""
        return isinstance(norm, _RMSNormMixin) and _called_plainly(norm)

    def _liger_post_add(self, norm: nn.Module, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """LitGPT's ``norm(out) + x`` at a Block's residual add, in one kernel (:func:`rms_norm_add`) for a swapped
        RMSNorm ``norm`` and ``out`` in ``x``'s dtype and shape."""
        if out.dtype == x.dtype and out.shape == x.shape and self._liger_post_rms(norm):
            return rms_norm_add(out, x, norm.weight, norm.eps, 1.0 if norm.add_unit_offset else 0.0)[0]
        return norm(out) + x

    def forward(self, x, cos, sin, mask=None, input_pos=None, input_pos_maxp1=None):
        if _stock_under_compile(self, x):
            return super().forward(x, cos, sin, mask, input_pos, input_pos_maxp1)
        if self.config.parallel_residual:
            return self._liger_parallel(x, cos, sin, mask, input_pos, input_pos_maxp1)
        n1, n2 = self.norm_1, self.norm_2
        if self._liger_fuse_norm_1(input_pos, x=x):
            qkv = self.attn.qkv
            if is_float8_linear(qkv):  # LigerConfig.fp8: the same, the GEMMs torchao's float8 ones
                _, (qkv_out,) = norm_linear_fp8(x, n1, [qkv])
            else:
                _, (qkv_out,) = rms_norm_linear(x, n1.weight, [(qkv.weight, qkv.bias)], n1.eps,
                                                1.0 if n1.add_unit_offset else 0.0)  # (B, T, (nh + 2 ng) * hs)
            attention_output = self.attn._liger_attend(qkv_out, cos, sin, mask)
            del qkv_out  # (see below)
        elif self._liger_lora_reads_norm(n1, self.attn, self.attn.qkv, x=x, input_pos=input_pos):
            # a LoRA qkv forms norm_1's output again from x (which norm_1 keeps) instead of keeping it
            offset = 1.0 if n1.add_unit_offset else 0.0
            qkv_out = call_lora(self.attn.qkv, n1(x), norm=(x, n1.weight, n1.eps, offset))
            attention_output = self.attn._liger_attend(qkv_out, cos, sin, mask)
            # the locals this forward no longer reads are dropped as it goes: held to its return, the qkv output,
            # the attention's output and norm_2's output would sit beside the MLP's output and the Block's (at
            # 262,144 tokens of Llama-3.1-8B, 5 GiB more at a recomputed Block's rerun, the backward's peak then:
            # benchmarks/results/h200-2026-12-04d)
            del qkv_out
        else:
            x_normed = n1(x)
            attention_output = self.attn(x_normed, cos, sin, mask, input_pos, input_pos_maxp1)
        if attention_output.dtype != x.dtype or attention_output.shape != x.shape:
            # mixed dtypes (autocast): keep LitGPT's promotion semantics
            x = self.post_attention_norm(attention_output) + x
            return self.post_mlp_norm(self.mlp(n2(x))) + x
        post = self.post_attention_norm
        if not isinstance(n2, _RMSNormMixin):
            if isinstance(n2, _LayerNormMixin) and _called_plainly(n2):  # (LayerNorm: OLMo-1, StableLM-3B)
                x, x_normed = layer_norm_residual(post(attention_output), x, n2.weight, n2.bias, n2.eps)  # (B,T,C) x2
            else:  # no norm_2 (OLMo-2's Identity) or one left to LitGPT: LitGPT's add (with a post-norm: one kernel)
                x = self._liger_post_add(post, attention_output, x)
                x_normed = n2(x)
            return self._liger_post_add(self.post_mlp_norm, self._liger_mlp(x_normed), x)
        offset = 1.0 if n2.add_unit_offset else 0.0
        if self._liger_fuse_norm_2(x=x) and not self._liger_tile(x):  # (a tiled MLP reads norm_2's output)
            attention_output = post(attention_output)
            mlp = self.mlp
            if is_float8_linear(mlp.fc_1):  # LigerConfig.fp8 (see norm_1); a, b as below
                if is_float8_linear(mlp.proj) and tensorwise_fusable(x, mlp.fc_1, mlp.fc_2, mlp.proj) \
                        and _fp8_fusable(x, mlp.proj):  # the whole MLP on lit-liger's casts
                    x, mlp_out = norm_mlp_fp8(attention_output, x, n2, mlp, mlp._liger_activation)
                    return self._liger_post_add(self.post_mlp_norm, mlp_out, x)
                x, (a, b) = norm_linear_fp8(attention_output, n2, [mlp.fc_1, mlp.fc_2], residual=x)
                mlp_out = _glu_proj(mlp.proj, a, b, mlp._liger_activation, reuse=False)
                return self._liger_post_add(self.post_mlp_norm, mlp_out, x)
            if self._liger_recompute_mlp_here(x):  # LigerConfig.recompute_mlp: fc_1 / fc_2 outputs not kept
                fc_1, fc_2, proj = mlp.fc_1, mlp.fc_2, mlp.proj
                x, mlp_out = rms_norm_glu_mlp(attention_output, x, n2.weight, n2.eps, offset, fc_1.weight, fc_1.bias,
                                              fc_2.weight, fc_2.bias, proj.weight, proj.bias, mlp._liger_activation)
                return self._liger_post_add(self.post_mlp_norm, mlp_out, x)
            x, (a, b) = rms_norm_linear(attention_output, n2.weight, [(mlp.fc_1.weight, mlp.fc_1.bias),
                                        (mlp.fc_2.weight, mlp.fc_2.bias)], n2.eps, offset, residual=x)
            # a, b (B, T, I): new outputs of the fused function, which keeps neither for its backward
            mlp_out = _glu_proj(mlp.proj, a, b, mlp._liger_activation, reuse=True)
        else:
            if self._liger_post_rms(post):  # Gemma-2/3: post_attention_norm, the add and norm_2 in one kernel
                x, x_normed = rms_norm_add(attention_output, x, post.weight, post.eps, 1.0 if post.add_unit_offset
                                           else 0.0, next_norm=(n2.weight, n2.eps, offset))  # (B, T, C) x2
            else:
                x, x_normed = rms_norm_residual(post(attention_output), x, n2.weight, n2.eps, offset)  # (B, T, C) x2
            del attention_output
            mlp, norm = self.mlp, None
            if isinstance(mlp, (_SwiGLUMixin, _GeGLUMixin)) \
                    and self._liger_lora_reads_norm(n2, mlp, mlp.fc_1, mlp.fc_2, x=x):
                norm = (x, n2.weight, n2.eps, offset)  # LoRA fc_1 / fc_2: norm_2's output formed again from x
            mlp_out = self._liger_mlp(x_normed, norm)
            del x_normed
        return self._liger_post_add(self.post_mlp_norm, mlp_out, x)


    def _liger_dual_norm(self) -> bool:
        """A parallel-residual Block's ``norm_1(x)`` and ``norm_2(x)`` run as one :func:`layer_norm_dual`: two
        swapped LayerNorms of one eps, called without hooks, ``norm_2`` not shared."""
        n1, n2 = self.norm_1, self.norm_2
        return (not self.config.shared_attention_norm and isinstance(n1, _LayerNormMixin)
                and isinstance(n2, _LayerNormMixin) and n1.eps == n2.eps and _called_plainly(n1, n2))

    def _liger_parallel(self, x, cos, sin, mask, input_pos, input_pos_maxp1):
        """LitGPT's parallel residual, ``x = post_mlp_norm(mlp(x_normed_2)) + (post_attention_norm(attn(norm_1(x)))
        + x)`` with ``x_normed_2`` ``norm_1``'s output (``shared_attention_norm``) or ``norm_2(x)``; the two norms in
        one kernel where :meth:`_liger_dual_norm`. The adds are LitGPT's, in its order (and dtype promotion)."""
        x_normed_2 = None
        if self._liger_dual_norm():
            n1, n2 = self.norm_1, self.norm_2
            x_normed, x_normed_2 = layer_norm_dual(x, n1.weight, n1.bias, n2.weight, n2.bias, n1.eps)  # (B, T, C) x2
        else:
            x_normed = self.norm_1(x)
        attention_output = self.attn(x_normed, cos, sin, mask, input_pos, input_pos_maxp1)
        attention_output = self.post_attention_norm(attention_output)
        if self.config.shared_attention_norm:
            x_normed_2 = x_normed
        elif x_normed_2 is None:
            x_normed_2 = self.norm_2(x)
        x = attention_output + x
        return self.post_mlp_norm(self._liger_mlp(x_normed_2)) + x
