"""QLoRA: lit-liger on a LitGPT LoRA model whose Linear layers are bitsandbytes-quantized (issue 34, part 2).

Lightning's ``BitsandbytesPrecision`` (what ``litgpt finetune_lora --quantize bnb.*`` uses) quantizes only on a
CUDA device, so on CPU the layers are quantized here with bitsandbytes' own CPU path (the same ``Linear4bit`` /
``Params4bit`` classes, 4-bit storage and ``quant_state``). Stock LitGPT on the quantized model is the reference:
loss and every LoRA gradient must be equal. The GPU test runs litgpt's real CLI path (Lightning's plugin).
"""

import copy

import pytest
import torch
from helpers import rel_err
from test_adapter import _randomize, tiny_config

from lit_liger import apply_liger, chunked_cross_entropy
from lit_liger.swap.quant import dequantize, is_quantized

bnb = pytest.importorskip("bitsandbytes", reason="QLoRA needs the optional extra: pip install 'lit-liger[qlora]'")


def _quantize_linears(model: torch.nn.Module, quant_type: str, dtype: torch.dtype) -> int:
    """Every ``nn.Linear`` of ``model`` (LoRA layers' base projections and the lm_head included, as litgpt does)
    becomes a frozen bitsandbytes 4-bit layer holding the same weight, quantized on the CPU."""
    n = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=dtype, quant_type=quant_type)
            q.weight = bnb.nn.Params4bit(child.weight.data.clone(), requires_grad=False, quant_type=quant_type,
                                         compress_statistics=quant_type.endswith("dq"))
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data.clone(), requires_grad=False)
            setattr(module, child_name, q.to("cpu"))  # .to quantizes
            n += 1
    return n


def _qlora_pair(name: str, quant_type: str, dtype=torch.float32, **lora):
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    cfg = tiny_config(name, LoRAConfig, lora_r=4, lora_alpha=8, **lora)
    torch.manual_seed(0)
    ref = LoRAGPT(cfg)
    _randomize(ref)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)  # a trained update (LitGPT initializes B to zeros)
    ref = ref.to(dtype)
    mark_only_lora_as_trainable(ref)
    n = _quantize_linears(ref, quant_type.split("-")[0], dtype)
    assert n >= 5 * cfg.n_layer + 1
    return cfg, ref, copy.deepcopy(ref)


def _step(model, x, y, loss_fn):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(x)[..., :-1, :], y[..., 1:])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("name,lora", [
    ("Llama-3.2-1B", dict(lora_query=True, lora_value=True)),  # litgpt's defaults: q and v
    ("gemma-2-2b", dict(lora_query=True, lora_key=True, lora_value=True, lora_projection=True, lora_mlp=True)),
])
def test_qlora_matches_stock(name, lora, quant, monkeypatch):
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger.swap import lora as swap_lora

    cfg, ref, ours = _qlora_pair(name, quant, **lora)
    report = apply_liger(ours)
    kinds = [k for _, _, k in report.swapped]
    assert sum(k.startswith("fused linear cross-entropy") for k in kinds) == 1
    n_lora = sum(k.startswith("LoRA r=") for k in kinds)
    assert n_lora >= cfg.n_layer
    calls = []
    real = swap_lora.lora_linear
    monkeypatch.setattr(swap_lora, "lora_linear", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    y = torch.randint(0, cfg.vocab_size, (2, 12))
    y[0, :4] = -100
    loss_ref, grads_ref = _step(ref, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    for fn in (chunked_cross_entropy, litgpt_ce):  # lit-liger's loss, and stock code's own
        loss, grads = _step(ours, x, y, fn)
        assert rel_err(loss, loss_ref) <= 1e-5
        assert grads.keys() == grads_ref.keys() and grads
        for n, g in grads.items():
            assert rel_err(g, grads_ref[n]) <= 1e-4, (n, rel_err(g, grads_ref[n]))
    # the LoRA function ran on every LoRA layer, with the quantized base weight itself
    assert len(calls) == 2 * n_lora and all(is_quantized(w) for w in calls)
    # the quantized weights stay quantized, frozen and untouched
    for m in ours.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            assert is_quantized(m.weight) and m.weight.grad is None and m.weight.dtype == torch.uint8


def test_lora_linear_quantized_base_equals_bnb_layer():
    """The LoRA function's dequantized base GEMM against bitsandbytes' own layer: output and input gradient."""
    from lit_liger.swap.lora import lora_linear

    torch.manual_seed(0)
    C, out, r = 48, 80, 4
    q = bnb.nn.Linear4bit(C, out, bias=True, compute_dtype=torch.float32, quant_type="nf4")
    q.weight = bnb.nn.Params4bit(torch.randn(out, C), requires_grad=False, quant_type="nf4")
    q.bias = torch.nn.Parameter(torch.randn(out), requires_grad=False)
    q = q.to("cpu")
    a = (torch.randn(r, C) * 0.1).requires_grad_()
    b = (torch.randn(out, r) * 0.1).requires_grad_()
    x = torch.randn(3, 5, C, requires_grad=True)
    ref = q(x) + (x @ a.t() @ b.t()) * 2.0
    ours = lora_linear(x, q.weight, q.bias, a, b, 2.0, ((0, out),))
    assert rel_err(ours, ref) <= 1e-5
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (x, a, b), g)
    grads = torch.autograd.grad(ours, (x, a, b), g)
    for gr, go in zip(grads_ref, grads):
        assert rel_err(go, gr) <= 1e-5
    assert dequantize(q.weight).shape == (out, C)


def test_quantized_lm_head_in_the_fused_loss():
    """The fused loss reads a quantized head's dequantized matrix (the crash of issue 34 read its packed storage)."""
    from lit_liger.swap.loss import lm_head_weight_bias

    cfg, ref, ours = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True)
    w, b = lm_head_weight_bias(ours.lm_head)
    assert w.shape == (cfg.padded_vocab_size, cfg.n_embd) and b is None and not w.requires_grad
    x = torch.randn(4, cfg.n_embd)
    assert rel_err(torch.nn.functional.linear(x, w), ours.lm_head(x)) <= 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nf4", "nf4-dq", "fp4"])
