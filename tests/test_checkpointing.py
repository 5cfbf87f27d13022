"""LigerConfig.activation_checkpointing: each Block recomputed in backward. Same losses and gradients as without
(bit for bit on CPU, LoRA dropout included: the RNG state is restored), the Blocks' activations not kept, off in
multi-process runs, the fused loss's chunk capped, and CUDA graphs capturing the steps (stepping aside where they
cannot)."""

import copy
import functools
import importlib
import warnings

import pytest
import torch
from helpers import rel_err, saved_bytes
from test_adapter import _pair, tiny_config

import lit_liger.swap.adapter as adapter
from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy
from lit_liger.swap import gpt as swap_gpt, mlp as swap_mlp

flce = importlib.import_module("lit_liger.kernels.fused_linear_cross_entropy")  # (the package's attribute: the function)


def _step(model, x, y, seed=3):
    torch.manual_seed(seed)  # the dropout masks
    model.zero_grad(set_to_none=True)
    loss = chunked_cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _data(cfg, B=2, T=12):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y[0, :3] = -100
    return x, y


def _lora_pair(dropout, name="Llama-3.2-1B", lora_mlp=True, **over):
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    cfg = tiny_config(name, config_cls=LoRAConfig, lora_r=4, lora_alpha=8, lora_query=True,
                      lora_value=True, lora_mlp=lora_mlp, lora_dropout=dropout, **over)
    torch.manual_seed(0)
    a = LoRAGPT(cfg)
    for n, p in a.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    mark_only_lora_as_trainable(a)
    return cfg, a, copy.deepcopy(a)


@pytest.mark.parametrize("name, buckets", [
    ("Llama-3.2-1B", False), ("Llama-3.2-1B", True), ("gemma-2-2b", False), ("gemma-3-1b-it", False),
    ("Qwen3-0.6B", False), ("Mixtral-8x7B-v0.1", False), ("pythia-14m", False),
])
def test_same_loss_and_gradients_as_without(name, buckets, monkeypatch):
    """Six families (gemma-3 with per-layer RoPE, ``rope_indices``), and with the length padded to a bucket. The
    fused loss runs one row per chunk on both sides (checkpointing caps its chunk, see below; the lm_head's fp32
    weight gradient sums its chunks in another order with another chunk size)."""
    monkeypatch.setattr(swap_gpt, "_BUCKETS_ON_CPU", buckets)
    monkeypatch.setattr(flce, "_CPU_CHUNK_BYTES", 1)
    cfg = tiny_config(name)
    _, plain = _pair(cfg)
    ckpt = copy.deepcopy(plain)
    apply_liger(plain)
    report = str(apply_liger(ckpt, LigerConfig(activation_checkpointing=True)))
    assert "recomputed in backward, only its input kept" in report
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    loss_b, grads_b = _step(ckpt, x, y)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == sum(1 for _ in plain.parameters())
    for n in grads_a:
        assert torch.equal(grads_a[n], grads_b[n]), n


