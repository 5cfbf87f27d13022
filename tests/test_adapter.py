"""apply_liger on tiny configs derived from real LitGPT config names: parity with the untouched model."""

import copy

import pytest
import torch
from helpers import assert_same_grads, rel_err, saved_bytes
from litgpt import GPT, Config
from litgpt.utils import chunked_cross_entropy as litgpt_ce

from lit_liger import LigerConfig, LigerLogits, apply_liger, chunked_cross_entropy, remove_liger
from lit_liger.swap import attention as swap_attention
from lit_liger.swap import mlp as swap_mlp

# name -> overrides making a 2-layer model with small dims but the family's flags intact
FAMILIES = {
    "Llama-3.2-1B": dict(n_embd=64, n_head=4, n_query_groups=2, intermediate_size=96),
    "Qwen2.5-0.5B": dict(n_embd=64, n_head=4, n_query_groups=2, intermediate_size=96),  # qkv bias
    "Qwen3-0.6B": dict(n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=96),  # norm_qk
    "gemma-2-2b": dict(n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=96, sliding_window_size=None),
    "gemma-3-1b-it": dict(n_embd=64, n_head=4, n_query_groups=1, head_size=16, intermediate_size=96, sliding_window_size=None),
    "OLMo-2-1124-7B": dict(n_embd=64, n_head=4, n_query_groups=4, intermediate_size=96),  # olmo2 qk norm
    "Phi-3.5-mini-instruct": dict(n_embd=48, n_head=2, n_query_groups=2, intermediate_size=80),
    "pythia-14m": dict(n_embd=64, n_head=4, intermediate_size=128),  # LayerNorm, partial rotary, parallel residual
    "phi-2": dict(n_embd=80, n_head=4, n_query_groups=4, intermediate_size=96),  # lm_head bias, partial rotary
    "Mixtral-8x7B-v0.1": dict(n_embd=64, n_head=4, n_query_groups=2, intermediate_size=96, moe_intermediate_size=48, n_expert=4, n_expert_per_token=2),
    "OLMo-1B-hf": dict(n_embd=64, n_head=4, n_query_groups=4, intermediate_size=96),  # LayerNorm without affine
}


def tiny_config(name: str, config_cls=Config, **extra) -> Config:
    over = dict(n_layer=2, padded_vocab_size=160, vocab_size=150, block_size=32)
    over.update(FAMILIES[name])
    over.update(extra)
    if "head_size" not in over:
        over["head_size"] = over["n_embd"] // over["n_head"]
    cfg = config_cls.from_name(name, **over)
    if name in ("gemma-2-2b", "gemma-3-1b-it"):
        cfg.sliding_window_indices = None
    if name == "gemma-3-1b-it":
        cfg.rope_indices = [0, 1]
    return cfg


def _randomize(model: torch.nn.Module) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 0.05 if p.dim() > 1 else torch.randn_like(p) * 0.1)


def _pair(cfg: Config, cls=GPT):
    torch.manual_seed(0)
    ref = cls(cfg)
    _randomize(ref)
    ours = copy.deepcopy(ref)
    return ref, ours