def test_gpu_qlora_with_lightnings_plugin(mode):
    """What ``litgpt finetune_lora --quantize bnb.<mode>`` builds: Lightning's BitsandbytesPrecision quantizes every
    Linear on the GPU (lm_head included); lit-liger's step equals stock's (bf16: loss and LoRA gradients)."""
    import lightning as L
    from lightning.fabric.plugins import BitsandbytesPrecision
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    cfg = LoRAConfig.from_name("Llama-3.2-1B", n_layer=2, n_embd=256, n_head=4, n_query_groups=2,
                               intermediate_size=704, head_size=64, lora_r=8, lora_alpha=16, lora_query=True,
                               lora_value=True)
    fabric = L.Fabric(devices=1, accelerator="cuda", plugins=BitsandbytesPrecision(mode, torch.bfloat16))
    torch.manual_seed(0)
    with fabric.init_module(empty_init=False):
        ref = LoRAGPT(cfg)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    mark_only_lora_as_trainable(ref)
    ours = copy.deepcopy(ref)
    ref, ours = fabric.setup_module(ref), fabric.setup_module(ours)
    assert isinstance(ours.lm_head.linear, bnb.nn.Linear4bit) and is_quantized(ours.lm_head.linear.weight)
    apply_liger(ours.module)
    x = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
    loss_ref, grads_ref = _step(ref, x, x, litgpt_ce)
    loss, grads = _step(ours, x, x, litgpt_ce)
    assert rel_err(loss, loss_ref) <= 1e-2
    for n, g in grads.items():
        assert rel_err(g, grads_ref[n]) <= 3e-2, (n, rel_err(g, grads_ref[n]))
    # captured: CUDA graphs apply to the quantized model, and replays give the uncaptured step's loss and gradients
    import warnings

    from lit_liger import LigerConfig

    apply_liger(ours.module, LigerConfig(cuda_graphs=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):  # warm-up, capture, replays
            loss_g, grads_g = _step(ours, x, x, litgpt_ce)
    assert not [w for w in caught if "CUDA graphs off" in str(w.message)], [str(w.message) for w in caught]
    assert rel_err(loss_g, loss) <= 1e-6
    for n, g in grads_g.items():
        assert rel_err(g, grads[n]) <= 1e-6, n


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
def test_dequantize_straight_into_the_compute_dtype(quant, nested):
    """Decoding into bf16 directly (one rounding) equals bitsandbytes' decode into the quantization's dtype
    followed by a cast (two), within bf16's rounding; the quantization's own dtype is bitsandbytes' exactly."""
    torch.manual_seed(0)
    q = bnb.nn.Linear4bit(64, 96, bias=False, compute_dtype=torch.float16, quant_type=quant)
    q.weight = bnb.nn.Params4bit(torch.randn(96, 64, dtype=torch.float16), requires_grad=False, quant_type=quant,
                                 compress_statistics=nested)
    q = q.to("cpu")
    ref = bnb.functional.dequantize_4bit(q.weight.data, q.weight.quant_state)
    assert ref.dtype == torch.float16 and torch.equal(dequantize(q.weight), ref)
    direct = dequantize(q.weight, torch.bfloat16)
    assert direct.dtype == torch.bfloat16 and direct.shape == (96, 64)
    assert rel_err(direct, ref.to(torch.bfloat16)) <= 4e-3
    assert rel_err(direct, ref.float()) <= rel_err(ref.to(torch.bfloat16), ref.float()) + 1e-6  # no worse


def test_linear_4bit_swap_and_errors():
    """Quantized Linears without LoRA run lit-liger's linear_4bit after apply_liger: output and input gradient equal
    bitsandbytes' layer; bad inputs fail clearly."""
    from lit_liger.swap.quant import linear_4bit

    cfg, ref, ours = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True)
    report = apply_liger(ours)
    swapped = [p for p, _, k in report.swapped if k.startswith("4-bit")]
    assert len(swapped) >= 4 * cfg.n_layer + 1  # attn.proj, fc_1, fc_2, mlp.proj per layer, the lm_head
    m_ref, m = ref.transformer.h[0].mlp.fc_1.linear, ours.transformer.h[0].mlp.fc_1.linear
    x = torch.randn(2, 5, cfg.n_embd, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_ref, y = m_ref(x), m(x2)
    assert rel_err(y, y_ref) <= 1e-6
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    assert rel_err(x2.grad, x.grad) <= 1e-6
    with pytest.raises(ValueError, match="in_features"):
        linear_4bit(torch.randn(3, cfg.n_embd + 1), m.weight)
    with pytest.raises(TypeError, match="4-bit"):
        linear_4bit(x, torch.randn(4, cfg.n_embd))


def test_graph_runner_accepts_frozen_4bit_weights():
    """CUDA graphs used to refuse a QLoRA model ("sharded or wrapped parameters"): a frozen 4-bit weight's packed
    storage stays put, so it no longer counts as wrapped; a trainable parameter subclass still does."""
    from lit_liger.runtime.graphs import runner_for

    cfg, _, ours = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True)
    apply_liger(ours)
    runner = runner_for(ours)
    runner._walk()
    assert not runner._sharded

    class Wrapped(torch.nn.Parameter):
        pass

    attn = ours.transformer.h[0].attn
    attn.qkv.lora_A = Wrapped(attn.qkv.lora_A.detach().clone())  # a trainable parameter subclass
    runner._walk()
    assert runner._sharded