def test_lora_dropout_masks_repeat_in_the_recompute():
    cfg, plain, ckpt = _lora_pair(dropout=0.3)
    apply_liger(plain)
    apply_liger(ckpt, LigerConfig(activation_checkpointing=True))
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    loss_b, grads_b = _step(ckpt, x, y)
    assert torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert torch.equal(grads_a[n], grads_b[n]), n
    # the test can tell: without the RNG state restored, the recompute draws other masks and the gradients part
    unrestored = functools.partial(torch.utils.checkpoint.checkpoint, preserve_rng_state=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(swap_gpt, "_checkpoint", lambda *a, preserve_rng_state, **kw: unrestored(*a, **kw))
        loss_c, grads_c = _step(ckpt, x, y)
    assert torch.equal(loss_a, loss_c)  # the forward is the same: the masks differ only in the recompute
    assert any(not torch.equal(grads_a[n], grads_c[n]) for n in grads_a)


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b"])
def test_frozen_mlp_runs_in_chunks_inside_checkpointed_blocks(name, monkeypatch):
    """LoRA on query and value only (litgpt's default LoRA recipe: the MLPs are frozen, LoRALinear with r = 0):
    in checkpointed Blocks each MLP runs as ``glu_mlp`` (several chunks of rows here), in the forward and in the
    backward's recompute, with LoRA dropout; the loss and the LoRA gradients equal the run without checkpointing
    (which does not use it) up to fp32 rounding (the chunked GEMMs sum in another order)."""
    from lit_liger.kernels import _launch

    monkeypatch.setattr(_launch, "MLP_MIN_ROWS", 1)  # 4 chunks of 6 rows at 2 x 12 tokens
    calls, real = [], swap_mlp.glu_mlp
    monkeypatch.setattr(swap_mlp, "glu_mlp", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    cfg, plain, ckpt = _lora_pair(0.2, name, lora_mlp=False)
    apply_liger(plain)
    apply_liger(ckpt, LigerConfig(activation_checkpointing=True))
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    assert calls == []
    loss_b, grads_b = _step(ckpt, x, y)
    assert calls == [(2, 12, cfg.n_embd)] * (2 * cfg.n_layer)  # each Block's forward and its recompute
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys() and grads_a
    assert all("lora_" in n for n in grads_a)
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, (n, rel_err(grads_b[n], grads_a[n]))
    # trainable MLP weights (full fine-tuning): the usual path, which computes their gradients
    calls.clear()
    for p in ckpt.parameters():
        p.requires_grad_(True)
    _step(ckpt, x, y)
    assert calls == []


def test_blocks_keep_only_their_input_for_backward():
    """Autograd keeps nothing from inside the checkpointed Blocks: with depth, what the forward saves grows by one
    ``(B, T, C)`` input per Block."""
    kept = {}
    for n_layer in (2, 4):
        cfg = tiny_config("Llama-3.2-1B", n_layer=n_layer)
        _, plain = _pair(cfg)
        ckpt = copy.deepcopy(plain)
        apply_liger(plain)
        apply_liger(ckpt, LigerConfig(activation_checkpointing=True))
        x, _ = _data(cfg)
        # activations only: the parameters' storages are not counted
        kept[n_layer] = [saved_bytes(lambda m=m: m(x), exclude=list(m.parameters()))[1] for m in (plain, ckpt)]
    (plain2, ckpt2), (plain4, ckpt4) = kept[2], kept[4]
    block_input = x.numel() * cfg.n_embd * 4  # (B, T, C) fp32: all a checkpointed Block keeps
    assert ckpt4 - ckpt2 == 2 * block_input  # two more layers: two more inputs, nothing from inside them
    assert plain4 - plain2 > 5 * (ckpt4 - ckpt2)  # kept whole, two more layers' activations
    assert 0 < ckpt2 < plain2


def test_loss_chunk_capped_at_the_kept_inputs(monkeypatch):
    """With checkpointing, the fused loss's logits chunk is capped at the bytes of the Blocks' kept inputs
    (``n_layer`` x ``(B, T, C)``): the (rows, V) buffer fits in them. Without checkpointing: the default."""
    cfg = tiny_config("Llama-3.2-1B")
    _, plain = _pair(cfg)
    ckpt = copy.deepcopy(plain)
    apply_liger(plain)
    apply_liger(ckpt, LigerConfig(activation_checkpointing=True))
    x, y = _data(cfg)
    rows, real = [], flce._row_chunk
    monkeypatch.setattr(flce, "_row_chunk", lambda *a: rows.append((a[4], real(*a))) or rows[-1][1])  # a[4]: chunk_size
    _step(plain, x, y)
    _step(ckpt, x, y)
    cap = cfg.n_layer * x.numel() * cfg.n_embd * 4  # fp32
    n_rows, row_bytes = x.numel(), cfg.padded_vocab_size * 4
    assert cap < n_rows * row_bytes  # (the cap binds at these sizes)
    (plain_arg, plain_rows), (ckpt_arg, ckpt_rows) = rows
    assert plain_arg == 0 and plain_rows == n_rows  # one chunk: the CPU default holds all rows
    assert ckpt_arg == -cap and ckpt_rows * row_bytes <= cap and ckpt_rows < n_rows
    assert ckpt_rows == flce._balanced(n_rows, cap // row_bytes, 1)  # equal chunks within the cap


def test_composes_with_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) traces the checkpointed Blocks (dynamo's checkpoint support) with lit-liger's
    ops inside (compile_min_tokens=0), same loss and gradients as the eager model without checkpointing."""
    cfg = tiny_config("Llama-3.2-1B")
    _, plain = _pair(cfg)
    ckpt = copy.deepcopy(plain)
    apply_liger(plain, LigerConfig(compile_min_tokens=0))
    apply_liger(ckpt, LigerConfig(activation_checkpointing=True, compile_min_tokens=0))
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    loss_b, grads_b = _step(torch.compile(ckpt, backend="aot_eager", fullgraph=True), x, y)
    grads_b = {n.removeprefix("_orig_mod."): g for n, g in grads_b.items()}
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys()
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, n


def test_no_grad_and_multi_process_run_the_blocks_plainly(monkeypatch):
    cfg = tiny_config("Llama-3.2-1B")
    _, model = _pair(cfg)
    apply_liger(model, LigerConfig(activation_checkpointing=True))
    assert swap_gpt._checkpoint_blocks_here(model)
    with torch.no_grad():
        assert not swap_gpt._checkpoint_blocks_here(model)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with pytest.warns(UserWarning, match="single-process and DDP runs; under this sharding strategy it is off"):
        assert not swap_gpt._checkpoint_blocks_here(model)  # (a fresh model warns, once: its ModelState.warned)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert not swap_gpt._checkpoint_blocks_here(model)
    apply_liger(model)  # the default, automatic: silent under a sharding strategy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not swap_gpt._checkpoint_blocks_here(model)
    apply_liger(model, LigerConfig(activation_checkpointing=False))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert not swap_gpt._checkpoint_blocks_here(model)


def test_config_default_and_switch_semantics():
    assert LigerConfig().activation_checkpointing is None  # automatic (lit_liger.runtime.memplan; tests/test_memplan.py)
    assert LigerConfig.from_value(True).activation_checkpointing is None  # a setting, not a kernel switch
    assert "activation_checkpointing" not in LigerConfig.switches()
    with pytest.raises(TypeError, match="activation_checkpointing"):
        LigerConfig(activation_checkpointing="yes")


# ------------------------------------------------------------------------------------------------
# GPU: bf16 kernels, CUDA graphs capturing or stepping aside, memory
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_lora_with_dropout_same_as_without_and_less_memory(monkeypatch):
    """Real widths (Llama-3.2-1B, 2 layers, LoRA r8 q+v with dropout, bf16): with activation_checkpointing the
    loss and LoRA gradients equal the plain lit-liger run's, CUDA graphs (asked for, ``CAPTURE_CHECKPOINTED`` off as
    on torch < 2.10) step aside with a warning, and the peak memory of the step is lower."""
    from test_buckets import _gpu_models

    from lit_liger.runtime import graphs as graphs_mod

    monkeypatch.setattr(graphs_mod, "CAPTURE_CHECKPOINTED", False)

    cfg, ckpt, plain = _gpu_models(True, dropout=0.05)  # graphs asked for on the first, off on the second
    apply_liger(ckpt, LigerConfig(cuda_graphs=True, activation_checkpointing=True))
    x = torch.randint(0, cfg.vocab_size, (4, 500), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (4, 500), device="cuda")
    results, peaks = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for model in (plain, ckpt):
            _step(model, x, y)  # warm-up (kernels compiled, buffers made)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            results.append(_step(model, x, y))
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - base)
    assert any("activation_checkpointing" in str(w.message) for w in caught)  # graphs stepped aside
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert rel_err(loss_b, loss_a) <= 1e-4 and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:  # flash attention's backward accumulates dq with atomics: not bit for bit on a GPU
        assert rel_err(grads_b[n], grads_a[n]) <= 2e-2, (n, rel_err(grads_b[n], grads_a[n]))
    # kept activations ~50 KB per token per layer: ~200 MB at 4 x 500 x 2 layers, against 8 MB of Block inputs
    # plus one Block's recompute; the 513 MB logits chunk of the fused loss is in both peaks
    assert peaks[1] < peaks[0] - (100 << 20), peaks


@pytest.mark.gpu
def test_gpu_graphs_capture_checkpointed_steps(monkeypatch):
    """With ``graphs.CAPTURE_CHECKPOINTED`` on (the default; torch >= 2.10): a checkpointed LoRA model with dropout is captured and
    replayed, and from the same seed each replay gives the loss and gradients of the uncaptured model without
    checkpointing, i.e. the recompute inside the graph redraws the forward's dropout masks (other masks in the
    recompute give other LoRA gradients: on CPU, test_lora_dropout_masks_repeat_in_the_recompute shows the test
    there can tell)."""
    from test_buckets import _gpu_models, seeded_replays_match

    from lit_liger.runtime import graphs as graphs_mod

    if torch.__version__ < "2.10":
        pytest.skip("torch < 2.10 cannot rewind the CUDA generator inside a capture")
    assert graphs_mod.CAPTURE_CHECKPOINTED
    cfg, graphed, plain = _gpu_models(lora=True, dropout=0.2)
    apply_liger(graphed, LigerConfig(cuda_graphs=True, activation_checkpointing=True))
    seeded_replays_match(cfg, graphed, plain)


def test_block_drops_what_it_no_longer_reads_before_its_last_add(monkeypatch):
    """Issue 68: a swapped Block's forward lets go of the qkv output and the attention's output once read (held to the
    return, they sat beside the MLP's and the Block's outputs: 5 GiB at a 262k-token rerun of Llama-3.1-8B, the
    backward's peak). Checked where the Block adds the MLP's output (``post_mlp_norm`` is called then), in a LoRA
    model with every Block's norm formed again (the path of a long sequence's rerun), with the loss still the same."""
    import weakref

    cfg, plain, liger = _lora_pair(0.0, n_layer=2)
    apply_liger(plain, LigerConfig(activation_checkpointing=False, recompute_norm=False))
    apply_liger(liger, LigerConfig(activation_checkpointing=False))
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    seen, alive = {}, []
    for block in liger.transformer.h:
        attn = block.attn
        real_attend = attn._liger_attend

        def attend(qkv, *a, _real=real_attend, **kw):
            out = _real(qkv, *a, **kw)
            seen["qkv"], seen["attn"] = weakref.ref(qkv), weakref.ref(out)
            return out

        monkeypatch.setattr(attn, "_liger_attend", attend)
        block.post_mlp_norm.register_forward_pre_hook(
            lambda *_: alive.append(tuple(seen[k]() is not None for k in ("qkv", "attn"))))
    loss_b, grads_b = _step(liger, x, y)
    assert alive == [(False, False)] * cfg.n_layer
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys()
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, n
