"""LitGPT's CausalSelfAttention on lit-liger's kernels: q/k RoPE in one launch, SDPA / FlexAttention / the softcap
kernel per layer (the masks and backends: ``lit_liger.swap.attend``), packed samples (``lit_liger.swap.packing``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from litgpt import model as lm
from torch import nn

from ..kernels import _grad_into
from ..kernels._launch import use_triton
from ..kernels.attention import softcap_attention, supported_head_size
from ..kernels.rope import rope, rope_qkv
from ._common import _KEPT_ATTENTION, _stock_under_compile
from .lora import call_lora
from . import attend as _attention
from . import packing as _packing


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
        # the attention's backward keeps its output: a LoRA proj's dropout keeps its mask as bits beside it
        return call_lora(proj, y, keep_input=True)

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
        key = (q.device, self.__dict__.get("_liger_capturing", False) or q.size(-2) >= _attention.SDPA_LONG)
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
            kept = self.__dict__.get(_KEPT_ATTENTION)
            if kept is not None and mask is None and not torch.compiler.is_compiling():
                # a recomputed Block that keeps its attention's output (MemPlan.attn): its rerun runs no attention
                # forward; None where the kernel PyTorch picks cannot be called apart (then as below)
                y = _attention.kept_sdpa(kept, q, k, v, scale)
                if y is not None:
                    return self._liger_proj(y.transpose(1, 2).reshape(B, T, hs * n_head))
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