def test_cli_freezes_parameters_no_optimizer_holds(capsys):
    """litgpt's QLoRA swaps in bitsandbytes' StableEmbedding after building the optimizer: its parameters require
    grad but never train. lit-liger's ``fit`` wrapper freezes exactly those (and says so); the optimizer's own
    parameters and the already frozen ones are left as they are."""
    from lit_liger.cli import _fit_freezing_unoptimized, freeze_unoptimized

    cfg, _, model = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    old = model.transformer.wte
    model.transformer.wte = bnb.nn.StableEmbedding(old.num_embeddings, old.embedding_dim)  # what litgpt does
    trained_before = {n for n, p in model.named_parameters() if p.requires_grad}
    seen = []

    def fit(fabric, model, optimizer, scheduler=None):  # litgpt's fit, as far as its arguments go
        seen.append({n for n, p in model.named_parameters() if p.requires_grad})

    _fit_freezing_unoptimized(fit)(fabric=None, model=model, optimizer=optimizer)
    stable = {"transformer.wte.weight", "transformer.wte.norm.weight", "transformer.wte.norm.bias"}
    assert stable <= trained_before and seen == [trained_before - stable]
    assert "transformer.wte.weight" in capsys.readouterr().out
    assert freeze_unoptimized(model, optimizer) == []  # idempotent


