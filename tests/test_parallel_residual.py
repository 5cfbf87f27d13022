"""The LitGPT configs whose Block is not Llama-like: parallel residual (Pythia, Falcon, phi, StableLM-alpha) with
GptNeoxMLP's GELU, a LayerNorm ``norm_2`` (OLMo-1, StableLM-3B) and no ``norm_2`` (OLMo-2). Tiny 2-layer versions of
real configs, swapped against stock LitGPT with the same weights: loss, every gradient, the report and KV-cache
generation."""

import copy

import pytest
import torch
from conftest import DEVICE
from helpers import assert_same_grads, rel_err
from litgpt import GPT, Config
from litgpt.utils import chunked_cross_entropy as litgpt_ce

from lit_liger import LigerConfig, LigerLogits, apply_liger, chunked_cross_entropy
from lit_liger.swap import adapter as adapter_mod
from lit_liger.swap import gpt as swap_gpt

# name -> small widths keeping the family's flags (parallel_residual, shared_attention_norm, norms, MLP, biases)
CONFIGS = {
    "pythia-160m": dict(n_embd=64, n_head=4, intermediate_size=80),  # parallel, two LayerNorms, exact GELU
    "falcon-7b": dict(n_embd=48, n_head=4, n_query_groups=1, intermediate_size=80),  # parallel, shared norm_1, MQA
    "phi-2": dict(n_embd=80, n_head=4, n_query_groups=4, intermediate_size=96),  # shared, tanh GELU, lm_head bias
    "stablelm-base-alpha-3b": dict(n_embd=64, n_head=4, intermediate_size=80),  # parallel, partial rotary
    "OLMo-1B-hf": dict(n_embd=48, n_head=4, n_query_groups=4, intermediate_size=80),  # LayerNorm without affine
    "stablelm-3b-4e1t": dict(n_embd=64, n_head=4, n_query_groups=4, intermediate_size=80),  # LayerNorm + LLaMAMLP
    "OLMo-2-1124-7B": dict(n_embd=48, n_head=4, n_query_groups=4, intermediate_size=80),  # no norm_2, post norms
}

# what the report says of each config's Blocks
BLOCK_WHAT = {
    "pythia-160m": "layer_norm_dual",
    "falcon-7b": "norm_1 shared with the MLP",
    "phi-2": "norm_1 shared with the MLP",
    "stablelm-base-alpha-3b": "layer_norm_dual",
    "OLMo-1B-hf": "layer_norm_residual",
    "stablelm-3b-4e1t": "layer_norm_residual",
    "OLMo-2-1124-7B": "no norm_2",
}


#: tests that run on CPU tensors on every machine: packing a fp32 batch on CUDA needs flash attention, which is 16-bit
#: only (there the batch would run padded); CPU tensors pack through LitGPT's per-sample math
_CPU_ONLY = {"test_checkpointed_and_packed_blocks_equal_stock"}


@pytest.fixture(autouse=True)
def _on_the_device(request):
    """Models and batches made on the test device: a CUDA GPU runs the Triton kernels at these sizes (CPU tensors there
    would take the reference path); without one, CPU tensors run them through the interpreter."""
    with torch.device("cpu" if request.node.originalname in _CPU_ONLY else DEVICE):
        yield


def tiny(name: str, config_cls=Config, **extra) -> Config:
    over = dict(n_layer=2, padded_vocab_size=160, vocab_size=150, block_size=32)
    over.update(CONFIGS[name])
    over["head_size"] = over["n_embd"] // over["n_head"]
    over.update(extra)
    return config_cls.from_name(name, **over)


def _pair(cfg: Config, cls=GPT):
    torch.manual_seed(0)
    ref = cls(cfg)
    with torch.no_grad():  # random weights everywhere (LitGPT's init zeroes biases and sets norms to 1)
        for n, p in ref.named_parameters():
            if "norm" in n or "ln_f" in n:
                p.copy_((1.0 + 0.2 * torch.randn_like(p)) if n.endswith("weight") else 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.05 if p.dim() > 1 else 0.1))
    return ref, copy.deepcopy(ref)


def _batch(cfg: Config, B: int = 2, T: int = 13):
    torch.manual_seed(1)
    x = torch.randint(1, cfg.vocab_size, (B, T))
    y = torch.randint(0, cfg.vocab_size, (B, T))
    y[0, :3] = -100
    return x, y


def _step_parity(ref, ours, cfg, tol=1e-5, fused_loss=True):
    x, y = _batch(cfg)
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    out = ours(x)
    if fused_loss is not None:
        assert isinstance(out, LigerLogits) is fused_loss
    loss = chunked_cross_entropy(out, y, chunk_size=0)
    assert rel_err(loss, loss_ref) <= tol, (loss.item(), loss_ref.item())
    loss_ref.backward()
    loss.backward()
    assert_same_grads(ref, ours, tol)