def _check_parity(ref, ours, cfg, tol_loss=1e-5, tol_grad=1e-4):
    torch.manual_seed(1)
    B, T = 2, 12
    x = torch.randint(0, cfg.vocab_size, (B, T))
    y = torch.randint(0, cfg.vocab_size, (B, T))
    y[0, :3] = -100
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    out = ours(x)
    assert isinstance(out, LigerLogits)
    loss = chunked_cross_entropy(out, y)
    assert rel_err(loss, loss_ref) <= tol_loss, (loss.item(), loss_ref.item())
    loss_ref.backward()
    loss.backward()
    assert_same_grads(ref, ours, tol_grad)
    # no-grad (validation) path gives real logits equal to LitGPT's
    with torch.no_grad():
        assert rel_err(ours(x), ref(x)) <= 1e-5


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_parity(name):
    cfg = tiny_config(name)
    ref, ours = _pair(cfg)
    keys = list(ours.state_dict().keys())
    params_before = {n: p for n, p in ours.named_parameters()}
    report = apply_liger(ours)
    # weights untouched: same Parameter objects, names, state_dict keys
    assert list(ours.state_dict().keys()) == keys
    assert all(p is params_before[n] for n, p in ours.named_parameters())
    assert isinstance(ours.transformer.h[0], type(ref.transformer.h[0]))
    text = str(report)
    assert "swapped" in text
    _check_parity(ref, ours, cfg)
    # expected swaps from the config flags
    if cfg.norm_class_name == "RMSNorm":
        assert report.count("rms_norm" + (" (unit offset)" if "Gemma" in cfg.name else "")) >= 2 * cfg.n_layer + 1
    else:
        assert any(k.startswith("layer_norm") for _, _, k in report.swapped)
    if cfg.mlp_class_name == "LLaMAMLP":
        assert report.count("swiglu") == cfg.n_layer
    if cfg.mlp_class_name == "LLaMAMoE":
        assert report.count("swiglu") == cfg.n_layer * cfg.n_expert
    if cfg.mlp_class_name == "GemmaMLP":
        assert any(k.startswith("geglu") for _, _, k in report.swapped)
    if cfg.mlp_class_name == "GptNeoxMLP":
        assert sum(1 for _, c, k in report.swapped if c == "GptNeoxMLP" and k.startswith("gelu")) == cfg.n_layer
    assert sum(1 for _, c, _ in report.swapped if c == "Block") == cfg.n_layer  # every Block's layout is swapped
    assert sum(1 for _, _, k in report.swapped if k.startswith("rope")) == cfg.n_layer
    if cfg.parallel_residual or not cfg.norm_2:
        assert not any(k.startswith("residual") for _, _, k in report.swapped)
    elif cfg.norm_class_name == "RMSNorm":
        assert sum(1 for _, _, k in report.swapped if k.startswith("residual")) == cfg.n_layer
    assert any(k.startswith("fused linear cross-entropy") for _, _, k in report.swapped)


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b", "Mixtral-8x7B-v0.1"])
def test_recompute_norm_keeps_two_activations_per_layer_less(name):
    # norm_1 -> qkv and norm_2 -> fc_1/fc_2 (plain Linears): the normalized (B, T, C) tensors are not
    # kept for backward; the MoE's experts read norm_2's output themselves, so only norm_1 there
    cfg = tiny_config(name)
    ref, ours = _pair(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    kept = {}
    for recompute in (False, True):
        apply_liger(ours, {"recompute_norm": recompute})
        _, kept[recompute] = saved_bytes(lambda: ours(x))
    per_norm = 2 * 8 * cfg.n_embd * 4  # (B, T, C) fp32
    n_fused = cfg.n_layer * (1 if cfg.mlp_class_name == "LLaMAMoE" else 2)
    assert kept[False] - kept[True] == n_fused * per_norm
    report = str(apply_liger(ours))
    assert "recomputed in backward" in report
    _check_parity(ref, ours, cfg)


def _compiled_saved_bytes(model, x, y):
    """Loss, gradients and the bytes of activations torch.compile's forward graph saves for backward
    (inductor's own min-cut partitioner, graphs run eagerly), and the custom ops that graph calls."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    seen = {"saved": 0, "ops": []}

    def fw_compiler(gm, _inputs):
        seen["ops"] += [str(n.target) for n in gm.graph.nodes if "lit_liger" in str(n.target)]
        return make_boxed_func(gm.forward)

    def partition(joint, inputs, **kw):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, **kw)
        out = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        saved = [n.meta.get("val") for n in out[kw["num_fwd_outputs"]:]
                 if isinstance(n, torch.fx.Node) and n.op != "placeholder"]
        # whole storages, once each: a saved view keeps the tensor it is a view of alive
        storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in saved
                    if isinstance(t, torch.Tensor)}
        seen["saved"] += sum(storages.values())
        return fw, bw

    backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           partition_fn=partition)
    torch._dynamo.reset()
    loss = torch.compile(lambda: chunked_cross_entropy(model(x), y), fullgraph=True, backend=backend)()
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    torch._dynamo.reset()
    return loss, grads, seen["saved"], seen["ops"]


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "Qwen3-0.6B"])
def test_compile_keeps_no_more_than_eager(name, monkeypatch):
    """Under torch.compile the swapped Block still runs the norm + Linear and GLU + Linear ops that
    recompute in backward (as opaque custom ops the partitioner cannot undo) and rope_qkv's v in its
    own buffer: each saves exactly what it saves in eager mode. Measured on the compiled forward graph's saved
    tensors, part by part: the two normalized (B, T, C) tensors, the (B, T, I) GLU product and a v
    view pinning the whole (B, T, qkv) projection are what each part keeps without it."""
    import importlib

    import lit_liger.swap.adapter as adapter

    rope_mod = importlib.import_module("lit_liger.kernels.rope")  # (the package exports a function of that name)

    # the GPU's attention path: SDPA reads the shared kv heads (enable_gqa), so it saves v itself
    # (LitGPT's repeat_interleave path saves a repeated copy instead)
    monkeypatch.setattr(swap_attention, "_flash_gqa_ok", lambda attn, q: True)
    cfg = tiny_config(name)
    ref, ours = _pair(cfg)
    always = {"compile_min_tokens": 0}  # lit-liger's ops under compile at this tiny size too
    apply_liger(ours, always)
    B, T = 2, 8
    x = torch.randint(0, cfg.vocab_size, (B, T))
    y = torch.randint(0, cfg.vocab_size, (B, T))
    loss_c, grads_c, saved, ops = _compiled_saved_bytes(ours, x, y)
    per_layer = {op: sum(o.startswith(f"lit_liger.{op}") for o in ops) / cfg.n_layer
                 for op in ("rms_norm_linear", "glu_linear")}
    assert per_layer == {"rms_norm_linear": 2, "glu_linear": 1}, ops
    # against stock LitGPT (not the swapped model's own eager path), with _check_parity's tolerances
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    grads_ref = torch.autograd.grad(loss_ref, [p for p in ref.parameters() if p.requires_grad])
    assert rel_err(loss_c, loss_ref) <= 1e-5
    assert len(grads_c) == len(grads_ref)
    for a, b in zip(grads_c, grads_ref):
        assert rel_err(a, b) <= 1e-4
    e, N, L = 4, B * T, cfg.n_layer  # fp32
    qkv_width = (cfg.n_head + 2 * cfg.n_query_groups) * cfg.head_size
    v_width = cfg.n_query_groups * cfg.head_size
    # each part undone in turn: what the compiled graph keeps then, over what it keeps now
    apply_liger(ours, {**always, "recompute_norm": False})
    assert _compiled_saved_bytes(ours, x, y)[2] - saved == L * 2 * N * cfg.n_embd * e
    apply_liger(ours, always)
    with monkeypatch.context() as m:
        m.setattr(swap_mlp, "glu_linear", lambda a, b, w, bias, act, **kw: torch.nn.functional.linear(
            torch.nn.functional.silu(a) * b, w, bias))
        assert _compiled_saved_bytes(ours, x, y)[2] - saved == L * N * cfg.intermediate_size * e
    # recompute_mlp: the Block's residual add, norm_2 and MLP as one op that keeps neither fc_1's nor fc_2's output
    apply_liger(ours, {**always, "recompute_mlp": True})
    loss_r, grads_r, saved_r, ops_r = _compiled_saved_bytes(ours, x, y)
    apply_liger(ours, always)
    assert sum(o.startswith("lit_liger.rms_norm_glu_mlp.") for o in ops_r) == L, ops_r
    assert saved - saved_r == L * 2 * N * cfg.intermediate_size * e
    assert rel_err(loss_r, loss_c) <= 1e-6
    for a, b in zip(grads_r, grads_c):
        assert rel_err(a, b) <= 1e-5
    if not cfg.norm_qk:  # (with qk-norm the norms' backward keeps the q, k views of qkv anyway)
        with monkeypatch.context() as m:
            m.setattr(rope_mod, "own_buffer", lambda v: v)
            assert _compiled_saved_bytes(ours, x, y)[2] - saved == L * N * (qkv_width - v_width) * e


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b"])
def test_compile_small_micro_batch_runs_litgpt_code(name):
    """Under torch.compile a micro-batch below ``compile_min_tokens`` runs LitGPT's own norm, attention
    and MLP code (inductor fuses it; lit-liger's custom ops would cost host time such small steps
    cannot hide); only the fused loss stays. At or above the threshold, lit-liger's ops run. Eager
    mode ignores it. Loss and gradients equal stock LitGPT's either way. (Qwen3's qk-norm under compile:
    test_compile_keeps_no_more_than_eager.)"""
    cfg = tiny_config(name)
    ref, ours = _pair(cfg)
    B, T = 2, 8
    x = torch.randint(0, cfg.vocab_size, (B, T))
    y = torch.randint(0, cfg.vocab_size, (B, T))
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    grads_ref = torch.autograd.grad(loss_ref, [p for p in ref.parameters() if p.requires_grad])
    block_ops = ("rms_norm", "rope", "glu")  # every lit_liger op but the fused loss starts with one of these
    for min_tokens, fused in ((B * T + 1, False), (B * T, True), (0, True), (None, False)):
        report = apply_liger(ours, {"compile_min_tokens": min_tokens})
        assert ("micro-batches of <" in str(report)) == (min_tokens != 0)
        loss_c, grads_c, _, ops = _compiled_saved_bytes(ours, x, y)
        assert any(o.startswith("lit_liger.flce") for o in ops), ops
        assert any(o.startswith(f"lit_liger.{k}") for o in ops for k in block_ops) == fused, (min_tokens, ops)
        assert rel_err(loss_c, loss_ref) <= 1e-5
        for a, b in zip(grads_c, grads_ref, strict=True):
            assert rel_err(a, b) <= 1e-4
    # eager: lit-liger's kernels whatever the threshold (the recompute_norm saving is there)
    apply_liger(ours, {"recompute_norm": False})
    _, unfused = saved_bytes(lambda: ours(x))
    apply_liger(ours, {"compile_min_tokens": 10**9})
    _, fused_eager = saved_bytes(lambda: ours(x))
    assert fused_eager < unfused


def test_recompute_norm_steps_aside_for_hooked_or_frozen_linears():
    # a module that something hooks (FSDP2 fully_shard on it, composable checkpointing, a user's
    # activation capture) must be called as a module; a frozen Linear keeps nothing to save
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    _, fused_bytes = saved_bytes(lambda: ours(x))
    seen = []
    block = ours.transformer.h[0]
    handles = [block.attn.qkv.register_forward_pre_hook(lambda m, a: seen.append("qkv")),
               block.mlp.fc_2.register_forward_hook(lambda m, a, o: seen.append("fc_2"))]
    _, hooked_bytes = saved_bytes(lambda: ours(x))
    assert seen == ["qkv", "fc_2"]  # both hooks ran: block 0 took the module path
    assert hooked_bytes - fused_bytes == 2 * 2 * 8 * cfg.n_embd * 4  # its two norm outputs are kept again
    _check_parity(ref, ours, cfg)
    for h in handles:
        h.remove()
    for m in (ours, ref):  # frozen qkv / MLP weights in every block: module path, same numbers
        for b in m.transformer.h:
            for lin in (b.attn.qkv, b.mlp.fc_1, b.mlp.fc_2):
                lin.weight.requires_grad_(False)
    _check_parity(ref, ours, cfg)


def test_idempotent_and_config_switches():
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    r1 = apply_liger(ours)
    r2 = apply_liger(ours)
    assert r1.swapped == r2.swapped
    r3 = apply_liger(ours, LigerConfig(rope=False, fused_linear_cross_entropy=False))
    assert not any(k.startswith("rope") for _, _, k in r3.swapped)
    assert type(ours.transformer.h[0].attn) is type(ref.transformer.h[0].attn)
    x = torch.randint(0, 150, (1, 5))
    assert isinstance(ours(x), torch.Tensor)  # fused loss off: real logits in training
    apply_liger(ours, False)
    assert type(ours) is GPT and remove_liger(ours) == 0


def test_lora_model_parity():
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    cfg = tiny_config("Llama-3.2-1B", LoRAConfig, lora_r=4, lora_alpha=8, lora_query=True, lora_value=True, lora_mlp=True)
    ref, ours = _pair(cfg, LoRAGPT)
    mark_only_lora_as_trainable(ref)
    mark_only_lora_as_trainable(ours)
    report = apply_liger(ours)
    assert report.count("swiglu") == cfg.n_layer
    assert "recomputed" not in str(report)  # LoRA layers read the norm outputs themselves
    _check_parity(ref, ours, cfg)
    assert ours.lm_head.linear.weight.grad is None  # frozen lm_head: no weight gradient


def test_deferred_logits_act_as_logits():
    """What is not a loss pattern gets the real logits (tests/test_stock_code.py covers each pattern)."""
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)  # (a fresh model: it warns once, lit_liger.swap.state.ModelState.warned)
    out = ours(torch.randint(0, 150, (2, 6)))
    assert out.shape == (2, 6, cfg.padded_vocab_size)
    with pytest.warns(UserWarning, match="lit_liger.chunked_cross_entropy"):
        probs = out.softmax(-1)
    assert rel_err(probs, out.materialize().softmax(-1)) == 0.0
    assert torch.cat([out, out]).shape == (4, 6, cfg.padded_vocab_size)
    assert rel_err(out + 1, out.materialize() + 1) == 0.0
    assert out[..., :10].shape == (2, 6, 10)
    assert torch.isfinite(litgpt_ce(out, torch.zeros(2, 6, dtype=torch.long)))  # LitGPT's own loss: fused
    shifted = out[..., :-1, :]
    assert shifted.shape == (2, 5, cfg.padded_vocab_size)
    with pytest.raises(ValueError, match="shape"):
        chunked_cross_entropy(out, torch.zeros(2, 5, dtype=torch.long))
    # explicit materialization equals the real logits the model returns without grad (LitGPT's path)
    x = torch.randint(0, 150, (2, 6))
    deferred = ours(x)
    with torch.no_grad():
        real = ours(x)
        assert isinstance(real, torch.Tensor) and real.shape == (2, 6, cfg.padded_vocab_size)
        assert rel_err(deferred.materialize(), real) <= 1e-6


def test_lm_head_chunked_call_like_litgpt_finetune():
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    x = torch.randint(0, 150, (2, 10))
    y = torch.randint(0, 150, (2, 10))
    # what litgpt/finetune/lora.py does
    logits = ours(x, lm_head_chunk_size=4)
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, y[..., 1:])
    ref_logits = ref(x, lm_head_chunk_size=4)
    ref_logits[-1] = ref_logits[-1][..., :-1, :]
    assert rel_err(loss, litgpt_ce(ref_logits, y[..., 1:])) <= 1e-5


def test_llm_forward_gets_fused_loss():
    from litgpt.api import LLM

    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    llm_ref, llm = LLM(ref), LLM(ours)
    report = apply_liger(llm)
    assert any("fused loss in forward" in k for _, _, k in report.swapped)
    x = torch.randint(0, 150, (2, 9))
    _, loss = llm(x, x)
    _, loss_ref = llm_ref(x, x)
    assert rel_err(loss, loss_ref) <= 1e-5
    assert list(llm.state_dict()) == list(llm_ref.state_dict())


def test_meta_device_and_reset_parameters():
    cfg = tiny_config("gemma-2-2b")
    with torch.device("meta"):
        model = GPT(cfg)
    apply_liger(model)
    out = model(torch.randint(0, 150, (1, 4), device="meta"))
    assert isinstance(out, LigerLogits) and out.hidden.is_meta
    model.to_empty(device="cpu")
    model.apply(model._init_weights)
    for m in model.modules():
        if hasattr(m, "reset_parameters") and m is not model:
            m.reset_parameters()


def test_kv_cache_generation_same_tokens():
    from litgpt.generate.base import generate

    cfg = tiny_config("Qwen3-0.6B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    for m in (ref, ours):
        m.eval()
        m.set_kv_cache(batch_size=1)
    prompt = torch.randint(0, 150, (5,))
    torch.manual_seed(3)
    a = generate(ref, prompt, max_returned_tokens=12, temperature=0.0)
    torch.manual_seed(3)
    b = generate(ours, prompt, max_returned_tokens=12, temperature=0.0)
    assert torch.equal(a, b)


def test_state_dict_roundtrip_with_stock_litgpt():
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    stock = GPT(cfg)
    stock.load_state_dict(ours.state_dict())
    for (n1, p1), (n2, p2) in zip(stock.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    ours.load_state_dict(stock.state_dict())


def test_pickle_and_deepcopy_of_swapped_model():
    import io

    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded) is type(ours)
    assert type(copy.deepcopy(ours)) is type(ours)


# ------------------------------------------------------------------------------------------------
# GPU: real sizes in bf16, and torch.compile(fullgraph=True) over a swapped model
# ------------------------------------------------------------------------------------------------
def _real_pair(name, n_layer=2, **over):
    cfg = Config.from_name(name, n_layer=n_layer, **over)
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = GPT(cfg).to(torch.bfloat16)
    ref.apply(ref._init_weights)
    ours = copy.deepcopy(ref)
    return cfg, ref, ours


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b"])
def test_gpu_real_size_bf16_parity(name):
    """bf16 at real widths: lit-liger's error against an fp32 copy of the model is no worse than
    stock LitGPT's own bf16 error (both round differently in every op, so they are compared to the
    fp32 truth rather than to each other)."""
    over = {"sliding_window_size": None} if name == "gemma-2-2b" else {}
    cfg, ref, ours = _real_pair(name, **over)
    cfg.sliding_window_indices = None
    ref32 = copy.deepcopy(ref).float()
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 1024), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (2, 1024), device="cuda")
    losses = {}
    for key, m, fn in (("stock", ref, litgpt_ce), ("fp32", ref32, litgpt_ce), ("ours", ours, chunked_cross_entropy)):
        out = m(x)
        losses[key] = fn(out, y) if key == "ours" else fn(out, y, chunk_size=0)
        losses[key].backward()
    assert rel_err(losses["ours"], losses["fp32"]) <= max(2 * rel_err(losses["stock"], losses["fp32"]), 1e-3)
    p32, pst = dict(ref32.named_parameters()), dict(ref.named_parameters())
    worst = []
    for n, p in ours.named_parameters():
        e_ours, e_stock = rel_err(p.grad, p32[n].grad), rel_err(pst[n].grad, p32[n].grad)
        worst.append((e_ours / max(e_stock, 1e-3), n, e_ours, e_stock))
    ratio, n, e_ours, e_stock = max(worst)
    print(f"{name}: loss err vs fp32 ours {rel_err(losses['ours'], losses['fp32']):.2e} stock "
          f"{rel_err(losses['stock'], losses['fp32']):.2e}; worst grad {n}: ours {e_ours:.2e} stock {e_stock:.2e}")
    assert ratio <= 2.0, (n, e_ours, e_stock)


@pytest.mark.gpu
@pytest.mark.parametrize("min_tokens", [0, None])  # lit-liger's ops under compile; the default (LitGPT's code here)
def test_gpu_compile_fullgraph_swapped_model(min_tokens):
    cfg, ref, ours = _real_pair("Llama-3.2-1B", n_layer=2, block_size=512)
    apply_liger(ours, {"compile_min_tokens": min_tokens})
    x = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
    y[:, :10] = -100

    def step(idx, targets):
        return chunked_cross_entropy(ours(idx), targets)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)  # raises on any graph break
    loss_c = compiled(x, y)
    loss_e = step(x, y)
    assert rel_err(loss_c, loss_e) <= 1e-2
    loss_c.backward()
    assert all(p.grad is not None for p in ours.parameters() if p.requires_grad)
    # the model alone (returning the deferred logits) also compiles without graph breaks
    torch._dynamo.reset()
    out = torch.compile(ours, fullgraph=True)(x)
    assert isinstance(out, LigerLogits)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "Qwen3-1.7B", "gemma-2-2b"])
def test_gpu_training_step_has_no_host_sync(name):
    """A whole swapped training step (forward, fused loss, backward, fused AdamW) never waits for the
    GPU: no ``.item()``, no data-dependent branch, no synchronizing allocation in any swapped path
    (rms_norm_linear, rope_qkv with its v copy, the fused loss). A host sync there would serialize
    the CPU's launches with the GPU's work."""
    cfg, _, ours = _real_pair(name, n_layer=2, block_size=512)
    apply_liger(ours)
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
    y[:, :10] = -100

    def step():
        opt.zero_grad(set_to_none=True)
        chunked_cross_entropy(ours(x), y).backward()
        opt.step()

    step()  # warm-up: kernel compilation, feature probes, allocator pools
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_zero3_partitioned_lm_head_returns_logits():
    """A DeepSpeed ZeRO-3 parameter (marked by its ``ds_id``) can only get its gradient while gathered
    around its own module: the swapped model returns real logits then (LitGPT's loss path), and says so."""
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)  # (a fresh model: it warns once, lit_liger.swap.state.ModelState.warned)
    ours.lm_head.weight.ds_id = 0  # what deepspeed.zero.Init puts on every partitioned parameter
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    y = torch.randint(0, cfg.vocab_size, (2, 8))
    with pytest.warns(UserWarning, match="ZeRO-3"):
        out = ours(x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 8, cfg.padded_vocab_size)
    loss = chunked_cross_entropy(out, y)
    loss_ref = litgpt_ce(ref(x), y, chunk_size=0)
    assert rel_err(loss, loss_ref) <= 1e-5