def test_cli_releases_the_embedding_litgpt_replaced(capsys, monkeypatch):
    """litgpt's QLoRA builds its optimizer on all of the model's parameters, then replaces the embedding with
    StableEmbedding: the old embedding stays alive in the optimizer's param group. lit-liger's ``fit`` wrapper
    releases its storage (said, with the bytes); the model's own parameters, trained or frozen, keep theirs; a
    replaced parameter whose storage a model tensor shares is kept; and the optimizer still steps."""
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger import cli
    from lit_liger.cli import _fit_freezing_unoptimized, release_replaced

    cfg, _, model = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True)
    optimizer = torch.optim.AdamW(model.parameters())  # litgpt: bnb's PagedAdamW(model.parameters())
    old = model.transformer.wte
    model.transformer.wte = bnb.nn.StableEmbedding(old.num_embeddings, old.embedding_dim)  # what litgpt does
    with torch.no_grad():
        model.transformer.wte.weight.copy_(old.weight)
    shared = torch.nn.Parameter(model.transformer.wte.weight.data[:2], requires_grad=False)  # a view of a model tensor
    optimizer.add_param_group({"params": [shared]})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    old_bytes = old.weight.numel() * old.weight.element_size()
    returned = []
    monkeypatch.setattr(cli, "release_replaced", lambda m, o: returned.append(release_replaced(m, o)) or returned[-1])

    def fit(fabric, model, optimizer, scheduler=None):  # litgpt's fit, as far as its arguments go
        x = torch.randint(0, cfg.vocab_size, (2, 16))
        loss = litgpt_ce(model(x)[..., :-1, :], x[..., 1:])
        loss.backward()
        optimizer.step()

    _fit_freezing_unoptimized(fit)(fabric=None, model=model, optimizer=optimizer)
    out = capsys.readouterr().out
    assert old.weight.numel() == 0 and old.weight.dtype == before["transformer.wte.weight"].dtype
    assert returned == [old_bytes] and f"{old_bytes / 2**30:.2f} GiB released" in out  # exactly the old embedding
    assert shared.numel() == 2 * cfg.n_embd  # kept: its storage is the model's
    for n, p in model.named_parameters():  # nothing of the model's released; the frozen ones unchanged by the step
        assert p.numel() == before[n].numel(), n
        if not p.requires_grad:
            assert torch.equal(p, before[n]), n
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" in n)  # it trained
    assert release_replaced(model, optimizer) == 0  # idempotent


def test_int8_head_keeps_its_own_forward():
    """A bitsandbytes int8 lm_head multiplies in int8 (activations too): lit-liger does not decode it for the fused
    loss. Quantized before apply_liger: the report says the fused loss is off; quantized after: the swapped model
    takes LitGPT's path (real logits from the head's own forward). (bitsandbytes' CPU backend cannot run an int8
    layer's training forward, so the loss itself is not compared here.)"""
    from lit_liger.swap.gpt import _int8_head
    from lit_liger.swap.loss import lm_head_weight_bias

    def int8_head(model):
        old = model.lm_head.linear
        q = bnb.nn.Linear8bitLt(old.in_features, old.out_features, bias=False, has_fp16_weights=False)
        q.weight = bnb.nn.Int8Params(old.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
        model.lm_head.linear = q.to("cpu")
        assert model.lm_head.linear.weight.dtype == torch.int8

    cfg, _, ours = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True)
    late = copy.deepcopy(ours)
    int8_head(ours)
    report = apply_liger(ours)
    assert any("int8" in why for _, _, why in report.skipped)
    apply_liger(late)
    assert not _int8_head(late)
    int8_head(late)
    assert _int8_head(late)  # its forward returns LitGPT's logits
    with pytest.raises(NotImplementedError, match="int8"):
        lm_head_weight_bias(late.lm_head)


@pytest.mark.parametrize("lora_mlp", [False, True])
def test_4bit_mlp_runs_over_the_plan_s_tiles(lora_mlp):
    """Issue 68's plan tiles QLoRA's MLP too: in a recomputed Block (the checkpoint's scope, the plan's tile) the 4-bit
    MLP (frozen, or with LoRA on its three layers) runs over sequence tiles, with the output, the input's gradient and
    the LoRA gradients of the MLP called whole."""
    from lit_liger.swap._common import _CHECKPOINTED, _scoped, _tiled
    from lit_liger.swap.mlp import tiled_mlp

    lora = dict(lora_query=True, lora_value=True, lora_mlp=lora_mlp)
    cfg, _, ours = _qlora_pair("Llama-3.2-1B", "nf4", **lora)
    apply_liger(ours)
    block = ours.transformer.h[0]
    mlp = block.mlp
    assert isinstance(mlp.fc_1, bnb.nn.Linear4bit) or isinstance(getattr(mlp.fc_1, "linear", None), bnb.nn.Linear4bit)
    x = torch.randn(2, 13, cfg.n_embd)
    with _scoped(block, _CHECKPOINTED), _tiled(block, 5):
        assert block._liger_tile(x) == 5  # (a frozen plain GLU would run glu_mlp's chunks instead: 0)

    def run(tile):
        mlp.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        out = tiled_mlp(mlp, xi, tile)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(2)))
        return out.detach(), xi.grad, {n: p.grad for n, p in mlp.named_parameters() if p.grad is not None}

    out_ref, dx_ref, g_ref = run(0)
    out, dx, g = run(5)
    assert rel_err(out, out_ref) <= 1e-5 and rel_err(dx, dx_ref) <= 1e-5
    assert g.keys() == g_ref.keys() and bool(g) == lora_mlp
    for n in g:
        assert rel_err(g[n], g_ref[n]) <= 1e-5, n