def _check_report(report, cfg, name):
    blocks = [k for _, c, k in report.swapped if c == "Block"]
    assert len(blocks) == cfg.n_layer and all(BLOCK_WHAT[name] in k for k in blocks), blocks
    mlps = [k for _, c, k in report.swapped if c == cfg.mlp_class_name]
    assert len(mlps) == cfg.n_layer, (cfg.mlp_class_name, str(report))
    if cfg.mlp_class_name == "GptNeoxMLP":
        assert all(k.startswith(f"gelu (approximate={cfg.gelu_approximate!r})") for k in mlps)
    assert not any(c in ("Block", "GptNeoxMLP") for _, c, _ in report.skipped), str(report)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_swapped_equals_stock(name):
    cfg = tiny(name)
    ref, ours = _pair(cfg)
    report = apply_liger(ours)
    _check_report(report, cfg, name)
    _step_parity(ref, ours, cfg)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_lora_on_every_linear_equals_stock(name):
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    cfg = tiny(name, LoRAConfig, lora_r=4, lora_alpha=8, lora_query=True, lora_key=True, lora_value=True,
               lora_projection=True, lora_mlp=True, lora_head=True)
    ref, ours = _pair(cfg, LoRAGPT)
    with torch.no_grad():  # LoRA's B starts at zero: make every update count
        for (n, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters()):
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.1)
                q.copy_(p)
    mark_only_lora_as_trainable(ref)
    mark_only_lora_as_trainable(ours)
    report = apply_liger(ours)
    _check_report(report, cfg, name)
    _step_parity(ref, ours, cfg, fused_loss=None)  # (the fused loss's own business with a LoRA lm_head)


@pytest.mark.parametrize("name", ["pythia-160m", "phi-2", "OLMo-1B-hf", "OLMo-2-1124-7B"])
def test_kv_cache_generation_equals_stock(name):
    cfg = tiny(name)
    ref, ours = _pair(cfg)
    apply_liger(ours)
    for m in (ref, ours):
        m.eval()
        m.set_kv_cache(batch_size=1)
    torch.manual_seed(3)
    prompt = torch.randint(1, cfg.vocab_size, (1, 5))
    with torch.no_grad():
        pos = torch.arange(5)
        a, b = ref(prompt, input_pos=pos), ours(prompt, input_pos=pos)
        assert rel_err(b, a) <= 1e-5
        for t in range(5, 10):  # greedy one-token steps
            tok = a[:, -1:].argmax(-1)
            assert torch.equal(tok, b[:, -1:].argmax(-1))
            pos = torch.tensor([t])
            a, b = ref(tok, input_pos=pos), ours(tok, input_pos=pos)
            assert rel_err(b, a) <= 1e-5


@pytest.mark.parametrize("name", ["pythia-160m", "falcon-7b", "OLMo-1B-hf"])
def test_checkpointed_and_packed_blocks_equal_stock(name, monkeypatch):
    """The Blocks rerun in backward (activation_checkpointing) and run on a packed batch take the same paths."""
    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", True)
    cfg = tiny(name, block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(activation_checkpointing=True, packing=True))
    torch.manual_seed(4)
    lengths = (11, 6, 9)
    x = torch.zeros(3, 11, dtype=torch.long)
    y = torch.full((3, 11), -100, dtype=torch.long)
    for i, n in enumerate(lengths):
        x[i, :n] = torch.randint(1, cfg.vocab_size, (n,))
        y[i, :n] = torch.randint(0, cfg.vocab_size, (n,))
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    out = ours(x)
    assert out.rows is not None  # packed
    loss = chunked_cross_entropy(out, y, chunk_size=0)
    assert rel_err(loss, loss_ref) <= 1e-5
    loss_ref.backward()
    loss.backward()
    ref_params = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        assert rel_err(p.grad, ref_params[n].grad) <= 1e-5, n


def test_switches_leave_litgpt_code():
    cfg = tiny("pythia-160m")
    ref, ours = _pair(cfg)
    report = apply_liger(ours, LigerConfig(gelu=False, fused_residual=False))
    assert ("transformer.h.0.mlp", "GptNeoxMLP", "gelu switched off") in report.skipped
    assert ("transformer.h.0", "Block", "fused_residual switched off") in report.skipped
    report = apply_liger(ours, LigerConfig(layer_norm=False))  # the parallel Block calls LitGPT's norms one by one
    assert any(c == "Block" and "called one by one" in k for _, c, k in report.swapped)
    _step_parity(ref, ours, cfg)
    cfg = tiny("OLMo-1B-hf")
    report = apply_liger(GPT(cfg), LigerConfig(layer_norm=False))
    assert any(c == "Block" and "layer_norm switched off" in w for _, c, w in report.skipped)


def test_gelu_mlp_keeps_one_intermediate_tensor_less():
    """The swapped GptNeoxMLP keeps fc's (B, T, I) output for backward but not the GELU's."""
    from helpers import saved_bytes

    cfg = tiny("pythia-160m")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    mlp_ref, mlp = ref.transformer.h[0].mlp, ours.transformer.h[0].mlp
    x = torch.randn(2, 7, cfg.n_embd, requires_grad=True)
    params = list(mlp.parameters())
    out_ref, b_ref = saved_bytes(lambda: mlp_ref(x), exclude=list(mlp_ref.parameters()) + [x])
    out, b = saved_bytes(lambda: mlp(x), exclude=params + [x])
    assert rel_err(out, out_ref) <= 1e-5
    assert b_ref - b == 2 * 7 * cfg.intermediate_size * 4