def test_liger_config_settings_are_not_switches():
    from jsonargparse.typing import NonNegativeInt

    assert "flce_mode" not in LigerConfig.switches() and "compile_min_tokens" not in LigerConfig.switches()
    off = LigerConfig.off()
    assert not off.enabled and off.flce_mode == "fast" and off.compile_min_tokens is None
    assert LigerConfig(compile_min_tokens=0).enabled
    value = LigerConfig(compile_min_tokens=NonNegativeInt(7)).compile_min_tokens  # as the command line passes it
    assert value == 7 and type(value) is int  # a plain int: yaml.safe_dump can write the config
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="compile_min_tokens"):
            LigerConfig(compile_min_tokens=bad)


def test_mlp_writes_fc_gradients_over_fc_outputs_only_where_nothing_keeps_them():
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    from lit_liger.swap._common import _fresh_outputs

    # litgpt's LoRA recipe: LoRA on query/value, the MLP's fc_1/fc_2 are LoRALinear with r = 0
    cfg = tiny_config("Llama-3.2-1B", LoRAConfig, lora_r=4, lora_alpha=8, lora_query=True, lora_value=True)
    ref, ours = _pair(cfg, LoRAGPT)
    for m in (ref, ours):
        mark_only_lora_as_trainable(m)
    apply_liger(ours)
    mlp = ours.transformer.h[0].mlp
    assert _fresh_outputs(mlp.fc_1, mlp.fc_2)
    kept = []  # a user's activation capture: the output, and a copy of it taken at once
    handle = mlp.fc_1.register_forward_hook(lambda m, a, o: kept.append((o, o.detach().clone())))
    assert not _fresh_outputs(mlp.fc_1, mlp.fc_2)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    y = torch.randint(0, cfg.vocab_size, (2, 8))
    chunked_cross_entropy(ours(x), y).backward()
    handle.remove()
    assert len(kept) == 1 and torch.equal(*kept[0])  # still fc_1's output after the backward, not its gradient
    ours.zero_grad(set_to_none=True)
    _check_parity(ref, ours, cfg)  # and without the hook (the gradients written over fc_1/fc_2's outputs)

    class MyLinear(torch.nn.Linear):
        pass

    assert not _fresh_outputs(MyLinear(2, 2), torch.nn.Linear(2, 2))  # a subclass may keep what it returns
    assert _fresh_outputs(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))

