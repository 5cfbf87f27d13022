"""``apply_liger``: the one LitGPT adapter, driven by ``Config`` flags (no per-family code).

LitGPT builds 20+ model families from one ``GPT`` whose modules are chosen by ``Config`` flags
(``norm_class_name``, ``mlp_class_name``, ``rope_n_elem``, ``norm_qk``, ``parallel_residual``,
``final_logit_softcapping``, ``lm_head_bias``, ...). The adapter walks a model's modules and
swaps each module's *class* for a subclass whose ``forward`` calls the Triton kernels; the same
Parameter objects, names and ``state_dict`` keys stay, and ``isinstance(m, Block)`` (FSDP
wrap / activation-checkpointing policies) still holds. LitGPT's LoRA and adapter subclasses are
covered because the swap subclasses whatever class the module has.

Attention with logit softcapping or a sliding window runs on FlexAttention (``lit_liger.swap.attend``).
What is left alone (and why) is reported: latent attention (MLA), the KV-cache ``input_pos``
path (LitGPT's attention code runs for those calls).
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from litgpt import lora as litgpt_lora
from litgpt import model as lm
from litgpt.api import LLM
from torch import nn
from torch.nn.modules import module as _nn_module
from torch.utils.checkpoint import checkpoint as _checkpoint
from torch.utils.checkpoint import set_checkpoint_early_stop as _checkpoint_early_stop

from . import attend as _attention
from . import packing as _packing
from .. import _dist
from .._dist import sharded_processes
from .buckets import bucket_length, packed_bucket_length
from .state import state_of, states_in
from ..config import LigerConfig
from . import tied as _tied
from ..kernels import _grad_into
from ..kernels._launch import use_triton
from ..kernels.attention import softcap_attention, supported_head_size
from ..kernels.embedding import embedding
from ..kernels.gelu import gelu, gelu_linear
from ..kernels.layer_norm import layer_norm, layer_norm_dual, layer_norm_residual
from ..kernels.rms_norm import rms_norm, rms_norm_linear, rms_norm_residual
from ..kernels.rope import rope, rope_qkv
from ..kernels.swiglu import geglu, glu_linear, glu_mlp, rms_norm_glu_mlp, swiglu
from .fp8 import (glu_linear_fp8, is_float8_linear, is_tensorwise, liger_float8_linear_class, norm_linear_fp8,
                  norm_mlp_fp8, tensorwise_fusable)
from .lora import lora_linear, lora_parts
from .quant import is_4bit, is_quantized, linear_4bit
from .loss import (GatheredHead, LigerLogits, _unwrap_linear, chunked_cross_entropy, head_lora_input, lm_head_lora,
                   lm_head_weight_bias)

__all__ = ["LigerReport", "fused_loss_without_grad", "is_swapped", "remove_liger", "swap_model"]


# ------------------------------------------------------------------------------------------------
# Mixins: each overrides forward only; parameters and buffers are the original module's.
# ------------------------------------------------------------------------------------------------
def _stock_under_compile(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` runs LitGPT's own forward: under ``torch.compile``, for inputs of fewer than
    ``LigerConfig.compile_min_tokens`` tokens (compared as elements, ``tokens * n_embd``, so a per-head
    qk-norm's ``(B, nh, T, hs)`` input counts like its ``(B, T, C)`` source). Such steps are bound
    by the host: each lit-liger op costs the custom-op dispatcher and Python launch work, while
    inductor fuses LitGPT's code into a few kernels launched from generated code (measured in the
    README, "Small micro-batches"). Decided while tracing (a guard on the shape), free at run time;
    in eager mode ``is_compiling()`` is False."""
    return torch.compiler.is_compiling() and x.numel() < getattr(module, "_liger_compile_min_elems", 0)


class _RMSNormMixin:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps, 1.0 if self.add_unit_offset else 0.0)


class _LayerNormMixin:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _stock_under_compile(self, x):
            return super().forward(x)
        return layer_norm(x, self.weight, self.bias, self.eps)


def _mlp_out(mlp: nn.Module, x: torch.Tensor, activation: str) -> torch.Tensor:
    """``mlp.proj(act(fc_1(x)) * fc_2(x))`` (see :func:`_glu_proj`). Inside a checkpointed Block
    (``LigerConfig.activation_checkpointing``) a frozen MLP runs as :func:`glu_mlp`: its ``(B, T, I)``
    tensors exist one chunk of rows at a time, in the Block's recompute and in its backward."""
    if (_in_scope(mlp, _CHECKPOINTED) or _in_scope(mlp, _MLP_RECOMPUTED)) \
            and (weights := _frozen_mlp_weights(mlp, x)) is not None:
        return glu_mlp(x, *weights, activation=activation)
    reuse = _fresh_outputs(mlp.fc_1, mlp.fc_2)
    return _glu_proj(mlp.proj, mlp.fc_1(x), mlp.fc_2(x), activation, reuse)  # fc_1, fc_2: (B, T, I)


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
    return proj(glu)  # (B, T, I) -> (B, T, C)


#: a Block (and its MLP) runs under LigerConfig.activation_checkpointing (its forward and its recompute in backward)
_CHECKPOINTED = "_liger_in_checkpoint"
#: a Block (and its MLP) runs whose MLP inputs the memory plan has recomputed in backward
#: (``lit_liger.runtime.memplan.MemPlan.mlp``): a frozen MLP runs as ``glu_mlp``, a trained one as ``recompute_mlp`` does
_MLP_RECOMPUTED = "_liger_mlp_recomputed"


def _in_scope(module: nn.Module, scope: str) -> bool:
    """``module`` runs inside :func:`_scoped` ``scope`` (a count on the module itself: each model its own)."""
    return module.__dict__.get(scope, 0) > 0


@contextlib.contextmanager
def _scoped(block: nn.Module, scope: str) -> Iterator[None]:
    """While ``block`` (and its MLP) run, :func:`_in_scope` ``scope`` holds for them."""
    mods = [block] + ([block.mlp] if isinstance(getattr(block, "mlp", None), nn.Module) else [])
    for m in mods:
        m.__dict__[scope] = m.__dict__.get(scope, 0) + 1
    try:
        yield
    finally:
        for m in mods:
            m.__dict__[scope] -= 1


def _checkpointed_block(block: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        pack: _packing.Pack | None = None) -> torch.Tensor:
    """The function that ``torch.utils.checkpoint`` runs (and reruns in backward) for one Block."""
    with _scoped(block, _CHECKPOINTED):
        return block(x, cos, sin, pack, None, None)


