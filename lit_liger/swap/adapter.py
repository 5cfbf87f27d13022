"""``swap_model``: the one LitGPT adapter, driven by ``Config`` flags (no per-family code).

LitGPT builds 20+ model families from one ``GPT`` whose modules are chosen by ``Config`` flags
(``norm_class_name``, ``mlp_class_name``, ``rope_n_elem``, ``norm_qk``, ``parallel_residual``,
``final_logit_softcapping``, ``lm_head_bias``, ...). The adapter walks a model's modules and
swaps each module's *class* for a subclass whose ``forward`` calls the Triton kernels; the same
Parameter objects, names and ``state_dict`` keys stay, and ``isinstance(m, Block)`` (FSDP
wrap / activation-checkpointing policies) still holds. LitGPT's LoRA and adapter subclasses are
covered because the swap subclasses whatever class the module has.

This file is the walk (:func:`swap_model`): which class each module takes and why, and the report of it. Each LitGPT
module family has its file: ``norms.py``, ``mlp.py``, ``attention.py`` (its masks and backends: ``attend.py``),
``block.py``, ``gpt.py`` (the token embedding, the fused-loss forward, ``litgpt.LLM``), ``lora.py``, ``quant.py``
(bitsandbytes 4-bit), ``fp8.py`` (torchao float8); ``report.py`` says what was swapped. What is left alone (and why) is
reported: latent attention (MLA), the KV-cache ``input_pos`` path (LitGPT's attention code runs for those calls).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch
from litgpt import lora as litgpt_lora, model as lm
from litgpt.api import LLM
from torch import nn

from ..config import LigerConfig
from ..kernels.attention import supported_head_size
from . import attend as _attention
from .attention import _AttentionMixin
from .block import _BlockMixin
from .fp8 import _convert_fp8, _fp8_decisions, _restore_fp8
from .gpt import _EmbeddingMixin, _GPTMixin, _LLMMixin, _packing_why
from .lora import _LoRAMixin
from .loss import _unwrap_linear, lm_head_lora
from .mlp import _GeGLUMixin, _GeluMLPMixin, _SwiGLUMixin
from .norms import _LayerNormMixin, _RMSNormMixin
from .quant import _Linear4bitMixin, is_4bit, is_quantized
from .report import LigerReport
from .state import state_of
from . import tied as _tied


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
    post_attn, post_mlp = (isinstance(block.post_attention_norm, _RMSNormMixin),
                           isinstance(block.post_mlp_norm, _RMSNormMixin))
    post = "; post_mlp_norm + residual add fused (rms_norm_add)" if post_mlp else ""
    if isinstance(n2, _LayerNormMixin):
        return "residual add + norm_2 fused (layer_norm_residual)" + post
    if not isinstance(n2, _RMSNormMixin):
        if post_attn or post_mlp:  # (OLMo-2)
            fused = " and ".join(n for n, ok in (("post_attention_norm", post_attn), ("post_mlp_norm", post_mlp)) if ok)
            return f"no norm_2 ({type(n2).__name__}): {fused} + residual add fused (rms_norm_add)"
        return f"no norm_2 ({type(n2).__name__}): LitGPT's residual adds, nothing to fuse"
    if post_attn and not block._liger_fuse_norm_2(structure_only=True):  # (Gemma-2/3 with LoRA or frozen MLPs)
        what = "post_attention_norm + residual add + norm_2 fused (rms_norm_add)" + post
    else:  # (with a post_attention_norm before it: Gemma-2/3's full fine-tuning)
        what = "residual add + norm_2 fused (rms_norm_residual)" + post
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