def _frozen_linear(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of a plain ``nn.Linear``, or of a LitGPT ``LoRALinear`` with r = 0 (whose forward is its
    inner Linear's), where neither requires grad; else None."""
    if not _plain_linear(m):
        if not (_is_lora_linear(m) and m.r == 0 and _plain_linear(m.linear)):
            return None
        m = m.linear
    w, b = m.weight, m.bias
    if w.requires_grad or (b is not None and b.requires_grad):
        return None
    return w, b


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


def _fresh_outputs(*modules: nn.Module) -> bool:
    """These modules return new tensors that nothing else keeps: plain ``nn.Linear`` or LitGPT ``LoRALinear``
    layers (swapped or not, r = 0 included: their output is a new sum, or the inner Linear's), with no hooks
    on them or their inner Linear (a forward hook may keep the output it sees)."""
    inner = []
    for m in modules:
        if type(m) is nn.Linear:
            continue
        if not _is_lora_linear(m) or type(m.linear) is not nn.Linear:
            return False
        inner.append(m.linear)
    return _called_plainly(*modules, *inner)


def _is_lora_linear(m: nn.Module) -> bool:
    """LitGPT's ``LoRALinear``, swapped or not."""
    return isinstance(m, _LoRAMixin) or type(m) is litgpt_lora.LoRALinear


def _fp8_fusable(x: torch.Tensor, *linears: nn.Module) -> bool:
    """lit-liger's fused norm->Linear / GLU-product paths may call these float8 Linears' GEMMs themselves
    (``lit_liger.swap.fp8``): the Triton path, no autocast, weights in ``x``'s dtype, no hooks on the modules."""
    return (use_triton(x) and not torch.is_autocast_enabled(x.device.type)
            and all(m.weight.dtype == x.dtype for m in linears) and _called_plainly(*linears))


def _plain_linear(m: nn.Module) -> bool:
    """A plain ``nn.Linear`` whose weight the fused norm + Linear function may read directly (not LoRA
    or another subclass, not a DeepSpeed ZeRO-3 partition gathered by its own module hooks, not a
    DTensor of a module sharded or parallelized on its own)."""
    return type(m) is nn.Linear and not hasattr(m.weight, "ds_id") and not _is_dtensor(m.weight)


def _4bit_linear(m: nn.Module, x: torch.Tensor) -> bool:
    """A bitsandbytes 4-bit Linear (QLoRA's frozen base) computing in ``x``'s dtype: the LoRA function dequantizes
    its weight as the layer's own forward does (int8 layers multiply in int8: they keep their own forward)."""
    w = getattr(m, "weight", None)
    return (
        isinstance(m, nn.Linear) and w is not None and is_4bit(w)
        and getattr(m, "compute_dtype", None) in (None, x.dtype) and not w.requires_grad
    )


def _is_dtensor(t: torch.Tensor) -> bool:
    """``isinstance(t, DTensor)`` without importing torch.distributed where it is not built (traceable
    by torch.compile, unlike walking the type's MRO)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _called_plainly(*modules: nn.Module) -> bool:
    """No hooks on these modules (nor global module hooks): calling their math directly instead of
    through ``module(...)`` skips nothing (FSDP2 ``fully_shard`` or composable checkpointing applied
    to them, weight re-parametrizing pre-hooks, a user's activation hooks)."""
    if _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks:
        return False
    return not any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks for m in modules
    )


class _LoRAMixin:
    """LitGPT's ``LoRALinear`` / ``LoRAQKVLinear`` (r > 0): the frozen projection and the LoRA update in one
    autograd function of GEMMs (:func:`lit_liger.swap.lora.lora_linear`: no grouped conv1d, zero-padded update, cat or
    scaling op). LitGPT's forward runs when merged, under ``torch.compile`` (inductor fuses LitGPT's ops itself),
    under autocast, for a quantized or hooked base Linear, or for sharded (DTensor / ZeRO-3) LoRA weights."""

    #: merge() gives a base weight shared with the embedding (``LigerConfig.tied_weights``) its own copy first
    _liger_merge_owns = True

    def merge(self) -> None:
        _tied.own_copy(self.linear.weight)  # merging writes into the base weight in place
        super().merge()

    def _liger_lora_here(self, x: torch.Tensor) -> bool:
        a = self.lora_A
        return (
            not self.merged
            and not torch.compiler.is_compiling()
            and not torch.is_autocast_enabled(x.device.type)
            and (_plain_linear(self.linear) or _4bit_linear(self.linear, x) or self._liger_fp8_base(x))
            and not hasattr(a, "ds_id") and not _is_dtensor(a)
            and x.dtype == a.dtype == self.lora_B.dtype
            and (x.dtype == self.linear.weight.dtype or is_quantized(self.linear.weight))
            and (isinstance(self.lora_dropout, nn.Dropout) or not isinstance(self.lora_dropout, nn.Module))
            and _called_plainly(self.linear)
        )

    def _liger_fp8_base(self, x: torch.Tensor) -> bool:
        """``LigerConfig.fp8`` tensorwise: a frozen float8 base Linear whose GEMMs the LoRA function runs itself."""
        lin = self.linear
        return is_float8_linear(lin) and not lin.weight.requires_grad and tensorwise_fusable(x, lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._liger_lora_here(x):
            return super().forward(x)
        drop = self.lora_dropout  # nn.Dropout, or LitGPT's identity lambda when lora_dropout == 0
        p = drop.p if isinstance(drop, nn.Dropout) and drop.training and drop.p > 0 else 0.0
        lin = self.linear
        if p and type(drop) is nn.Dropout and not drop.inplace and p < 1 and x.is_contiguous() \
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and _called_plainly(drop):
            # the dropout drawn inside the LoRA function, its mask kept inside its output (2 bytes an element, not 3)
            return lora_linear(x, lin.weight, lin.bias, self.lora_A, self.lora_B, self.scaling, lora_parts(self),
                               fp8=is_float8_linear(lin), dropout=p)
        xd = drop(x) if p else None  # (B, T, C)
        return lora_linear(x, lin.weight, lin.bias, self.lora_A, self.lora_B, self.scaling, lora_parts(self), xd,
                           fp8=is_float8_linear(lin))


class _EmbeddingMixin:
    """The token embedding: while ``torch.compile`` traces a training forward, the weight's gradient comes from
    one op (:func:`embedding`); inside a capture's ``grads_into`` it is added into ``.grad`` by that op; otherwise
    ``nn.Embedding``'s own forward (eager mode runs the same ATen kernels).

    While lit-liger's CUDA graphs capture a training step that trains the token embedding (full fine-tuning,
    pretraining), its backward adds the weight's gradient straight into ``.grad`` (``kernels.embedding``: each touched
    row summed in fp32 and added once) instead of a new ``(V, C)`` gradient that a second pass adds: about 2 GB less
    memory traffic per micro-batch at Llama-3.2-1B's vocabulary. Measured on 2 x H200 (Llama-3.2-1B full fine-tuning,
    litgpt's recipe, micro-batch 4, 240 timed iterations): the mean iteration 19.13 -> 18.58 ms on one GPU, 24.09 ->
    23.59 ms on two (``benchmarks/results/h200x2-2026-11-27g``)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        into = _grad_into.target_for(self.weight) is not None
        if torch.is_grad_enabled() and self.weight.requires_grad and (torch.compiler.is_compiling() or into):
            return embedding(self.weight, idx)
        return super().forward(idx)


class _Linear4bitMixin:
    """A bitsandbytes 4-bit Linear (QLoRA's frozen projections without a LoRA update, the lm_head where the loss
    needs logits): :func:`lit_liger.swap.quant.linear_4bit`, the weight decoded straight into the compute dtype (one
    kernel where bitsandbytes' forward decodes to float16 and casts); bitsandbytes' own forward where that does not
    apply (a single row, which bitsandbytes multiplies without decoding; autocast; a hook; a compute dtype other
    than the input's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _4bit_linear(self, x) and x.numel() > x.shape[-1] and not torch.is_autocast_enabled(x.device.type) \
                and _called_plainly(self) and (self.bias is None or self.bias.dtype == x.dtype):
            return linear_4bit(x, self.weight, self.bias)
        return super().forward(x)


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


@torch.compiler.assume_constant_result
def _flash_enabled() -> bool:
    # a global switch read on the host: a constant for torch.compile (dynamo cannot trace it)
    return torch.backends.cuda.flash_sdp_enabled()


def _flash_gqa_ok(attn: nn.Module, q: torch.Tensor) -> bool:
    """SDPA's ``enable_gqa`` only stays on a fused kernel with flash attention: CUDA, 16-bit, head
    size <= 256, flash enabled, LitGPT's plain SDPA (no attention softcapping, no adapter prefix)."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] <= 256
        and attn.config.attention_logit_softcapping is None
        and type(attn).scaled_dot_product_attention is lm.CausalSelfAttention.scaled_dot_product_attention
        and _flash_enabled()
    )


class _AttentionMixin:
    """LitGPT's CausalSelfAttention with q/k RoPE in one launch on the q/k views of the qkv output.

    With LitGPT's per-head qk-norm (``norm_qk_type="default"`` with RMSNorm ``norm_q``/``norm_k``:
    Qwen3, Gemma-3) the norm runs in that same launch; LayerNorm qk-norms and OLMo-2's norm over
    the whole q/k projection keep their modules. Layers with attention logit softcapping (Gemma-2) or
    a sliding window (``apply_sliding_window_attention``) attend through FlexAttention on CUDA tensors
    (``lit_liger.swap.attend``; LitGPT's math elsewhere); the others through SDPA. The KV-cache
    (``input_pos``) calls run LitGPT's forward unchanged.
    """

    def _liger_window(self) -> int | None:
        """This layer's sliding window (LitGPT's ``sliding_window_size`` where the layer applies it)."""
        return self.config.sliding_window_size if self.apply_sliding_window_attention else None

    def _liger_attention_path(self) -> str:
        """``"sdpa"`` (plain causal layer), ``"flex"`` (softcap / sliding window on FlexAttention where the
        tensors are CUDA ones), or why LitGPT's math runs for this softcap / window layer."""
        if self.config.attention_logit_softcapping is None and self._liger_window() is None:
            return "sdpa"
        if not getattr(self, "_liger_flex", True):
            return "flex_attention switched off"
        if not _attention.flex_available():
            return f"FlexAttention needs torch >= 2.5, this is {torch.__version__}"
        if type(self).scaled_dot_product_attention is not lm.CausalSelfAttention.scaled_dot_product_attention:
            return f"{getattr(self, '_liger_orig_class', type(self)).__module__}'s own scaled_dot_product_attention"
        return "flex"

    def _liger_flex_here(self, q: torch.Tensor) -> bool:
        """Whether this call attends through FlexAttention (``q``: the query, or the layer's input)."""
        return (
            (q.is_cuda or _attention._FLEX_ON_CPU)
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and self._liger_attention_path() == "flex"
        )

    def _liger_softcap_kernel_here(self, q: torch.Tensor, T: int) -> bool:
        """Whether this call runs lit-liger's Triton softcap attention (``kernels/attention.py``): a softcap layer
        whose sequence fits inside its window (or that has none), where FlexAttention would otherwise serve it;
        bf16/fp16 NVIDIA CUDA tensors (measured faster there; fp32 and ROCm keep FlexAttention), or CPU ones of any float
        dtype under Triton's interpreter."""
        cfg = self.config
        return (
            cfg.attention_logit_softcapping is not None
            and getattr(self, "_liger_softcap_kernel", True)
            and supported_head_size(cfg.head_size)
            and (q.dtype in (torch.float16, torch.bfloat16) or (q.dtype == torch.float32 and not q.is_cuda))
            and use_triton(q)
            and torch.version.hip is None  # measured on NVIDIA; ROCm keeps FlexAttention
            and _attention.effective_window(T, self._liger_window()) is None
            and self._liger_attention_path() == "flex"
        )

    def _liger_packable(self) -> str | None:
        """Why this layer cannot attend inside packed samples (``LigerConfig.packing``), or None: attention logit
        softcapping only through lit-liger's softcap kernel (its variable-length form; flash attention has no
        softcap), LitGPT's own ``scaled_dot_product_attention`` (an adapter's prefix attention has its own)."""
        if self.config.attention_logit_softcapping is not None:
            if not getattr(self, "_liger_softcap_kernel", True):
                return "attention logit softcapping with softcap_attention switched off (no variable-length kernel)"
            if not supported_head_size(self.config.head_size):
                return (f"attention logit softcapping with head size {self.config.head_size} (lit-liger's softcap "
                        "kernel takes powers of two from 16 to 256)")
        if type(self).scaled_dot_product_attention is not lm.CausalSelfAttention.scaled_dot_product_attention:
            return f"{getattr(self, '_liger_orig_class', type(self)).__module__}'s own scaled_dot_product_attention"
        return None

    def _liger_packed_softcap_here(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether this softcap layer attends packed samples through lit-liger's softcap kernel with sample starts
        (``kernels/attention.py``; a sliding window folded into the starts): 16-bit NVIDIA CUDA tensors, or CPU ones
        under Triton's interpreter (any float dtype). Elsewhere (CPU tensors without the interpreter) LitGPT's math
        runs per sample."""
        if self.config.attention_logit_softcapping is None or self._liger_packable() is not None:
            return False
        if device.type == "cuda":
            return dtype in (torch.float16, torch.bfloat16) and torch.version.hip is None
        return device.type == "cpu" and use_triton(torch.empty(0, device=device, dtype=dtype))

    def _liger_attend_packed(self, q, k, v, pack: _packing.Pack, scale: float) -> torch.Tensor:
        """Attention inside each sample of a packed sequence: q ``(1, nh, N, hs)``, k/v ``(1, ng, N, hs)`` ->
        ``(1, N, nh, hs)``; a sliding window as LitGPT applies it."""
        if (why := self._liger_packable()) is not None:  # (GPT.forward packs only models whose layers all can)
            raise RuntimeError(f"lit-liger packing reached a layer that cannot attend packed samples: {why}")
        window = self._liger_window()
        n_head, n_groups = self.config.n_head, self.config.n_query_groups

        def per_sample(qs, ks, vs, T):  # LitGPT's math on one sample (the reference path: CPU tensors)
            w = _attention.effective_window(T, window)
            mask = _attention.dense_mask(T, w, qs.device, qs.dtype) if w is not None else None
            if n_groups != n_head:
                ks = ks.repeat_interleave(n_head // n_groups, dim=1)
                vs = vs.repeat_interleave(n_head // n_groups, dim=1)
            return self.scaled_dot_product_attention(qs, ks, vs, mask)  # (1, T, nh, hs)

        softcap = self.config.attention_logit_softcapping
        kernel = softcap is not None and self._liger_packed_softcap_here(q.device, q.dtype)
        return _packing.attend(q, k, v, pack, scale, window, per_sample, softcap=softcap, softcap_kernel=kernel)

    def _liger_proj(self, y: torch.Tensor) -> torch.Tensor:
        """``self.proj(y)``; a plain Linear whose weight gradient ``lit_liger.runtime.graphs`` adds straight into ``.grad``
        (``kernels._grad_into``, while a backward is captured) runs as the op that does."""
        proj = self.proj
        if type(proj) is nn.Linear and _grad_into.target_for(proj.weight) is not None:
            return _grad_into.linear(y, proj.weight, proj.bias)
        return proj(y)

    def _liger_qk_norm(self) -> dict | None:
        """``rope``'s qk-norm arguments when ``norm_q``/``norm_k`` are LitGPT RMSNorms of each head
        (swapped by lit-liger or not) with one eps and offset; else None (the modules run)."""
        cfg = self.config
        if not (cfg.norm_qk and cfg.norm_qk_type == "default") or not getattr(self, "_liger_fuse_qk_norm", True):
            return None
        nq, nk = self.norm_q, self.norm_k
        if not (isinstance(nq, lm.RMSNorm) and isinstance(nk, lm.RMSNorm)):
            return None
        if nq.dim != -1 or nk.dim != -1 or nq.eps != nk.eps or nq.add_unit_offset != nk.add_unit_offset:
            return None
        offset = 1.0 if nq.add_unit_offset else 0.0
        return {"q_weight": nq.weight, "k_weight": nk.weight, "eps": nq.eps, "offset": offset}

    def _liger_sdpa_flags(self, q: torch.Tensor) -> tuple | None:
        """The SDPA flags of ``LigerConfig.sdpa_backend`` for this call (None: PyTorch's own choice): CUDA
        tensors in eager mode; resolved once per device (``attention.sdpa_backend_for``)."""
        if not q.is_cuda or torch.compiler.is_compiling():
            return None
        cache = self.__dict__.setdefault("_liger_sdpa_cache", {})
        # (q: (B, n_head, T, head_size); a long sequence is PyTorch's choice even uncaptured, see sdpa_backend_for)
        key = (q.device, _attention.CAPTURING[0] or q.size(-2) >= _attention.SDPA_LONG)
        flags = cache.get(key, False)
        if flags is False:
            backend = _attention.sdpa_backend_for(getattr(self, "_liger_sdpa", "auto"), *key)
            flags = cache[key] = _attention.SDPA_BACKENDS[backend]
        return flags

    def forward(self, x, cos, sin, mask=None, input_pos=None, input_pos_maxp1=None):
        # small micro-batches under torch.compile: LitGPT's code, except where FlexAttention serves a softcap /
        # window layer (compile would trace LitGPT's row-by-row window mask and keep (B, nh, T, T) scores)
        if input_pos is not None or (_stock_under_compile(self, x) and not self._liger_flex_here(x)):
            return super().forward(x, cos, sin, mask, input_pos, input_pos_maxp1)
        return self._liger_attend(self.qkv(x), cos, sin, mask)  # qkv: (B, T, (nh + 2 * ng) * hs)

    def _liger_attend(self, qkv, cos, sin, mask=None):
        """The attention after the qkv projection (training / no-cache path). ``mask``: as in LitGPT, an
        explicit mask replaces the causal one, except in a sliding-window layer (LitGPT uses its window
        mask there)."""
        cfg = self.config
        hs, n_head, n_groups = cfg.head_size, cfg.n_head, cfg.n_query_groups
        B, T, _ = qkv.size()
        if not cfg.norm_qk:
            # q, k, v views of qkv with rotary on the first rope_n_elem dims of every q and k head (one
            # launch); in backward that kernel writes the whole qkv gradient (no split concatenation)
            q, k, v = rope_qkv(qkv, cos, sin, n_head, n_groups, cfg.rope_interleave)  # (B, nh|ng, T, hs)
        else:
            q, k, v = qkv.split((n_head * hs, n_groups * hs, n_groups * hs), dim=-1)
            if cfg.norm_qk_type == "olmo2":
                q, k = self.norm_q(q), self.norm_k(k)
            q = q.view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs), a strided view
            k = k.view(B, T, n_groups, hs).transpose(1, 2)  # (B, ng, T, hs)
            v = v.view(B, T, n_groups, hs).transpose(1, 2)  # (B, ng, T, hs)
            qk_norm = self._liger_qk_norm()  # per-head RMSNorm of q and k fused into the rope launch
            if cfg.norm_qk_type == "default" and qk_norm is None:
                q, k = self.norm_q(q), self.norm_k(k)
            # rotary on the first rope_n_elem dims of every q and k head, tail passed through: one launch
            q, k = rope(q, k, cos, sin, interleave=cfg.rope_interleave, **(qk_norm or {}))  # (B, nh|ng, T, hs)
        window = self._liger_window()
        scale = 1.0 / math.sqrt(cfg.attention_scores_scalar or hs) * self.mscale * self.mscale  # LitGPT's
        if isinstance(mask, _packing.Pack):  # LigerConfig.packing: B = 1, the samples end to end
            y = self._liger_attend_packed(q, k, v, mask, scale)  # (1, N, nh, hs)
            return self._liger_proj(y.reshape(B, T, hs * n_head))
        if window is not None or cfg.attention_logit_softcapping is not None:
            if (window is not None or mask is None) and self._liger_softcap_kernel_here(q, T):
                # causal + softcap in lit-liger's kernel; its output is a (B, nh, T, hs) view of (B, T, nh, hs)
                y = softcap_attention(q, k, v, scale, cfg.attention_logit_softcapping)
                return self._liger_proj(y.transpose(1, 2).reshape(B, T, hs * n_head))  # a view, no copy
            if (window is not None or mask is None) and self._liger_flex_here(q):
                # softcap as score_mod, LitGPT's causal / window mask as a block mask, GQA without copies
                y = _attention.flex_attend(q, k, v, scale=scale, softcap=cfg.attention_logit_softcapping,
                                           window=window)  # (B, nh, T, hs)
                y = y.transpose(1, 2).reshape(B, T, hs * n_head)  # (B, T, C*)
                return self._liger_proj(y)  # (B, T, C)
            if window is not None:  # LitGPT's math below, with its window mask built without a loop
                mask = _attention.dense_mask(T, window, q.device, q.dtype)  # (1, 1, T, T)
        with _attention.sdpa_flags(self._liger_sdpa_flags(q)):  # LigerConfig.sdpa_backend (eager, CUDA)
            if n_groups != n_head and mask is None and _flash_gqa_ok(self, q):
                # flash attention reads the kv heads shared by each query group directly: no (B, nh, T, hs)
                # copies of k and v (LitGPT's repeat_interleave), which autograd would also keep for backward
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=scale, is_causal=True,
                                                   enable_gqa=True)
                y = y.transpose(1, 2)  # (B, T, nh, hs)
            else:
                if n_groups != n_head:
                    q_per_kv = n_head // n_groups
                    k = k.repeat_interleave(q_per_kv, dim=1)  # (B, nh, T, hs)
                    v = v.repeat_interleave(q_per_kv, dim=1)  # (B, nh, T, hs)
                y = self.scaled_dot_product_attention(q, k, v, mask)  # (B, T, nh, hs)
        y = y.reshape(B, T, hs * n_head)  # (B, T, C*)
        return self._liger_proj(y)  # (B, T, C)


class _BlockMixin:
    """LitGPT's Block on lit-liger's kernels, for every residual layout ``Config`` flags give (no per-family code).

    Non-parallel residual: ``x = attn + x; norm_2(x)`` in one kernel, :func:`rms_norm_residual` for an RMSNorm
    ``norm_2`` (Llama-like), :func:`layer_norm_residual` for a LayerNorm one (OLMo-1, StableLM-3B); without a
    ``norm_2`` (OLMo-2: Identity, with post-attention / post-MLP norms) LitGPT's adds, its swapped norms and MLP.

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
        else:
            x_normed = n1(x)
            attention_output = self.attn(x_normed, cos, sin, mask, input_pos, input_pos_maxp1)
        attention_output = self.post_attention_norm(attention_output)
        if attention_output.dtype != x.dtype or attention_output.shape != x.shape:
            # mixed dtypes (autocast): keep LitGPT's promotion semantics
            x = attention_output + x
            return self.post_mlp_norm(self.mlp(n2(x))) + x
        if not isinstance(n2, _RMSNormMixin):
            if isinstance(n2, _LayerNormMixin) and _called_plainly(n2):  # (LayerNorm: OLMo-1, StableLM-3B)
                x, x_normed = layer_norm_residual(attention_output, x, n2.weight, n2.bias, n2.eps)  # (B, T, C) x2
            else:  # no norm_2 (OLMo-2's Identity) or one left to LitGPT: LitGPT's add
                x = attention_output + x
                x_normed = n2(x)
            return self.post_mlp_norm(self.mlp(x_normed)) + x
        offset = 1.0 if n2.add_unit_offset else 0.0
        if self._liger_fuse_norm_2(x=x):
            mlp = self.mlp
            if is_float8_linear(mlp.fc_1):  # LigerConfig.fp8 (see norm_1); a, b as below
                if is_float8_linear(mlp.proj) and tensorwise_fusable(x, mlp.fc_1, mlp.fc_2, mlp.proj) \
                        and _fp8_fusable(x, mlp.proj):  # the whole MLP on lit-liger's casts
                    x, mlp_out = norm_mlp_fp8(attention_output, x, n2, mlp, mlp._liger_activation)
                    return self.post_mlp_norm(mlp_out) + x
                x, (a, b) = norm_linear_fp8(attention_output, n2, [mlp.fc_1, mlp.fc_2], residual=x)
                mlp_out = _glu_proj(mlp.proj, a, b, mlp._liger_activation, reuse=False)
                return self.post_mlp_norm(mlp_out) + x
            if self._liger_recompute_mlp_here(x):  # LigerConfig.recompute_mlp: fc_1 / fc_2 outputs not kept
                fc_1, fc_2, proj = mlp.fc_1, mlp.fc_2, mlp.proj
                x, mlp_out = rms_norm_glu_mlp(attention_output, x, n2.weight, n2.eps, offset, fc_1.weight, fc_1.bias,
                                              fc_2.weight, fc_2.bias, proj.weight, proj.bias, mlp._liger_activation)
                return self.post_mlp_norm(mlp_out) + x
            x, (a, b) = rms_norm_linear(attention_output, n2.weight, [(mlp.fc_1.weight, mlp.fc_1.bias),
                                        (mlp.fc_2.weight, mlp.fc_2.bias)], n2.eps, offset, residual=x)
            # a, b (B, T, I): new outputs of the fused function, which keeps neither for its backward
            mlp_out = _glu_proj(mlp.proj, a, b, mlp._liger_activation, reuse=True)
        else:
            x, x_normed = rms_norm_residual(attention_output, x, n2.weight, n2.eps, offset)  # (B, T, C) x2
            mlp_out = self.mlp(x_normed)
        return self.post_mlp_norm(mlp_out) + x


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
        return self.post_mlp_norm(self.mlp(x_normed_2)) + x


#: tests set this to bucket CPU runs too (on a CPU there are no per-shape plans or graphs to save)
_BUCKETS_ON_CPU = False


def _buckets_here(idx: torch.Tensor) -> bool:
    """Pad to buckets on GPU tensors in eager mode (``torch.compile`` handles shapes its own way)."""
    return (idx.is_cuda or _BUCKETS_ON_CPU) and not torch.compiler.is_compiling()


#: tests set this to pack CPU batches too (reference attention per sample)
_PACK_ON_CPU = False

#: where no data loader laid a batch out on the host (``lit_liger.runtime.batches``: a training loop of the user's own, litgpt's
#: pretraining), packing reads the batch's lengths from the device, a host sync that empties the GPU's queue. While
#: every batch read so far filled its length (no padding: pretraining, where such a batch runs unpacked anyway), a model
#: reads them only at these batches of its run, then at every multiple of the last; the others run unpacked, unread.
#: Unpacked is always right (the padding computed, its targets ignored): a padded batch between two reads costs its
#: padding until the next read finds one, from which on every batch is read (and packed). Found by the single-GPU tests
#: (``test_gpu_training_step_has_no_host_sync``: a full batch's step read its lengths every time)
LENGTH_READS = (1, 4, 16, 64, 256)


def _reads_lengths_at(n: int) -> bool:
    """Whether a model whose batches have all filled their length reads the lengths of its ``n``-th (from 1)."""
    return n in LENGTH_READS or n % LENGTH_READS[-1] == 0


def _lengths_sync(idx: torch.Tensor) -> bool:
    """Reading ``idx``'s lengths is a host sync (a device tensor)."""
    return idx.device.type != "cpu"


@contextlib.contextmanager
def fused_loss_without_grad(model: nn.Module) -> Iterator[None]:
    """While active, the forward of a swapped GPT in ``model`` without grad (and without a KV cache) returns :class:`LigerLogits` as
    in training, for a caller whose loss is ``lit_liger.chunked_cross_entropy``: validation then computes the fused
    loss and never holds the ``(B, T, V)`` logits (litgpt's ``validate``: 525 MB in bf16 and again in fp32 at 4 x 512
    tokens of a 128k vocabulary, more than a LoRA training step keeps). The CLI turns it on around litgpt's
    ``validate``; anything else without grad (generation, a user's own evaluation) gets real logits."""
    states = list(states_in(model))
    before = [st.fused_loss_without_grad for st in states]
    for st in states:
        st.fused_loss_without_grad = True
    try:
        yield
    finally:
        for st, b in zip(states, before):
            st.fused_loss_without_grad = b


class _GPTMixin:
    """In training (grad enabled, no KV cache; also without grad inside :func:`fused_loss_without_grad`) return
    :class:`LigerLogits` instead of logits.

    With ``seq_buckets`` the token ids are right-padded to a bucket length first (the LigerLogits keeps
    the caller's rows as its window, the padded rows' targets are ignored); with ``cuda_graphs`` the
    body (:meth:`_liger_hidden`) runs as captured CUDA graphs where it can (``lit_liger.runtime.graphs``)."""

    def forward(self, idx, input_pos=None, input_pos_maxp1=None, lm_head_chunk_size=0):
        if getattr(self, "_liger_tied_weights", False) and not torch.compiler.is_compiling():
            _tied.share_if_tied(self)  # (LigerConfig.tied_weights: one copy of a frozen head equal to the embedding)
        grad = torch.is_grad_enabled()
        state = state_of(self)
        rt = state.runtime  # (lit_liger.runtime.attach: None where only swapped, eager kernels)
        if input_pos is not None and not grad and rt is not None:  # (generation's one-token steps: CUDA graphs)
            out = rt.decode_step(self, super().forward, idx, input_pos, input_pos_maxp1, lm_head_chunk_size)
            if out is not None:
                return out
        if input_pos is not None or not (grad or state.fused_loss_without_grad) or _zero3_returns_logits(self) \
                or _int8_head(self):
            return super().forward(idx, input_pos, input_pos_maxp1, lm_head_chunk_size)
        T = idx.size(1)
        if self.max_seq_length < T:
            raise ValueError(f"Cannot forward sequence of length {T}, max seq length is only {self.max_seq_length}.")
        counted = grad and not torch.compiler.is_compiling()
        if counted:
            state.tokens["collated"] += idx.numel()
            if getattr(self, "_liger_fp8_eager_warning", False):
                _warn_fp8_eager(self)
            if getattr(self, "_liger_fp8_small_warning", False) and idx.numel() < FP8_SMALL_TOKENS:
                _warn_fp8_small(self, idx.numel())
        plan = self._liger_plan(idx) if grad else None
        if plan is None:
            out = self._liger_output(idx, counted)
        else:  # LigerConfig.packing: the samples end to end, no padding computed
            state.tokens["processed"] += plan.idx.numel()
            state.tokens["packed"] += idx.numel()
            x = self._liger_body(plan.idx, None, plan)  # (1, N, C)
            out = LigerLogits(
                x[0], self.lm_head, self.config.final_logit_softcapping, self.config.padded_vocab_size,
                self._liger_flce_mode, None, x.dtype, 0, None, max_chunk_bytes=self._liger_chunk_cap(x),
                rows=plan.rows, unpacked=functools.partial(self._liger_output, idx, False), left_out=plan.check,
                x_lora=head_lora_input(self.lm_head, x[0]), state=state,
            )
        return [out] if lm_head_chunk_size > 0 else out

    def _liger_plan(self, idx: torch.Tensor) -> _packing.Plan | None:
        """The packed form of this training batch (``LigerConfig.packing``), or None: packing off or not applicable
        here (see :func:`_packing_why`), or nothing to save (one row, no padding)."""
        if not getattr(self, "_liger_packing", False) or idx.dim() != 2 or torch.compiler.is_compiling():
            return None
        if getattr(self, "_liger_pack_why", None) is not None or sharded_processes(self):
            return None
        if idx.is_cuda:
            if not _packing_device_ok(self, idx.device, self.transformer.wte.weight.dtype):
                return None
        elif not _PACK_ON_CPU:
            return None
        bucketed = getattr(self, "_liger_seq_buckets", False)
        plan = _packing.ready_plan(idx, bucketed, self.cos.size(0))  # planned by the data loader (no host sync)
        if plan is None:
            if idx.size(0) < 2:
                return None  # (one row: nothing to pack)
            if not self.__dict__.get("_liger_padded_seen") and _lengths_sync(idx):
                n = self.__dict__["_liger_unread"] = self.__dict__.get("_liger_unread", 0) + 1
                if not _reads_lengths_at(n):
                    return None  # (every batch read so far filled its length: unpacked, see LENGTH_READS)
            plan = _packing.plan(idx, packed_bucket_length if bucketed else None, self.cos.size(0))
        if plan is not None and plan.real < idx.numel():
            self.__dict__["_liger_padded_seen"] = True
        elif plan is not None and not self.__dict__.get("_liger_padded_seen"):
            # a batch without padding (packing.PACK_FULL) is packed only in a run whose batches have had padding
            # (instruction data: such a batch is rare there, and packed it needs no shape of its own); where every
            # batch so far filled its length (pretraining), it runs unpacked, one shape with cuDNN attention
            return None
        return plan

    def _liger_output(self, idx: torch.Tensor, counted: bool) -> LigerLogits:
        """The training output of the batch ``idx`` as LitGPT computes it (padded rows; right-padded further to a
        bucket with ``seq_buckets``)."""
        T = idx.size(1)
        if getattr(self, "_liger_seq_buckets", False) and _buckets_here(idx):
            T_pad = bucket_length(T, self.max_seq_length)
            if T_pad != T:
                idx = F.pad(idx, (0, T_pad - T), value=0)  # (B, T_pad): causal attention, the pad comes last
        if counted:
            state_of(self).tokens["processed"] += idx.numel()
        # Taken first so that, in backward, its copy's gradient reaches the sharded parameter after
        # every other node of the model (autograd runs the most recently created ready node first):
        # by then the strategy's pre-backward hook on `hidden` has fired (see LigerLogits).
        head = _sharded_head_snapshot(self, self.lm_head)
        x = self._liger_body(idx, head)  # (B, T_pad, C)
        return LigerLogits(
            x, self.lm_head, self.config.final_logit_softcapping, self.config.padded_vocab_size,
            self._liger_flce_mode, head, x.dtype, 0, T if x.shape[1] != T else None,
            max_chunk_bytes=self._liger_chunk_cap(x),
            x_lora=head_lora_input(self.lm_head, x),  # (B, T_pad, C): a LoRA head's dropout, drawn where stock does
            state=state_of(self),
        )

    def set_kv_cache(self, *args, **kwargs):
        if (rt := state_of(self).runtime) is not None:
            rt.decode_drop(self)  # (its graph was captured on the cache being replaced)
        return super().set_kv_cache(*args, **kwargs)

    def clear_kv_cache(self):
        if (rt := state_of(self).runtime) is not None:
            rt.decode_drop(self)
        return super().clear_kv_cache()

    def _liger_body(self, idx: torch.Tensor, head: GatheredHead | None,
                    plan: _packing.Plan | None = None) -> torch.Tensor:
        """:meth:`_liger_hidden`, through the captured CUDA graphs where they apply (``cuda_graphs``)."""
        x = runner = None
        if not torch.compiler.is_compiling():  # (Blocks recomputed, inputs offloaded): read by the graphs, the body
            self._liger_mem_now = _memory_plan_here(self, idx)
        graphs = getattr(self, "_liger_cuda_graphs", False)  # True, False or None (automatic)
        rt = state_of(self).runtime
        if graphs is not False and rt is not None and head is None and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # (under torch.compile: not traced at all; making the runner registers global module hooks, which a
            # traced graph must not do)
            runner = rt.runner(self)
            x = runner.hidden(idx, auto=graphs is None, plan=plan)  # None where capture does not apply
        if x is None:
            x = self._liger_hidden(idx, plan)
            if runner is not None:
                runner.note_hidden(x)  # (the first micro-batch runs uncaptured: graphs.EAGER_FIRST)
        return x

    def _liger_chunk_cap(self, x: torch.Tensor) -> int | None:
        # With activation checkpointing the step keeps little beside the Blocks' inputs: the loss's logits chunk
        # is capped at their size, or its buffer (a (rows, V) chunk, 125 MiB at 512 rows of a 128k vocabulary)
        # would be the step's peak (measured, H100, Llama-3.2-1B LoRA at 1 x 512: 125 of the step's 163 MiB).
        # Not under torch.compile (the sizes may be symbolic there): the kernel's default chunk.
        recomputed = getattr(self, "_liger_mem_now", (0, False, 0))[0]
        if recomputed and not torch.compiler.is_compiling():
            return recomputed * x.numel() * x.element_size()
        return None

    def _liger_hidden(self, idx: torch.Tensor, plan: _packing.Plan | None = None,
                      taps: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Token ids ``(B, T)`` -> final hidden states ``(B, T, C)`` (embedding, blocks, ``ln_f``). ``plan``: ``idx``
        is a packed sequence ``(1, N)`` (its positions and samples' boundaries). Where ``lit_liger._dist.GRADS_READY``
        has callbacks, the input of each Block at ``_dist.segment_cuts`` goes into ``taps`` (the CUDA graphs' capture
        splits its backward there) or, without ``taps``, gets a gradient hook that runs the callbacks."""
        T = idx.size(1)
        pack = None
        if plan is not None:  # each token at its position inside its sample
            cos, sin, pack = self.cos[plan.positions].unsqueeze(0), self.sin[plan.positions].unsqueeze(0), plan.pack
        else:
            cos = self.cos[:T].unsqueeze(0)  # (1, T, rope_n_elem)
            sin = self.sin[:T].unsqueeze(0)
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.scale_embeddings:
            x = x * torch.tensor(self.config.n_embd**0.5, dtype=x.dtype)
        ri = self.config.rope_indices
        # LigerConfig.activation_checkpointing: the lowest `recompute` Blocks keep only their input (in host memory
        # with `offload`) and rerun in backward, the `mlp` Blocks above them keep no MLP input (see _memory_plan_here,
        # lit_liger.runtime.memplan)
        recompute, offload, mlp = (_memory_plan_here(self, idx) if torch.compiler.is_compiling()
                                   else getattr(self, "_liger_mem_now", None) or _memory_plan_here(self, idx))
        cuts = {} if torch.compiler.is_compiling() else {
            b: j for j, b in enumerate(_dist.segment_cuts(self), 1)}
        for block_idx, block in enumerate(self.transformer.h):
            if block_idx in cuts:
                if taps is not None:
                    taps[block_idx] = x
                elif x.requires_grad:  # (the Blocks from here up have their gradients when x has its own)
                    x.register_hook(functools.partial(_segment_ready, self, cuts[block_idx]))
            c, s = (cos[..., ri[block_idx]], sin[..., ri[block_idx]]) if ri is not None else (cos, sin)
            if block_idx < recompute and offload:  # reentrant: the checkpoint saves its input, which the hooks move
                if not x.requires_grad:  # (a frozen embedding's output: the reentrant checkpoint needs one input with
                    x = x.detach().requires_grad_()  # grad, or the Block's trainable parameters get none)
                with state_of(self).runtime.offloaded(self.config.n_embd):
                    x = _checkpoint(_checkpointed_block, block, x, c, s, pack, use_reentrant=True,
                                    preserve_rng_state=True)
            elif block_idx < recompute:  # only x is kept; the Block reruns in backward
                if torch.compiler.is_compiling():  # (a traced checkpointed region allows no Python side effect)
                    x = _checkpoint(block, x, c, s, pack, None, None, use_reentrant=False, preserve_rng_state=True)
                else:
                    # without early stop (which ends the recompute by raising from inside the last saving op, here
                    # glu_mlp's autograd Function: seen to turn into a SystemError under CUDA memory history); the
                    # recompute then also runs what follows that op in the Block, a residual add
                    with _checkpoint_early_stop(False):
                        x = _checkpoint(_checkpointed_block, block, x, c, s, pack, use_reentrant=False,
                                        preserve_rng_state=True)
            elif block_idx < recompute + mlp:
                with _scoped(block, _MLP_RECOMPUTED):
                    x = block(x, c, s, pack, None, None)
            else:
                x = block(x, c, s, pack, None, None)
        return self.transformer.ln_f(x)  # (B, T, C)


def _segment_ready(gpt: nn.Module, segment: int, grad: torch.Tensor) -> None:
    """A gradient hook: the trainable parameters of ``segment`` have their gradients (``_dist.GRADS_READY``)."""
    _dist.grads_ready(gpt, segment)


def _packing_device_ok(gpt: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether every layer attends packed samples on this CUDA device and dtype: softcap layers through lit-liger's
    softcap kernel with sample starts, the others through flash attention over cumulative lengths."""
    flash = None
    for block in gpt.transformer.h:
        attn = block.attn
        if attn.config.attention_logit_softcapping is not None:
            if not attn._liger_packed_softcap_here(device, dtype):
                return False
        else:
            if flash is None:
                flash = _packing.flash_varlen_ok(device, dtype, gpt.config.head_size)
            if not flash:
                return False
    return True


def _packing_why(gpt: nn.Module) -> str | None:
    """Why this GPT's training batches cannot be packed (``LigerConfig.packing``), or None: every layer's attention
    must be lit-liger's and able to attend inside packed samples."""
    for i, block in enumerate(gpt.transformer.h):
        attn = getattr(block, "attn", None)
        if not isinstance(attn, _AttentionMixin):
            return f"transformer.h.{i}.attn is LitGPT's own attention (rope switched off, or latent attention)"
        if (why := attn._liger_packable()) is not None:
            return f"transformer.h.{i}.attn: {why}"
    return None


def _memory_plan_here(gpt: nn.Module, idx: torch.Tensor) -> tuple[int, bool, int]:
    """``(Blocks recomputed, their inputs offloaded, Blocks above them whose MLP inputs are recomputed)`` for this
    forward of ``idx``: ``activation_checkpointing`` ``True`` every Block, ``False`` none, ``None`` (automatic)
    :func:`lit_liger.runtime.memplan.decide` from the micro-batch's tokens and the device's memory now (a CUDA device, eager
    mode; the log says each plan that recomputes more than any before it)."""
    setting = getattr(gpt, "_liger_activation_checkpointing", False)
    if setting is False or not _checkpoint_blocks_here(gpt):
        return 0, False, 0
    n = gpt.config.n_layer
    if setting is True:
        return n, False, 0
    if torch.compiler.is_compiling() or (idx.is_cuda and torch.cuda.is_current_stream_capturing()):
        return 0, False, 0
    elt = gpt.transformer.wte.weight.element_size() if gpt.transformer.wte.weight.is_floating_point() else 2
    # (host offload is a reentrant checkpoint, which DDP's reducer hooks do not take: not inside a DDP wrapper)
    rt = state_of(gpt).runtime
    if rt is None:  # (swapped without the runtime: no memory plan)
        return 0, False, 0
    plan = rt.memory_plan(gpt, idx.numel(), idx.device, elt, _dist.whole_model(gpt),
                          lambda: _mlp_recomputable(gpt, idx))
    if plan is None:
        return 0, False, 0
    said = gpt.__dict__.setdefault("_liger_mem_said", [-1, False, 0])
    if (plan.recompute, plan.offload, plan.mlp) > tuple(said):
        said[:] = [plan.recompute, plan.offload, plan.mlp]
        if _dist.rank_zero():
            print(plan.line(idx.numel(), n), flush=True)
    return plan.recompute, plan.offload, plan.mlp


def _mlp_recomputable(gpt: nn.Module, idx: torch.Tensor) -> bool:
    """Every Block's GLU MLP can leave its two ``(B, T, I)`` inputs to its backward (the memory plan's MLP level):
    frozen plain projections (``glu_mlp``: it keeps its ``(B, T, C)`` input) or trained ones that
    ``recompute_mlp`` fuses with ``norm_2``; the Triton path."""
    if not use_triton(idx) or torch.is_autocast_enabled(idx.device.type):
        return False
    for block in gpt.transformer.h:
        mlp = getattr(block, "mlp", None)
        if not isinstance(block, _BlockMixin) or not isinstance(mlp, (_SwiGLUMixin, _GeGLUMixin)):
            return False
        linears = (mlp.fc_1, mlp.fc_2, mlp.proj)
        if all(_frozen_linear(m) is not None for m in linears):
            continue  # (glu_mlp)
        if not (all(_plain_linear(m) for m in linears) and block._liger_fuse_norm_2(structure_only=True)
                and (mlp.fc_1.weight.requires_grad or mlp.fc_2.weight.requires_grad)):
            return False  # (LoRA or float8 Linears, or a trained proj beside frozen fc_1 / fc_2: kept as they are)
    return True


def _checkpoint_blocks_here(gpt: nn.Module) -> bool:
    """``LigerConfig.activation_checkpointing`` (on or automatic) applies to this forward: grad enabled, one process
    or a replica (a sharding strategy checkpoints its own wrapped Blocks: warned once where it was asked for)."""
    setting = getattr(gpt, "_liger_activation_checkpointing", False)
    if setting is False or not torch.is_grad_enabled():
        return False
    if sharded_processes(gpt) and setting is None:
        return False  # (automatic: the strategy's own plan, no word)
    if sharded_processes(gpt):
        # (no Python side effects in a trace)
        if not torch.compiler.is_compiling() and state_of(gpt).warn_once("activation_checkpointing sharded"):
            import warnings

            warnings.warn(
                "lit-liger: activation_checkpointing applies to single-process and DDP runs; under this sharding "
                "strategy it is off (use the strategy's own: litgpt's FSDP recipes checkpoint each Block through "
                "activation_checkpointing_policy).", stacklevel=3)
        return False
    return True


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


def _zero3_returns_logits(gpt: nn.Module) -> bool:
    """DeepSpeed ZeRO-3 partitions the lm_head weight. Inside a DeepSpeed engine's forward, reading a
    partitioned parameter outside its module gathers it and registers it with the module whose
    forward is running, which gathers it again for its backward: so when the loss is computed inside
    the engine's forward by a module *around* the GPT (Lightning's Trainer: ``training_step`` runs
    inside the engine's forward), the fused loss reads the weight at loss time and its gradient is
    accumulated while gathered. When the GPT itself is the engine's module (Fabric + DeepSpeed), the
    loss runs after the engine's forward, where the weight is a size-0 partition: the model then
    returns real logits (LitGPT's loss path, every other kernel on), with a warning once.
    """
    lm_head = gpt.lm_head
    weight = getattr(getattr(lm_head, "linear", lm_head), "weight", None)
    if weight is None or not hasattr(weight, "ds_id"):
        return False
    try:
        from deepspeed.runtime.zero.parameter_offload import FWD_MODULE_STACK
    except ImportError:  # a `ds_id` without deepspeed: treat the GPT as the top module
        FWD_MODULE_STACK = []
    # DeepSpeed pushes each module on this stack in its pre-forward hook, and an engine's own module
    # once more when the engine is built: below the GPT's own entry sits the module whose forward
    # called it, or the GPT again when it is the engine's module
    if len(FWD_MODULE_STACK) >= 2 and FWD_MODULE_STACK[-1] is gpt and FWD_MODULE_STACK[-2] is not gpt:
        return False  # an outer module's forward computes the loss: fused, weight read at loss time
    if state_of(gpt).warn_once("zero3 logits"):
        import warnings

        warnings.warn(
            "lit-liger: DeepSpeed ZeRO-3 with the GPT as the engine's module: the loss runs after the engine's "
            "forward, where the lm_head weight is partitioned, so the fused linear cross-entropy is off here (the "
            "model returns logits; all other kernels stay on). Compute the loss inside the engine's forward (a "
            "module around the GPT, as Lightning's Trainer does) to keep it.",
            stacklevel=3,
        )
    return True


def _int8_head(gpt: nn.Module) -> bool:
    """The lm_head is a bitsandbytes int8 layer (quantized after ``apply_liger`` ran): its own forward, real logits
    (see ``lit_liger.swap.loss._linear_weight``)."""
    w = getattr(getattr(gpt.lm_head, "linear", gpt.lm_head), "weight", None)
    return w is not None and is_quantized(w) and not is_4bit(w)


def _is_zero3(lm_head: nn.Module) -> bool:
    return hasattr(getattr(getattr(lm_head, "linear", lm_head), "weight", None), "ds_id")


def _sharded_head_snapshot(gpt: nn.Module, lm_head: nn.Module) -> GatheredHead | None:
    """Under a sharding strategy the lm_head weight is gathered only inside the model's forward
    (FSDP1 may reshard the root's flat parameter when forward returns; FSDP2 holds DTensors;
    ZeRO-3 is handled by :func:`_zero3_returns_logits`), but the loss runs after it. So in a multi-process run, take the
    gathered (V, H) weight (and bias) here, inside forward, as an autograd-connected copy: its
    gradient flows back to the real parameter through the copy, and the sharding strategy reduces it
    as usual. Costs one (V, H) copy per step; single-process runs read the parameter directly."""
    if not sharded_processes(gpt) or _is_zero3(lm_head):  # (one process, or a DDP replica: the parameter is whole)
        return None  # ZeRO-3: read at loss time, inside the engine's forward (see _zero3_returns_logits)
    weight, bias = lm_head_weight_bias(lm_head)  # DTensors gathered; sharded flat params raise here
    lora = lm_head_lora(lm_head)  # a LoRA head: (A (r, C), B (V, r), scaling), gathered the same way
    if lora is not None:
        lora = (lora[0].clone(), lora[1].clone(), lora[2])
    return GatheredHead(weight.clone(), bias.clone() if bias is not None else None, lora)


class _LLMMixin:
    """``litgpt.LLM``: ``logits, loss = llm(input_ids, target_ids)`` gets the fused loss."""

    def forward(self, input_ids, target_ids=None, loss_fn=None):
        logits = self.model(input_ids)
        if target_ids is None:
            return logits
        loss_fn = loss_fn if loss_fn is not None else chunked_cross_entropy
        return logits, loss_fn(logits[..., :-1, :], target_ids[..., 1:])


# ------------------------------------------------------------------------------------------------
# Class swapping
# ------------------------------------------------------------------------------------------------
_CLASSES: dict[tuple[type, type], type] = {}


def _swap_class(module: nn.Module, mixin: type) -> None:
    base = type(module)
    if getattr(module, "_liger_orig_class", None) is not None:
        raise RuntimeError("module already swapped")  # apply_liger restores first; never reached
    key = (base, mixin)
    cls = _CLASSES.get(key)
    if cls is None:
        name = f"Liger{mixin.__name__.strip('_').replace('Mixin', '')}__{base.__module__.replace('.', '_')}__{base.__name__}"
        cls = type(name, (mixin, base), {"__module__": __name__, "__qualname__": name})
        setattr(sys.modules[__name__], name, cls)  # importable by name: pickle/deepcopy work
        _CLASSES[key] = cls
    module._liger_orig_class = base
    module.__class__ = cls


def is_swapped(module: nn.Module) -> bool:
    return getattr(module, "_liger_orig_class", None) is not None


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
#: ``LigerConfig.fp8_all_gather``'s automatic choice (:func:`fp8_all_gather_why`)
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


def remove_liger(model: nn.Module) -> int:
    """Restore every swapped module's original class (and the Linears ``fp8`` replaced). Returns how many were
    restored."""
    n = _restore_fp8(model)
    for m in model.modules():
        orig = getattr(m, "_liger_orig_class", None)
        if orig is not None:
            if getattr(m, "_liger_tied_weights", False):
                _tied.unshare(m)  # the head gets its own copy back, as in stock LitGPT
            m.__class__ = orig
            for attr in [a for a in vars(m) if a.startswith("_liger_")]:
                delattr(m, attr)
            n += 1
    return n


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
@dataclass
class LigerReport:
    swapped: list[tuple[str, str, str]] = field(default_factory=list)  # (path, original class, kernel)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (path, class, reason)

    def add(self, path: str, module: nn.Module, what: str) -> None:
        cls = getattr(module, "_liger_orig_class", None) or type(module)  # the LitGPT class it was
        self.swapped.append((path or "<root>", cls.__name__, what))

    def skip(self, path: str, module: nn.Module | None, why: str) -> None:
        cls = (getattr(module, "_liger_orig_class", None) or type(module)) if module is not None else None
        self.skipped.append((path or "<root>", cls.__name__ if cls is not None else "-", why))

    def count(self, kernel: str) -> int:
        return sum(1 for _, _, k in self.swapped if k == kernel)

    def paths(self, kernel: str) -> list[str]:
        return [p for p, _, k in self.swapped if k == kernel]

    def __str__(self) -> str:
        groups: dict[tuple[str, str], list[str]] = {}
        for path, cls, what in self.swapped:
            groups.setdefault(("swapped", f"{cls} -> {what}"), []).append(path)
        for path, cls, why in self.skipped:
            groups.setdefault(("left alone", f"{cls}: {why}"), []).append(path)
        rows = [(a, b, str(len(p)), _abbrev(p)) for (a, b), p in groups.items()]
        head = ("action", "module -> kernel / reason", "n", "where")
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(3)]
        lines = [f"lit-liger: {len(self.swapped)} modules swapped, {len(self.skipped)} left alone"]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths + [0])).rstrip())
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths + [0])).rstrip())
        return "\n".join(lines)

    __repr__ = __str__


def _abbrev(paths: list[str]) -> str:
    if len(paths) <= 2:
        return ", ".join(paths)
    import re

    pattern = {re.sub(r"\.\d+(?=\.|$)", ".*", p) for p in paths}
    return ", ".join(sorted(pattern)) if len(pattern) <= 2 else f"{paths[0]}, ... ({len(paths)})"


# ------------------------------------------------------------------------------------------------
# apply_liger
# ------------------------------------------------------------------------------------------------
def _has_class_named(module: nn.Module, name: str) -> bool:
    return any(c.__name__ == name for c in type(module).__mro__)


def swap_model(model: nn.Module, config: LigerConfig | dict | bool | None = None,
               attach: Callable[[str, nn.Module, LigerConfig, LigerReport], None] | None = None) -> LigerReport:
    """Swap LitGPT modules inside ``model`` for lit-liger kernels, in place. Idempotent. ``lit_liger.apply_liger``
    calls it with ``attach`` (``lit_liger.runtime.attach.attach``), called for each GPT whose training forward was
    swapped: what gives it CUDA graphs, the memory plan and generation graphs.

    ``model`` is a ``litgpt.GPT`` (also the LoRA / adapter / adapter_v2 subclasses), a
    ``litgpt.LLM``, or any module that holds one (a LightningModule). Meta-device and GPU models
    both work (only classes change). Calling it again first restores the original classes, then
    applies ``config``; ``apply_liger(model, False)`` undoes everything.
    """
    with _real_linear_class():
        return _apply(model, LigerConfig.from_value(config), attach)


@contextlib.contextmanager
def _real_linear_class() -> Iterator[None]:
    """``torch.nn.Linear`` as PyTorch defines it while the swap runs. Inside Fabric's ``init_module`` under a
    bitsandbytes precision (litgpt's ``--quantize bnb.*``, where the ``lit-liger`` command swaps the model it builds),
    Lightning replaces the ``torch.nn.Linear`` attribute by its 4-bit class, and every ``nn.Linear`` check here would
    read that class: the 4-bit layers would not be recognized (none swapped) and plain ones would look quantized."""
    real = torch.nn.modules.linear.Linear
    patched = torch.nn.Linear
    if patched is real:
        yield
        return
    torch.nn.Linear = real
    try:
        yield
    finally:
        torch.nn.Linear = patched


def _apply(model: nn.Module, cfg: LigerConfig, attach: Callable | None = None) -> LigerReport:
    prior = _fp8_decisions(model)
    remove_liger(model)
    report = LigerReport()
    gpts = [(n, m) for n, m in model.named_modules() if isinstance(m, lm.GPT)]
    if not gpts:
        raise TypeError(
            f"apply_liger found no litgpt GPT inside {type(model).__name__}; pass a litgpt.GPT, litgpt.LLM "
            "or a module that holds one (build the model first, e.g. in configure_model)"
        )
    if not cfg.enabled:
        report.skip("", model, "lit-liger disabled by config")
        return report
    for gpt_path, gpt in gpts:
        _apply_gpt(gpt_path, gpt, cfg, report, prior)
        if isinstance(gpt, _GPTMixin):
            state_of(gpt)  # (its counters, warnings and plans: lit_liger.swap.state)
            if attach is not None:
                attach(gpt_path, gpt, cfg, report)
    for path, m in model.named_modules():
        if isinstance(m, LLM) and cfg.fused_linear_cross_entropy:
            _swap_class(m, _LLMMixin)
            report.add(path, m, "fused loss in forward(input_ids, target_ids)")
    return report


def _block_why(block: nn.Module, cfg: LigerConfig) -> str | None:
    """Why LitGPT's Block keeps its own forward (None: it is swapped for :class:`_BlockMixin`). Decided from the
    ``Config`` flags and the Block's norm classes, before they are swapped."""
    c = block.config
    if not cfg.fused_residual:
        return "fused_residual switched off"
    n2 = block.norm_2
    if c.parallel_residual or isinstance(n2, nn.Identity):
        return None  # (parallel residual; OLMo-2's Identity norm_2)
    if isinstance(n2, lm.RMSNorm) and n2.dim == -1:
        return None if cfg.rms_norm else "rms_norm switched off: norm_2 is LitGPT's RMSNorm"
    if isinstance(n2, nn.LayerNorm) and len(n2.normalized_shape) == 1:
        return None if cfg.layer_norm else "layer_norm switched off: norm_2 is LitGPT's LayerNorm"
    return f"norm_2 is {type(n2).__name__}: no residual kernel for it"


def _block_what(block: nn.Module, cfg: LigerConfig) -> str:
    """The report's line for a swapped Block: what its forward fuses (its norms, attention and MLP are reported on
    their own lines)."""
    c = block.config
    if c.parallel_residual:
        if block._liger_dual_norm():
            return "parallel residual: norm_1 and norm_2 of x in one kernel (layer_norm_dual); LitGPT's adds"
        if c.shared_attention_norm:
            return "parallel residual, norm_1 shared with the MLP: LitGPT's adds, nothing to fuse"
        return "parallel residual: norm_1 and norm_2 called one by one (not two LayerNorms of one eps); LitGPT's adds"
    n2 = block.norm_2
    if isinstance(n2, _LayerNormMixin):
        return "residual add + norm_2 fused (layer_norm_residual)"
    if not isinstance(n2, _RMSNormMixin):
        return f"no norm_2 ({type(n2).__name__}; post-attention / post-MLP norms): LitGPT's residual adds, nothing to fuse"
    what = "residual add + norm_2 fused (rms_norm_residual)"
    recomputed = [n for n, ok in (("norm_1", block._liger_fuse_norm_1(structure_only=True)),
                                  ("norm_2", block._liger_fuse_norm_2(structure_only=True))) if ok]
    if recomputed:
        what += f"; {' and '.join(recomputed)} outputs recomputed in backward"
    if cfg.recompute_mlp and "norm_2" in recomputed and type(block.mlp.proj) is nn.Linear:
        what += "; fc_1 and fc_2 outputs recomputed in backward (recompute_mlp)"
    return what


def _apply_gpt(prefix: str, gpt: lm.GPT, cfg: LigerConfig, report: LigerReport,
               prior: dict[int, tuple] | None = None) -> None:
    c = gpt.config
    pre = f"{prefix}." if prefix else ""
    if cfg.fp8 != "off":
        _convert_fp8(pre, gpt, cfg.fp8, report, cfg.fp8_all_gather, prior)
    blocks = []
    flex = False  # some layer attends through FlexAttention (the compile_min_tokens line says so)
    sdpa = False  # some layer attends through SDPA (the sdpa_backend line)
    for name, m in gpt.named_modules():
        path = pre + name if name else prefix
        if isinstance(m, lm.RMSNorm):
            if not cfg.rms_norm:
                report.skip(path, m, "rms_norm switched off")
            elif m.dim != -1:
                report.skip(path, m, f"normalizes dim {m.dim}, not the last")
            else:
                _swap_class(m, _RMSNormMixin)
                report.add(path, m, "rms_norm" + (" (unit offset)" if m.add_unit_offset else ""))
        elif isinstance(m, nn.LayerNorm):
            if not cfg.layer_norm:
                report.skip(path, m, "layer_norm switched off")
            elif len(m.normalized_shape) != 1:
                report.skip(path, m, f"normalized_shape {m.normalized_shape} is not 1-D")
            else:
                _swap_class(m, _LayerNormMixin)
                report.add(path, m, "layer_norm" + ("" if m.weight is not None else " (no affine)"))
        elif isinstance(m, nn.Linear) and type(m) is not nn.Linear and is_quantized(m.weight):
            if not cfg.quantized_linear:
                report.skip(path, m, "quantized_linear switched off")
            elif not is_4bit(m.weight):
                report.skip(path, m, "int8 (bitsandbytes) multiplies in int8: its own forward")
            else:
                _swap_class(m, _Linear4bitMixin)
                report.add(path, m, "4-bit (bitsandbytes) Linear: weight decoded straight into the compute dtype, "
                                    "forward and backward GEMMs in one autograd function")
        elif isinstance(m, nn.Embedding) and name == "transformer.wte":
            if not cfg.embedding:
                report.skip(path, m, "embedding switched off")
            elif type(m) is not nn.Embedding or m.padding_idx is not None or m.max_norm is not None \
                    or m.scale_grad_by_freq or m.sparse:
                report.skip(path, m, f"not a plain nn.Embedding ({type(m).__name__}, padding_idx={m.padding_idx}, "
                                     f"max_norm={m.max_norm}, scale_grad_by_freq={m.scale_grad_by_freq}, "
                                     f"sparse={m.sparse})")
            else:
                _swap_class(m, _EmbeddingMixin)
                report.add(path, m, "embedding: under torch.compile, the weight gradient from one op (ATen's "
                                    "kernel, no fp32 (V, C) buffer); eager mode unchanged")
        elif isinstance(m, lm.LLaMAMLP):
            if _has_class_named(m, "GemmaMLP"):
                if cfg.geglu:
                    _swap_class(m, _GeGLUMixin)
                    report.add(path, m, f"geglu (gelu approximate={c.gelu_approximate!r})")
                else:
                    report.skip(path, m, "geglu switched off")
            elif cfg.swiglu:
                _swap_class(m, _SwiGLUMixin)
                report.add(path, m, "swiglu")
            else:
                report.skip(path, m, "swiglu switched off")
        elif isinstance(m, litgpt_lora.LoRALinear):
            if m.r <= 0 or not any(getattr(m, "enable_lora", (True,))):
                pass  # no LoRA update: LitGPT's forward is its base Linear's
            elif not cfg.lora:
                report.skip(path, m, "lora switched off")
            else:
                _swap_class(m, _LoRAMixin)
                parts = ",".join(n for n, on in zip("qkv", getattr(m, "enable_lora", ())) if on)
                report.add(path, m, f"LoRA r={m.r}" + (f" on {parts}" if parts else "")
                           + " in one autograd function of GEMMs (no conv1d / zero pad)")
        elif isinstance(m, lm.GptNeoxMLP):
            if not cfg.gelu:
                report.skip(path, m, "gelu switched off")
            else:
                _swap_class(m, _GeluMLPMixin)
                report.add(path, m, f"gelu (approximate={c.gelu_approximate!r}), fp32 math; with a plain proj, "
                                    "gelu + proj keep only fc's output (gelu_linear)")
        elif isinstance(m, lm.LLaMAMoE):
            report.skip(path, m, "router/dispatch stays LitGPT's (each expert MLP is swapped)")
        elif isinstance(m, lm.MultiheadLatentAttention):
            report.skip(path, m, "latent attention (MLA) keeps LitGPT's code")
        elif isinstance(m, lm.CausalSelfAttention):
            if not cfg.rope:
                report.skip(path, m, "rope switched off")
            else:
                _swap_class(m, _AttentionMixin)
                m._liger_fuse_qk_norm = cfg.rms_norm  # rms_norm switched off: LitGPT's qk-norm modules run
                what = "rope q+k one launch" + (" interleaved" if c.rope_interleave else "")
                if c.rope_n_elem < c.head_size:
                    what += f" (partial {c.rope_n_elem}/{c.head_size})"
                if m._liger_qk_norm() is not None:
                    what += " + qk-norm fused"
                report.add(path, m, what)
                m._liger_flex = cfg.flex_attention
                m._liger_softcap_kernel = cfg.softcap_attention
                m._liger_sdpa = cfg.sdpa_backend
                attn_path = m._liger_attention_path()
                flex = flex or attn_path == "flex"
                sdpa = sdpa or attn_path == "sdpa"
                report.add(path, m, _attention.describe(c.attention_logit_softcapping, m._liger_window(), attn_path,
                                                         triton=cfg.softcap_attention
                                                         and supported_head_size(c.head_size)))
        elif isinstance(m, lm.Block):
            why = _block_why(m, cfg)
            if why is None:
                _swap_class(m, _BlockMixin)
                m._liger_recompute_norm = cfg.recompute_norm
                m._liger_recompute_mlp = cfg.recompute_mlp
                blocks.append((path, m))  # reported below, once its norms, attention and MLP are swapped
            else:
                report.skip(path, m, why)
    if sdpa:
        report.add(prefix, gpt, f"causal attention layers: SDPA backend {cfg.sdpa_backend!r} in eager mode on CUDA"
                                 + (" (uncaptured steps: flash attention on NVIDIA sm80+, no per-shape plans; CUDA-graph "
                                    "captured steps and other devices: PyTorch's choice)"
                                    if cfg.sdpa_backend == "auto" else "") + " (sdpa_backend)")
    min_tokens = cfg.compile_min_tokens
    if min_tokens is None:
        min_tokens = (1 << 34) // (c.n_embd**2)
    if min_tokens > 0:
        for m in gpt.modules():
            if m is not gpt and is_swapped(m):
                m._liger_compile_min_elems = min_tokens * c.n_embd
        report.add(prefix, gpt, f"under torch.compile, micro-batches of < {min_tokens} tokens run LitGPT's norm, "
                                 "attention and MLP code (host-bound sizes; compile_min_tokens)"
                                 + ("; softcap / sliding-window layers keep RoPE + FlexAttention" if flex else ""))
    for path, m in blocks:
        report.add(path, m, _block_what(m, cfg))
    # the fused loss
    if not cfg.fused_linear_cross_entropy:
        report.skip(prefix, gpt, "fused_linear_cross_entropy switched off: training returns logits "
                                 "(no seq_buckets, cuda_graphs or activation_checkpointing either: they work through "
                                 "the fused loss)")
        return
    try:
        _unwrap_linear(gpt.lm_head)
    except NotImplementedError as e:
        report.skip(prefix, gpt,
                    f"fused loss off (and with it seq_buckets, cuda_graphs, activation_checkpointing): {e}")
        return
    _swap_class(gpt, _GPTMixin)
    gpt._liger_flce_mode = cfg.flce_mode
    gpt._liger_seq_buckets = cfg.seq_buckets
    gpt._liger_cuda_graphs = cfg.cuda_graphs
    gpt._liger_graphs_max_tokens = cfg.cuda_graphs_max_tokens  # (None: automatic, lit_liger.runtime.attach)
    gpt._liger_packing = cfg.packing
    gpt._liger_pack_why = _packing_why(gpt)
    gpt._liger_activation_checkpointing = cfg.activation_checkpointing
    gpt._liger_tied_weights = cfg.tied_weights and _tied.head_weight(gpt) is not None
    if gpt._liger_tied_weights:
        _tied.install(gpt)
    what = f"fused linear cross-entropy in training ({cfg.flce_mode})"
    if lm_head_lora(gpt.lm_head) is not None:
        what += f" (LoRA head r={gpt.lm_head.r}: its update joins the chunked logits)"
    if c.final_logit_softcapping is not None:
        what += f" (softcap {c.final_logit_softcapping})"
    if c.lm_head_bias:
        what += " (lm_head bias)"
    report.add(prefix, gpt, what)
    if cfg.seq_buckets:
        report.add(prefix, gpt, "training lengths padded to buckets (64, 128, ... 512, then 8 per doubling; "
                                "padded targets ignored; seq_buckets)")
    if cfg.packing and gpt._liger_pack_why is None:
        report.add(prefix, gpt, "training batches packed: samples end to end without their right padding, attention "
                                "inside each sample, RoPE positions restarting (one process or a DDP replica; CUDA: "
                                "flash attention over cumulative lengths, 16-bit"
                                + ("; softcap layers: lit-liger's softcap kernel over the samples' starts"
                                   if gpt.config.attention_logit_softcapping is not None else "") + "; packing)")
    elif cfg.packing:
        report.skip(prefix, gpt, f"packing off: {gpt._liger_pack_why}; batches run padded")
    if gpt._liger_tied_weights:
        report.add(prefix, gpt, "lm_head.weight shares transformer.wte.weight's storage where both are frozen and "
                                "equal, as in a converted checkpoint of a tied-embedding model (checked at the "
                                "forward; tied_weights)")
    report.skip(prefix, gpt, "KV-cache (input_pos) and no-grad calls return LitGPT's real logits")
