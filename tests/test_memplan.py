"""Long documents (issue 47): the activation memory plan (``LigerConfig.activation_checkpointing=None``,
``lit_liger.runtime.memplan``) and the CUDA graphs' governance (``cuda_graphs_max_tokens``, the pool's budget, out-of-memory
fallback). CPU: the plan's decisions, partial recompute and host offload give the same losses and gradients as
keeping every Block's activations, the log lines, the graphs' decisions with the capture itself stubbed. GPU: the same
on a real device, and a run over 30 lengths that keeps the pool under its budget."""

import copy
import weakref
import types
from dataclasses import replace
import warnings

import pytest
import torch
from helpers import rel_err
from test_checkpointing import _data, _lora_pair, _step

import triton.language as tl  # (the GPU test's kernel, _add_one_kernel)

import lit_liger.swap.adapter as adapter
from lit_liger import LigerConfig, apply_liger
from lit_liger.runtime import graphs
from lit_liger.runtime import memplan
from lit_liger.swap.state import CAPTURE_COUNTERS, state_of
from lit_liger.swap import gpt as swap_gpt
from lit_liger.swap import block as swap_block, mlp as swap_mlp
from lit_liger.runtime import memplan as runtime_memplan

GiB = 2**30


def _config(name: str):
    from litgpt import Config

    return Config.from_name(name)


# ------------------------------------------------------------------------------------------------
# the plan's decisions
# ------------------------------------------------------------------------------------------------
def test_decide_keeps_then_recomputes_the_fewest_then_offloads():
    cfg = _config("Llama-3.1-8B")  # 32 Blocks, width 4096, MLP 14336
    per_token = memplan.kept_bytes_per_token(cfg)
    assert per_token == 2 * (6 * 4096 + 2 * 14336)
    free = 56 * GiB  # an 80 GB card less the bf16 weights and margins
    short = memplan.decide(cfg, 2048, free)
    assert short.recompute == 0 and not short.offload and short.need <= free
    mid = memplan.decide(cfg, 32768, free)
    assert 0 < mid.recompute < cfg.n_layer and not mid.offload and mid.need <= free
    # the fewest: one Block fewer recomputed would not fit
    T = 32768
    fewer = (cfg.n_layer - mid.recompute + 1) * per_token * T + (mid.recompute - 1) * 4096 * 2 * T
    assert fewer + 3 * 4096 * 2 * T + memplan.LOSS_CHUNK + 2 * per_token * T > free
    long = memplan.decide(cfg, 131072, free)
    assert long.recompute == cfg.n_layer and long.offload and long.need <= free  # some Block inputs on the host
    with pytest.raises(memplan.MemoryPlanError):  # (no host memory: inside DDP's wrapper)
        memplan.decide(cfg, 131072, free, allow_offload=False)
    assert not memplan.decide(cfg, 131072, free, allow_offload=False, tile=True).offload  # (tiled, it fits the GPU)
    with pytest.raises(memplan.MemoryPlanError, match="no memory plan fits 524,288 tokens"):
        memplan.decide(cfg, 4 * 131072, free)
    plans = [memplan.decide(cfg, t, free) for t in (1024, 4096, 8192, 16384, 32768, 65536, 131072)]
    assert [(p.offload, p.recompute) for p in plans] == sorted((p.offload, p.recompute) for p in plans)
    line = mid.line(T, 32)
    assert f"{mid.recompute} of 32 Blocks recomputed in backward" in line and "32,768 tokens" in line
    assert "--liger.activation_checkpointing true|false overrides" in line


def test_mlp_level_where_it_buys_more_memory_per_added_flop():
    """With the MLP level (``mlp=True``): at 16k tokens on a device that cannot keep every Block (8B, 44 GiB free),
    the plan recomputes MLP inputs only, fits, and adds fewer FLOPs than the fewest whole Blocks that fit; at 32k it
    mixes both, still cheaper; where everything fits it keeps everything, and without the level it is the Block plan."""
    cfg = _config("Llama-3.1-8B")
    free = 44 * GiB
    for T in (16384, 32768):
        blocks = memplan.decide(cfg, T, free)
        mixed = memplan.decide(cfg, T, free, mlp=True)
        assert blocks.mlp == 0 and 0 < blocks.recompute < cfg.n_layer and blocks.need <= free
        assert mixed.mlp > 0 and mixed.need <= free and mixed.recompute < blocks.recompute

        def added(p):
            return p.recompute * memplan.block_forward_flops(cfg, T) + p.mlp * memplan.mlp_recompute_flops(cfg)

        assert added(mixed) < added(blocks)
        # the fewest MLP-level Blocks for its recomputed ones: one fewer would not fit
        one_fewer = memplan.MemPlan(mixed.recompute, False, mixed.need + (2 * cfg.intermediate_size - cfg.n_embd) * 2 * T,
                                    free, mixed.mlp - 1)
        assert one_fewer.need > free
    assert memplan.decide(cfg, 16384, free, mlp=True).recompute == 0
    assert memplan.decide(cfg, 2048, free, mlp=True) == memplan.decide(cfg, 2048, free)
    narrow = _config("Llama-3.2-1B")
    narrow.intermediate_size = narrow.n_embd // 4  # (the MLP level would save nothing: the Block plan)
    assert memplan.decide(narrow, 32768, 8 * GiB, mlp=True) == memplan.decide(narrow, 32768, 8 * GiB)
    line = memplan.decide(cfg, 32768, free, mlp=True).line(32768, 32)
    assert "Blocks' MLP inputs recomputed in backward (recompute_mlp)" in line and "Blocks recomputed" in line
    # per token: q, k, v (32 + 2 x 8 heads of 128), the output projection, the GLU's three; causal attention over 16k
    assert memplan.block_forward_flops(cfg, 16384) == 2 * (4096 * 48 * 128 + 4096 * 4096 + 3 * 4096 * 14336) \
        + 2 * 16384 * 4096
    assert memplan.mlp_recompute_flops(cfg) == 2 * 2 * 4096 * 14336


def test_mlp_level_applies_to_plain_projections_only():
    """The MLP level is offered where every Block's MLP can leave its inputs to backward: LoRA on attention only
    (frozen plain projections) and full training (fused with norm_2); not LoRA on the MLP; not off the Triton path."""
    from test_adapter import _pair, tiny_config

    cfg, _, attn_only = _lora_pair(dropout=0.0, lora_mlp=False)
    _, _, on_mlp = _lora_pair(dropout=0.0, lora_mlp=True)
    _, full = _pair(tiny_config("Llama-3.2-1B"))
    x, _ = _data(cfg)
    for model in (attn_only, on_mlp, full):
        apply_liger(model)
    assert swap_gpt._mlp_recomputable(attn_only, x) and swap_gpt._mlp_recomputable(full, x)
    assert not swap_gpt._mlp_recomputable(on_mlp, x)
    full.transformer.h[0].mlp.fc_1.weight.requires_grad_(False)
    full.transformer.h[0].mlp.fc_2.weight.requires_grad_(False)
    assert not swap_gpt._mlp_recomputable(full, x)  # (a trained proj beside frozen fc_1 / fc_2)
    full.requires_grad_(True)
    apply_liger(full, LigerConfig(recompute_norm=False))
    assert not swap_gpt._mlp_recomputable(full, x)


def _full_pair():
    """A tiny Llama trained in full, twice: one keeping every Block's activations, one with the automatic plan."""
    from test_adapter import _pair, tiny_config

    cfg = tiny_config("Llama-3.2-1B")
    _, plain = _pair(cfg)
    auto = copy.deepcopy(plain)
    apply_liger(plain, LigerConfig(activation_checkpointing=False))
    apply_liger(auto)
    return cfg, plain, auto


@pytest.mark.parametrize(("kind", "recompute", "mlp"), [("lora", 0, 2), ("lora", 1, 1), ("full", 0, 2)])
def test_planned_mlp_level_same_as_keeping(kind, recompute, mlp, monkeypatch):
    """A plan with MLP-level Blocks (``MemPlan.mlp``), alone or above a recomputed Block: LoRA on attention with
    dropout (the frozen MLPs run as ``glu_mlp``) and full training (``rms_norm_glu_mlp``, recompute_mlp's function)
    give the losses and gradients of keeping everything, through the recomputing functions, once per MLP-level Block."""
    if kind == "lora":
        cfg, plain, auto = _lora_pair(dropout=0.2, lora_mlp=False)
        apply_liger(plain, LigerConfig(activation_checkpointing=False))
        apply_liger(auto)
    else:
        cfg, plain, auto = _full_pair()
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    calls = {"glu_mlp": 0, "rms_norm_glu_mlp": 0}
    for name in calls:
        where = swap_mlp if name == "glu_mlp" else swap_block  # (the frozen MLP's path, the Block's fused one)
        real = getattr(where, name)
        monkeypatch.setattr(where, name, lambda *a, _real=real, _name=name, **kw:
                            calls.__setitem__(_name, calls[_name] + 1) or _real(*a, **kw))
    _force(monkeypatch, recompute, False, mlp)
    loss_b, grads_b = _step(auto, x, y)
    # (a recomputed Block's frozen MLP runs as glu_mlp too, in its forward and again in its rerun)
    assert calls == ({"glu_mlp": mlp + 2 * recompute, "rms_norm_glu_mlp": 0} if kind == "lora"
                     else {"glu_mlp": 0, "rms_norm_glu_mlp": mlp}), calls
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, (n, rel_err(grads_b[n], grads_a[n]))


def test_dataparallel_estimates_with_the_same_per_token_bytes():
    from lit_liger.parallel import dataparallel as dp

    cfg = _config("Llama-3.2-1B")
    est = dp.estimate(cfg, 1_000_000, 0, 2, 4, 512, 80 * GiB, False)
    loss = 2048 * cfg.padded_vocab_size * 4
    assert est.activations - loss == 2048 * cfg.n_layer * memplan.kept_bytes_per_token(cfg)


# ------------------------------------------------------------------------------------------------
# the plan applied: the same numbers, less kept
# ------------------------------------------------------------------------------------------------
def _force(monkeypatch, recompute: int, offload: bool, mlp: int = 0, host: int = 0, tile: int = 0, pairs: int = 0,
           attn: int = 0, attn_host: int = 0):
    """Every plan: ``recompute`` Blocks recomputed, the lowest ``host`` of them (with ``offload``: all) keeping
    their inputs in host memory, the lowest ``2 * pairs`` of those in pairs, ``mlp`` Blocks at the MLP level, MLP
    tiles of ``tile`` tokens, the lowest ``attn`` keeping their attention's output (``attn_host`` of them on the
    host)."""
    monkeypatch.setattr(runtime_memplan, "plan_for", lambda gpt, tokens, device, elt=2, allow_offload=True,
                        **_: memplan.MemPlan(recompute, offload and allow_offload, 0.0, 1.0, mlp,
                                             host=host if allow_offload else 0, tile=tile,
                                             pairs=pairs if allow_offload else 0,
                                             attn=attn if allow_offload else 0,
                                             attn_host=attn_host if allow_offload else 0))


@pytest.mark.parametrize(("recompute", "offload"), [(1, False), (2, False), (2, True)])
def test_planned_recompute_and_offload_same_as_keeping(recompute, offload, monkeypatch):
    """LoRA with dropout (the recompute redraws the forward's masks), 2 layers: the lowest ``recompute`` Blocks rerun
    in backward, with ``offload`` their inputs copied out when saved and back when the backward needs them (on CPU a
    copy): loss and gradients equal the run that keeps everything, and the offload path copied each Block's input."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    packed, real = [], memplan._OnHost.__init__

    def counting(self, host, event, device):
        packed.append(tuple(host.shape))
        real(self, host, event, device)

    monkeypatch.setattr(memplan._OnHost, "__init__", counting)
    cfg, plain, auto = _lora_pair(dropout=0.2)
    apply_liger(plain, LigerConfig(activation_checkpointing=False))
    apply_liger(auto)  # the default: automatic
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    recomputed = []
    real_ckpt = swap_gpt._checkpoint
    monkeypatch.setattr(swap_gpt, "_checkpoint", lambda *a, **kw: recomputed.append(kw["use_reentrant"]) or
                        real_ckpt(*a, **kw))
    _force(monkeypatch, recompute, offload)
    loss_b, grads_b = _step(auto, x, y)
    assert recomputed == [offload] * recompute  # the lowest Blocks, reentrant where the input is offloaded
    assert packed == ([(2, 12, cfg.n_embd)] * recompute if offload else [])
    assert torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-6, (n, rel_err(grads_b[n], grads_a[n]))


def test_full_training_offloaded_gradients_reach_every_parameter(monkeypatch):
    """Every weight trains (the embedding too): with all Blocks offloaded the embedding still gets its gradient
    through the reentrant checkpoint."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    cfg, plain, auto = _full_pair()
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    _force(monkeypatch, cfg.n_layer, True)
    loss_b, grads_b = _step(auto, x, y)
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys()
    assert len(grads_a) == sum(1 for _ in plain.parameters())
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, n


def test_offloaded_lowest_block_keeps_no_leaf_of_the_frozen_embedding_output(monkeypatch):
    """LoRA (a frozen embedding): the lowest Block's reentrant checkpoint needs an input with grad. The graph's leaves
    are the trained parameters and a 0-dim anchor, not the (B, T, C) embedding output (which, made a leaf, its
    AccumulateGrad node would hold with its gradient while the graph lives); the embedding output gets no gradient,
    and the loss and gradients are those of keeping everything."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    cfg, plain, auto = _lora_pair(dropout=0.0)
    apply_liger(plain, LigerConfig(activation_checkpointing=False))
    apply_liger(auto)
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    _force(monkeypatch, cfg.n_layer, True)
    from lit_liger import chunked_cross_entropy

    torch.manual_seed(3)  # (as _step)
    loss = chunked_cross_entropy(auto(x), y)
    leaves, seen, todo = [], set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad
            leaves.append(node.variable)
        todo.extend(n for n, _ in node.next_functions)
    trained = {id(p) for p in auto.parameters() if p.requires_grad}
    assert leaves and all(id(t) in trained or t.dim() == 0 for t in leaves), [tuple(t.shape) for t in leaves]
    assert any(t.dim() == 0 for t in leaves)  # (the anchor: the checkpoint's output needs grad)
    auto.zero_grad(set_to_none=True)
    loss.backward()
    grads_b = {n: p.grad for n, p in auto.named_parameters() if p.grad is not None}
    assert rel_err(loss.detach(), loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, n


def test_plan_line_printed_when_the_plan_grows(monkeypatch, capsys):
    cfg, _, model = _lora_pair(dropout=0.0)
    apply_liger(model)
    x, y = _data(cfg)
    for recompute, offload in [(0, False), (1, False), (0, False), (1, False), (2, True), (1, False)]:
        _force(monkeypatch, recompute, offload)
        _step(model, x, y)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "lit-liger: memory plan" in ln]
    assert len(lines) == 3, lines
    assert "every Block's activations kept" in lines[0] and "1 of 2 Blocks recomputed" in lines[1]
    assert "inputs kept in pinned host memory" in lines[2]


def _recomputing_plan(monkeypatch):
    """A swapped tiny LoRA model, its data, and every forward planned as 2 Blocks recomputed against a stubbed 80 GiB
    device (16 GiB allocated, 1 GiB of gradients to come): ``(model, x, y, room)``."""
    cfg, _, model = _lora_pair(dropout=0.0)
    apply_liger(model)
    x, y = _data(cfg)
    room = memplan.Room(total=80 * GiB, fraction=0.75, allocated=16 * GiB, grads=1 * GiB, state=0.0)
    monkeypatch.setattr(runtime_memplan, "plan_for", lambda gpt, tokens, device, elt=2, allow_offload=True, **_:
                        memplan.MemPlan(2, False, 40 * GiB, 43 * GiB, room=room))
    return model, x, y, room


def test_first_recomputing_plan_said_against_its_measured_peak(monkeypatch, capsys):
    """The first plan that recomputes is said, then once, at the next planned forward, the GPU peak and host memory
    measured by then against the plan's expected peak (issue 68: the estimate within 10% of the measured peak)."""
    model, x, y, room = _recomputing_plan(monkeypatch)
    reads = []
    monkeypatch.setattr(swap_gpt, "_measured_peaks", lambda device: reads.append(device) or (55 * GiB, 20 * GiB))
    for _ in range(3):
        _step(model, x, y)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "lit-liger: memory plan" in ln]
    assert len(lines) == 2 and len(reads) == 1, lines
    assert "2 of 2 Blocks recomputed" in lines[0] and "a GPU peak of about 57.0 GiB" in lines[0]
    assert lines[1].endswith("measured: a GPU peak of 55.0 GiB (the plan expected 57.0 GiB: -3.5%), host memory at "
                             "most 20.0 GiB"), lines[1]
    # the host's pinned Block inputs and optimizer state still to come are said beside
    plan = memplan.MemPlan(32, True, 40 * GiB, 43 * GiB, host=30, host_need=60 * GiB,
                           room=replace(room, state=2 * GiB))
    said = plan.peak_line(262144, 61 * GiB, 70 * GiB)
    assert "a GPU peak of 61.0 GiB (the plan expected 59.0 GiB: +3.4%, of which 2.0 GiB of optimizer state" in said
    assert said.endswith("host memory at most 70.0 GiB (60.0 GiB of it pinned for Block inputs)")
    assert memplan.MemPlan(0, False, 1.0, 2.0).expected_peak is None  # (no device read: no expected peak)


def test_a_one_step_run_says_its_measured_peak_before_generation_or_at_fit_s_end(monkeypatch, capsys):
    """A run whose first recomputing step has no planned forward after it (one long step, then litgpt's closing
    example generation, save and merge) says the measured peak before ``fit`` calls its module's
    ``generate_example`` (whose KV cache would count in the peak), or once ``fit`` returns; once; the module's
    ``generate_example`` is litgpt's again afterwards. ``LigerCallback`` says it where the Trainer's training ends."""
    import sys
    from lit_liger import cli

    model, x, y, _ = _recomputing_plan(monkeypatch)
    monkeypatch.setattr(swap_gpt, "_measured_peaks", lambda device: (55 * GiB, 20 * GiB))
    events = []
    fake = types.ModuleType("fake_litgpt_recipe")

    def generate_example(*args):
        events.append(("generate", capsys.readouterr().out))

    def fit(model, generate):
        events.append(("step", None))
        _step(model, x, y)
        if generate:
            fake.generate_example(model)
        return "out"

    fit.__module__ = fake.__name__
    fake.generate_example, fake.fit = generate_example, fit
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    gpt = cli._swapped_gpt(model)
    for generate in (True, False):
        gpt.__dict__.pop("_liger_peak_due", None)
        gpt.__dict__.pop("_liger_mem_said", None)
        events.clear()
        with cli._peak_said(fit, gpt):
            assert fit(model, generate) == "out"
        out = capsys.readouterr().out
        measured = "measured: a GPU peak of 55.0 GiB (the plan expected 57.0 GiB: -3.5%)"
        if generate:  # (said before the generation starts, not after)
            assert measured in events[-1][1] and measured not in out, (events, out)
        else:
            assert [ln for ln in out.splitlines() if measured in ln], out
        assert fake.generate_example is generate_example
        assert not gpt.__dict__.get("_liger_peak_due")
    # the Trainer's LigerCallback says it where training ends (before it releases the graphs)
    from lit_liger.callback import LigerCallback

    gpt.__dict__.pop("_liger_peak_due", None)
    gpt.__dict__.pop("_liger_mem_said", None)
    _step(model, x, y)
    capsys.readouterr()
    LigerCallback._release_graphs(types.SimpleNamespace(is_global_zero=True), model)
    LigerCallback._release_graphs(types.SimpleNamespace(is_global_zero=True), model)  # (teardown's call: once)
    said = [ln for ln in capsys.readouterr().out.splitlines() if "measured: a GPU peak" in ln]
    assert len(said) == 1, said


def test_explicit_settings_and_cpu_default(monkeypatch):
    """``True``: every Block, ``False``: none, ``None`` on CPU tensors: nothing to plan (no device memory)."""
    cfg, _, model = _lora_pair(dropout=0.0)
    x, _ = _data(cfg)
    for setting, expected in [(True, (cfg.n_layer, False, 0, 0, 0, 0, 0, 0)), (False, swap_gpt.NO_PLAN),
                              (None, swap_gpt.NO_PLAN)]:
        apply_liger(model, LigerConfig(activation_checkpointing=setting))
        assert swap_gpt._memory_plan_here(model, x) == expected
    with torch.no_grad():
        apply_liger(model, LigerConfig(activation_checkpointing=True))
        assert swap_gpt._memory_plan_here(model, x) == swap_gpt.NO_PLAN
    assert memplan.plan_for(model, 24, torch.device("cpu")) is None


def test_plan_for_rereads_the_allocator_only_when_close(monkeypatch):
    """Short micro-batches are planned from the last reading; one that might not fit reads again."""
    cfg = _config("Llama-3.2-1B")
    reads = []

    def room(g, device, fraction=None):
        reads.append(device)
        return memplan.Room(40 * GiB / memplan.MEMORY_FRACTION, memplan.MEMORY_FRACTION, 0, 0, 0)  # (40 GiB free)

    monkeypatch.setattr(memplan, "room_now", room)
    monkeypatch.setattr(memplan, "host_available", lambda: 64 * GiB)
    gpt = types.SimpleNamespace(config=cfg, parameters=lambda: iter([torch.nn.Parameter(torch.zeros(4))]))
    cuda = types.SimpleNamespace(type="cuda")
    assert memplan.plan_for(gpt, 2048, cuda).recompute == 0 and len(reads) == 1
    for _ in range(10):
        assert memplan.plan_for(gpt, 2048, cuda).recompute == 0
    assert len(reads) == 1
    big = memplan.plan_for(gpt, 200_000, cuda)
    assert big.recompute > 0 and len(reads) == 2  # close to the limit: read again
    monkeypatch.setattr(memplan, "REREAD_EVERY", 3)
    for _ in range(4):
        memplan.plan_for(gpt, 2048, cuda)
    assert len(reads) == 3


# ------------------------------------------------------------------------------------------------
# issue 68: both memories counted, tiles, the error before the step
# ------------------------------------------------------------------------------------------------
def test_offload_keeps_as_many_inputs_on_the_gpu_as_fit():
    """8B at 128k tokens (one Block input: exactly 1 GiB; one kept Block: 13 GiB) with 56 GiB: every Block is
    recomputed and only the lowest 4 inputs go to the host: the larger of the loss's moment (3 inputs + its 1 GiB
    chunk) and a Block's backward (its rerun and gradients, 2 x 13 GiB, the hidden states' gradient, 1 GiB), plus the
    input back from the host, take 28 GiB, which leaves room for 28 inputs on the GPU. One more input on the GPU would
    not fit."""
    cfg = _config("Llama-3.1-8B")
    T, free = 131072, 56 * GiB
    inp = 4096 * 2 * T
    assert inp == GiB and memplan.kept_bytes_per_token(cfg) * T == 13 * GiB
    plan = memplan.decide(cfg, T, free)
    assert (plan.recompute, plan.host, plan.offload, plan.tile) == (32, 4, True, 0)
    assert plan.need == (max(4, 26 + 1) + 1 + 28) * GiB <= free and plan.need + inp > free
    assert plan.host_need == 4 * memplan.host_bytes(inp) == 4 * GiB
    line = plan.line(T, 32)
    assert "32 of 32 Blocks recomputed in backward, 4 of their inputs kept in pinned host memory (4.0 GiB)" in line
    assert "the other 28 on the GPU" in line and "does not fit" not in line
    # the old meaning of `offload` still holds: made with offload=True and no host count, every recomputed Block's
    old = memplan.MemPlan(32, True, 0.0, 1.0)
    assert old.host == 32 and old.offload and not memplan.MemPlan(32, False, 0.0, 1.0).offload
    assert "all 32 Blocks recomputed in backward, their inputs kept in pinned host memory" in old.line(T, 32)


def test_tiles_keep_inputs_off_the_host_and_the_host_budget_bounds_the_plan():
    """With tiles the recomputed Block's rerun and gradients hold no (T, I) tensor whole: at 128k tokens with 40 GiB
    the plan puts 2 inputs on the host where whole MLPs need 20; a host that can pin 9 GiB takes the tiled plan and
    refuses the whole one, whose 20 inputs need 10 GiB even in pairs (an error that names both memories); with 56 GiB
    the tiled plan needs no host at all."""
    cfg = _config("Llama-3.1-8B")
    T, inp, tile = 131072, GiB, 9344
    whole = memplan.decide(cfg, T, 40 * GiB)
    tiled = memplan.decide(cfg, T, 40 * GiB, tile=True)
    assert (whole.host, whole.tile) == (20, 0) and (tiled.host, tiled.tile) == (2, tile)
    # the tiled transient: memplan.TILED_N_EMBD (measured) (T, C) tensors and one tile's four (tile, I) tensors; the
    # peak the larger of the loss's moment and a Block's backward (with the hidden states' gradient), plus the input
    # back from the host
    assert memplan.TILED_N_EMBD == 7
    transient = 7 * 4096 * 2 * T + 4 * tile * 14336 * 2
    loss = 3 * inp + memplan.LOSS_CHUNK
    assert transient + inp > loss
    assert tiled.need == transient + inp + inp + (32 - 2) * inp <= 40 * GiB
    assert tiled.need + inp > 40 * GiB  # (the fewest on the host)
    bounded = memplan.decide(cfg, T, 40 * GiB, host=9 * GiB, tile=True)
    assert bounded.host_room == 9 * GiB and bounded == replace(tiled, host_room=9 * GiB)
    with pytest.raises(memplan.MemoryPlanError) as err:
        memplan.decide(cfg, T, 40 * GiB, host=9 * GiB)
    e = err.value
    assert e.host_need == 10 * GiB > e.host_free == 9 * GiB and e.gpu_need <= e.gpu_free == 40 * GiB
    assert "10.0 GiB of pinned host memory (the host can pin 9.0 GiB)" in str(e)
    assert "40.0 GiB free for them" in str(e)
    roomy = memplan.decide(cfg, T, 56 * GiB, tile=True)
    assert (roomy.recompute, roomy.host, roomy.tile) == (32, 0, tile) and not roomy.offload


def test_tiles_only_where_they_fit_sooner():
    """Tiling adds one MLP forward per recomputed Block: where the whole MLP fits with as few added FLOPs the plan
    leaves it whole, and a micro-batch that fits one tile is never tiled."""
    cfg = _config("Llama-3.1-8B")
    for T, free in ((2048, 44 * GiB), (16384, 44 * GiB), (32768, 44 * GiB), (65536, 56 * GiB)):
        assert memplan.decide(cfg, T, free, mlp=True, tile=True) == memplan.decide(cfg, T, free, mlp=True), T
    one_tile = memplan.decide(cfg, 9344, 4 * GiB, tile=True)
    assert one_tile.recompute == 32 and one_tile.tile == 0  # (one tile: nothing to tile)
    assert memplan.tiled_mlp_flops(cfg) == 6 * 4096 * 14336


def test_tile_size_from_its_byte_budget(monkeypatch):
    """The tile: the most multiples of 64 tokens whose (tile, I) tensor fits 256 MiB; 0 where one tile holds the
    micro-batch; at least 64 tokens however wide the MLP."""
    cfg = _config("Llama-3.1-8B")  # intermediate_size 14336: 256 MiB / 28 KiB per token = 9362.3 tokens
    tile = memplan.tile_tokens(cfg, 262144)
    assert tile == 9344 and tile % 64 == 0
    assert tile * 14336 * 2 <= memplan.TILE_BYTES < (tile + 64) * 14336 * 2
    assert memplan.tile_tokens(cfg, 9344) == 0 and memplan.tile_tokens(cfg, 9345) == 9344
    assert memplan.tile_tokens(cfg, 262144, elt=4) == 4672  # (fp32 activations: half the tokens)
    monkeypatch.setattr(memplan, "TILE_BYTES", 1024)
    assert memplan.tile_tokens(cfg, 262144) == 64


def test_no_plan_fits_names_the_longest_micro_batch_that_does():
    """Where neither memory suffices, :class:`MemoryPlanError` (a ValueError) names what each memory lacks and the
    longest micro-batch that fits: that length fits, one token more does not, nor 5% more. Bound by the GPU (8B at
    512k, 36 GiB, no host limit: 37 GiB needed with every input on the host) and by the host (128k, 40 GiB, 7 GiB
    pinnable, whole MLPs: 20 inputs off the GPU, 10 of them on the host in pairs)."""
    cfg = _config("Llama-3.1-8B")
    cases = [(4 * 131072, 36 * GiB, None, True), (131072, 40 * GiB, 7 * GiB, False)]
    for tokens, free, host, tile in cases:
        with pytest.raises(ValueError) as err:
            memplan.decide(cfg, tokens, free, host=host, tile=tile)
        e = err.value
        assert isinstance(e, memplan.MemoryPlanError) and e.tokens == tokens
        assert e.gpu_need > e.gpu_free if host is None else e.host_need > e.host_free
        assert 0 < e.longest < tokens and f"The longest micro-batch that fits: {e.longest:,} tokens" in str(e)
        assert f"{e.gpu_need / GiB:.1f} GiB of the GPU for activations ({free / GiB:.1f} GiB free for them)" in str(e)
        fits = memplan.decide(cfg, e.longest, free, host=host, tile=tile)
        assert fits.need <= free and (host is None or fits.host_need <= host)
        for longer in (e.longest + 1, int(e.longest * 1.05)):
            with pytest.raises(memplan.MemoryPlanError):
                memplan.decide(cfg, longer, free, host=host, tile=tile)
    with pytest.raises(memplan.MemoryPlanError, match="No micro-batch fits") as err:
        memplan.decide(cfg, 1024, memplan.LOSS_CHUNK / 2)
    assert err.value.longest == 0


def _plan_gpt(monkeypatch, free_share: float, host: float | None = 100 * GiB):
    """8B's config on a fake model and device whose room (:func:`memplan.room_now`) leaves ``free_share`` bytes within
    ``MEMORY_FRACTION`` of an 80 GiB card beside 15 GiB allocated, 1 GiB of gradients and 2 GiB of optimizer state
    to come, and a host with ``host`` bytes available."""
    total = 80 * GiB
    used = 18 * GiB
    fraction = (free_share + used) / total
    monkeypatch.setattr(memplan, "MEMORY_FRACTION", fraction)
    monkeypatch.setattr(memplan, "room_now", lambda g, device, fr=None: memplan.Room(
        total, fraction if fr is None else fr, 15 * GiB, GiB, 2 * GiB))
    monkeypatch.setattr(memplan, "host_available", lambda: host)
    gpt = types.SimpleNamespace(config=_config("Llama-3.1-8B"), parameters=lambda: iter([]))
    return gpt, types.SimpleNamespace(type="cuda")


def test_plan_line_says_where_the_inputs_went_and_what_took_the_gpu(monkeypatch):
    """The line of a planned micro-batch: where the Block inputs went (GPU / host, with the host's room), the tile,
    the estimate and what took the GPU's memory (allocated now, gradients and optimizer state to come) with the
    expected peak; "does not fit" only where the plan truly does not."""
    gpt, cuda = _plan_gpt(monkeypatch, 37 * GiB)
    plan = memplan.plan_for(gpt, 131072, cuda, tile=True)
    assert (plan.recompute, plan.host, plan.tile) == (32, 5, 9344)
    assert plan.host_room == memplan.HOST_FRACTION * 100 * GiB
    line = plan.line(131072, 32)
    for part in ("lit-liger: memory plan at 131,072 tokens per micro-batch: 32 of 32 Blocks recomputed in backward, "
                 "their MLP in tiles of 9,344 tokens, 5 of their inputs kept in pinned host memory "
                 "(5.0 GiB of the 60.0 GiB the host can pin), the other 27 on the GPU",
                 f"estimated {plan.need / GiB:.1f} GiB of activations for 37.0 GiB free",
                 "of the GPU's 80.0 GiB less 15.0 GiB allocated now, 1.0 GiB of gradients and 2.0 GiB of optimizer "
                 "state to come", f"a GPU peak of about {(18 * GiB + plan.need) / GiB:.1f} GiB"):
        assert part in line, (part, line)
    assert "does not fit" not in line and "little margin" not in line
    assert "does not fit" in memplan.MemPlan(0, False, 2.0, 1.0).line(1024, 32)
    assert "does not fit" in memplan.MemPlan(32, False, 1.0, 1.0, host=2, host_need=2.0, host_room=1.0).line(1, 32)


def test_plan_for_takes_the_device_s_limit_before_it_raises(monkeypatch):
    """Where no plan fits the share of the device the plan aims for, ``plan_for`` plans within ``LIMIT_FRACTION`` of
    it (the line says there is little margin, not that it does not fit); past that it raises before any work."""
    gpt, cuda = _plan_gpt(monkeypatch, 37 * GiB, host=2 * GiB)  # (HOST_FRACTION of it pinnable: 1.2 GiB)
    pinnable = memplan.HOST_FRACTION * 2 * GiB
    with pytest.raises(memplan.MemoryPlanError):  # (tiled: 5 inputs off the GPU at 37 GiB, 3 even in pairs)
        memplan.decide(gpt.config, 131072, 37 * GiB, host=pinnable, tile=True)
    plan = memplan.plan_for(gpt, 131072, cuda, tile=True)
    limit = memplan.LIMIT_FRACTION * 80 * GiB - 18 * GiB
    assert plan.available == limit and 37 * GiB < plan.need <= limit and plan.host_need <= pinnable
    line = plan.line(131072, 32)
    assert "little margin" in line and "does not fit" not in line
    with pytest.raises(memplan.MemoryPlanError) as err:
        memplan.plan_for(gpt, 4 * 131072, cuda, tile=True)
    assert err.value.gpu_free == limit


def test_host_room_read_once_per_model(monkeypatch, tmp_path):
    """The host's room: 80% of /proc/meminfo's MemAvailable, capped by a container's limit less its use (its inactive
    file pages counted free), split between the processes of the host, read at a model's first plan and kept on it;
    ``os.sysconf``'s free pages where there is no meminfo, None where nothing can be read."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       4000000 kB\nMemFree:         100000 kB\nMemAvailable:   2000000 kB\n")
    monkeypatch.setattr(memplan, "MEMINFO", str(meminfo))
    monkeypatch.setattr(memplan, "CGROUP_FILES", ())
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert memplan.host_available() == 2000000 * 1024
    gpt = torch.nn.Linear(1, 1)
    assert memplan.host_room(gpt) == memplan.HOST_FRACTION * 2000000 * 1024
    meminfo.write_text("MemAvailable:   1000 kB\n")  # (the first step's pinned buffers: not this run's loss)
    assert memplan.host_room(gpt) == memplan.HOST_FRACTION * 2000000 * 1024
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert memplan.host_room(torch.nn.Linear(1, 1)) == memplan.HOST_FRACTION * 1000 * 1024 / 2
    limit, usage, stat = (tmp_path / n for n in ("memory.max", "memory.current", "memory.stat"))
    limit.write_text("3000000\n"), usage.write_text("2500000\n"), stat.write_text("anon 5\ninactive_file 100000\n")
    meminfo.write_text("MemAvailable:   2000 kB\n")
    monkeypatch.setattr(memplan, "CGROUP_FILES", ((str(limit), str(usage), str(stat)),))
    assert memplan.host_available() == 600000  # (the container's: 3,000,000 - 2,500,000 + 100,000 bytes)
    limit.write_text("max\n")
    assert memplan.host_available() == 2000 * 1024
    monkeypatch.setattr(memplan, "MEMINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(memplan.os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 10, "SC_PAGE_SIZE": 4096}[name])
    assert memplan.host_available() == 40960

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(memplan.os, "sysconf", no_sysconf)
    assert memplan.host_available() is None and memplan.host_room(torch.nn.Linear(1, 1)) is None


def test_optimizer_state_ahead_leaves_out_frozen_parameters():
    """litgpt's LoRA recipes give the optimizer every parameter, the frozen base included; PyTorch's optimizers make
    no state for a parameter without a gradient, so only the trainable ones count (issue 68: Llama-3.1-8B's frozen
    bf16 weights counted as 30 GiB of Adam state to come, the plan's "14.2 GiB free" on an 80 GB card)."""
    base = torch.nn.Parameter(torch.zeros(1000, dtype=torch.bfloat16), requires_grad=False)
    lora = torch.nn.Parameter(torch.zeros(10))
    ahead = memplan.optimizer_state_ahead(torch.optim.AdamW([base, lora], lr=0.1))
    assert ahead() == 2 * 10 * 4
    base.requires_grad_(True)  # (asked at each call: a parameter that starts to train)
    assert ahead() == 2 * (10 * 4 + 1000 * 2)


def test_offloaded_input_in_pieces(monkeypatch):
    """An offloaded input's host copy is made of pieces of ``OFFLOAD_PIECE`` times powers of two (its size's binary
    digits in those units, rounded up), not one buffer that the pinned-memory cache rounds up to a power of two;
    :func:`memplan.host_bytes` is their sum, and the copy comes back whole."""
    monkeypatch.setattr(memplan, "OFFLOAD_PIECE", 64)
    assert memplan._piece_bytes(64 * 11) == [512, 128, 64] and memplan._piece_bytes(1) == [64]
    assert memplan._piece_bytes(64 * 11 + 1) == [512, 256]  # (12 units)
    assert memplan.host_bytes(64 * 11 + 1) == 768 == sum(memplan._piece_bytes(64 * 11 + 1))
    t = torch.randn(3, 5, 47)  # (705 float32 values: 2,820 bytes, 45 units of 64)
    pieces = memplan._into_pieces(t.reshape(-1), pin=False)
    assert [p.numel() * 4 for p in pieces] == [2048, 512, 256, 64] == memplan._piece_bytes(2820)
    back = memplan._out_of_pieces(pieces, torch.empty(705))
    assert torch.equal(back.view(3, 5, 47), t)


def _three_layer_lora_pair():
    return _lora_pair(0.0, n_layer=3)


@pytest.mark.parametrize(("recompute", "host", "tile"), [(2, 1, 8), (3, 2, 0), (2, 0, 8)])
def test_blocks_take_the_planned_paths(recompute, host, tile, monkeypatch):
    """3 LoRA layers: the lowest ``host`` Blocks run the offloaded (reentrant) checkpoint, the other recomputed ones
    the non-reentrant checkpoint, the rest run plainly; every checkpointed Block gets the plan's tile, in its forward
    and its recompute, and its MLP runs over tiles of it; the loss and gradients are those of keeping everything."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    packed, real_init = [], memplan._OnHost.__init__
    monkeypatch.setattr(memplan._OnHost, "__init__", lambda self, h, e, d, *a: packed.append(tuple(h.shape))
                        or real_init(self, h, e, d, *a))
    cfg, plain, auto = _three_layer_lora_pair()
    apply_liger(plain, LigerConfig(activation_checkpointing=False))
    apply_liger(auto)
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    paths, tiles, mlp_tiles = [], [], []
    real_ckpt, real_block, real_tiled = swap_gpt._checkpoint, swap_gpt._checkpointed_block, swap_block.tiled_mlp
    monkeypatch.setattr(swap_gpt, "_checkpoint", lambda *a, **kw: paths.append(kw["use_reentrant"]) or
                        real_ckpt(*a, **kw))
    monkeypatch.setattr(swap_gpt, "_checkpointed_block", lambda block, x, c, s, pack=None, tile=0, kept=None: tiles.append(
        (list(auto.transformer.h).index(block), tile)) or real_block(block, x, c, s, pack, tile, kept))
    monkeypatch.setattr(swap_block, "tiled_mlp", lambda mlp, xn, t, **kw: mlp_tiles.append(t)
                        or real_tiled(mlp, xn, t, **kw))
    _force(monkeypatch, recompute, False, host=host, tile=tile)
    assert swap_gpt._memory_plan_here(auto, x) == (recompute, host > 0, 0, host, tile, 0, 0, 0)
    loss_b, grads_b = _step(auto, x, y)
    assert paths == [True] * host + [False] * (recompute - host)
    assert packed == [(2, 12, cfg.n_embd)] * host
    # each checkpointed Block's function: its forward, then its recompute in backward (top Block first)
    assert sorted(tiles) == sorted([(i, tile) for i in range(recompute)] * 2), tiles
    # the MLPs: the Blocks kept whole, and the offloaded Blocks' forwards (without grad: swap.block tiles a call with
    # grad) untiled; the other recomputed Blocks' forwards and every recompute over the plan's tiles
    assert len(mlp_tiles) == 2 * recompute + 3 - recompute
    assert mlp_tiles.count(tile) >= 2 * (recompute - host) + host and set(mlp_tiles) <= {0, tile}, mlp_tiles
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, (n, rel_err(grads_b[n], grads_a[n]))


@pytest.mark.parametrize(("n_layer", "pairs", "full"), [(3, 1, False), (4, 2, True)])
def test_offloaded_pairs_keep_one_input_each(n_layer, pairs, full, monkeypatch):
    """``MemPlan.pairs``: every Block offloaded, the lowest ``2 * pairs`` in pairs. LoRA with dropout (a frozen
    embedding: the pair's anchor) and full fine-tuning (the embedding's output needs grad): one input copied to the
    host per pair and per single Block; each pair's first Block runs three times (forward, the rerun that makes the
    second's input, its own recompute), its second twice; loss and gradients equal to keeping everything (the reruns
    draw the forward's dropout masks)."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    packed, real_init = [], memplan._OnHost.__init__
    monkeypatch.setattr(memplan._OnHost, "__init__", lambda self, h, e, d, *a: packed.append(tuple(h.shape))
                        or real_init(self, h, e, d, *a))
    cfg, plain, auto = _lora_pair(0.2, n_layer=n_layer)
    if full:
        for p in list(plain.parameters()) + list(auto.parameters()):
            p.requires_grad_(True)
    apply_liger(plain, LigerConfig(activation_checkpointing=False))
    apply_liger(auto)
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    runs = []
    real_block = swap_gpt._checkpointed_block
    monkeypatch.setattr(swap_gpt, "_checkpointed_block", lambda block, *a, **kw: runs.append(
        list(auto.transformer.h).index(block)) or real_block(block, *a, **kw))
    _force(monkeypatch, n_layer, True, host=n_layer, pairs=pairs)
    assert swap_gpt._memory_plan_here(auto, x) == (n_layer, True, 0, n_layer, 0, pairs, 0, 0)
    loss_b, grads_b = _step(auto, x, y)
    assert packed == [(2, 12, cfg.n_embd)] * (n_layer - pairs)
    expected = {i: (3 if i < 2 * pairs and i % 2 == 0 else 2) for i in range(n_layer)}
    assert {i: runs.count(i) for i in range(n_layer)} == expected, runs
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys() and grads_a
    assert ("transformer.wte.weight" in grads_a) == full
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, (n, rel_err(grads_b[n], grads_a[n]))


def test_offloaded_pair_frees_the_gradient_flowing_in_before_its_first_block_runs_again():
    """The pair is two autograd nodes: the gradient flowing into the pair (the second Block's) is freed when the
    second's backward returns, before the first Block's recompute and backward; the pair as one Function held it
    through them (one (T, C) tensor over an offloaded Block's peak, measured in h200-2026-12-02e). Seen through a
    weak reference to that gradient (a tensor's Python object lives as long as the tensor)."""
    torch.manual_seed(0)
    w1, w2 = (torch.randn(8, 8, requires_grad=True) for _ in range(2))
    flowing_in, seen = [], []

    def first(h):
        if torch.is_grad_enabled():  # the first Block's own recompute, in the first node's backward
            seen.append(flowing_in[0]() is None)
        return torch.tanh(h @ w1)

    def second(h):
        return torch.tanh(h @ w2)

    x = torch.randn(4, 8, requires_grad=True)
    out = swap_gpt._offloaded_pair(x, None, first, second)
    out.register_hook(lambda g: flowing_in.append(weakref.ref(g)))
    (out * torch.randn(4, 8)).sum().backward()
    assert seen == [True]
    want_x, want_w1, want_w2 = x.grad.clone(), w1.grad.clone(), w2.grad.clone()
    for t in (x, w1, w2):
        t.grad = None
    torch.manual_seed(0)
    torch.randn(8, 8), torch.randn(8, 8), torch.randn(4, 8)
    (second(first(x)) * torch.randn(4, 8)).sum().backward()  # the same function, plain autograd
    for got, want in ((want_x, x.grad), (want_w1, w1.grad), (want_w2, w2.grad)):
        assert rel_err(got, want) <= 1e-6


def test_host_short_plans_pairs():
    """The host cannot pin the inputs the GPU cannot keep: the fewest pairs that bring them within its room (8B at
    262k, 37 GiB free, 40 GiB pinnable: 23 inputs off the GPU, 3 pairs, 20 inputs on the host), the GPU's estimate
    unchanged by them; the line says so; where even every pair is not enough, the error names the host memory they
    would need; with room enough, no pairs."""
    assert memplan.PAIR_EXTRA_N_EMBD == 0
    cfg = _config("Llama-3.1-8B")
    T = 262144
    unpaired = memplan.decide(cfg, T, 37 * GiB, host=None, tile=True)
    plan = memplan.decide(cfg, T, 37 * GiB, host=40 * GiB, tile=True)
    inp = memplan.host_bytes(T * cfg.n_embd * 2)
    assert (plan.host, plan.pairs, plan.host_need) == (unpaired.host, 3, 20 * inp) == (23, 3, 40 * GiB)
    assert plan.need == unpaired.need and unpaired.pairs == 0
    assert ("20 of their inputs kept in pinned host memory (40.0 GiB of the 40.0 GiB the host can pin; the lowest 6 "
            "Blocks in pairs, one input kept per pair and the other rerun from it: 3 more Block forwards)"
            in plan.line(T, 32))
    with pytest.raises(memplan.MemoryPlanError) as err:  # (23 inputs, 11 pairs: 12 on the host, 24 GiB)
        memplan.decide(cfg, T, 37 * GiB, host=23 * GiB, tile=True)
    assert err.value.host_need == 12 * inp
    assert "12 of their inputs in pinned host memory, the lowest 22 Blocks in pairs" in str(err.value)
    assert memplan.decide(cfg, T, 37 * GiB, host=24 * GiB, tile=True).pairs == 11
    assert memplan.decide(cfg, T, 37 * GiB, host=60 * GiB, tile=True).pairs == 0


def test_pairs_holding_more_take_room_from_the_gpu_s_inputs(monkeypatch):
    """Where a pair's backward holds a (T, C) tensor more than an offloaded Block's (``PAIR_EXTRA_N_EMBD`` 1: the pair
    as one autograd Function, measured), the plan makes room for it: at 262k with 37 GiB free and 40 GiB pinnable,
    the unpaired placement fills the GPU to its last MiB, so 24 inputs go off the GPU, in 4 pairs, 20 on the host; at
    512k with the 90% limit of an 80 GB card every input is already off the GPU and no plan fits."""
    monkeypatch.setattr(memplan, "PAIR_EXTRA_N_EMBD", 1)
    cfg = _config("Llama-3.1-8B")
    T = 262144
    unpaired = memplan.decide(cfg, T, 37 * GiB, host=None, tile=True)
    plan = memplan.decide(cfg, T, 37 * GiB, host=40 * GiB, tile=True)
    inp, one = memplan.host_bytes(T * cfg.n_embd * 2), T * cfg.n_embd * 2
    assert (unpaired.host, unpaired.pairs) == (23, 0) and 37 * GiB - one < unpaired.need <= 37 * GiB
    assert (plan.host, plan.pairs, plan.host_need) == (24, 4, 20 * inp) == (24, 4, 40 * GiB)
    assert plan.need == unpaired.need + one - one  # the pair's extra tensor, less the input moved off the GPU
    assert "the lowest 8 Blocks in pairs" in plan.line(T, 32)
    with pytest.raises(memplan.MemoryPlanError) as err:  # (24 inputs, 12 pairs: 12 on the host, 24 GiB)
        memplan.decide(cfg, T, 37 * GiB, host=23 * GiB, tile=True)
    assert "12 of their inputs in pinned host memory, the lowest 24 Blocks in pairs" in str(err.value)
    with pytest.raises(memplan.MemoryPlanError, match="49.0 GiB of the GPU"):  # (an offloaded pair's moment)
        memplan.decide(cfg, 524288, 45.1 * GiB, host=73.8 * GiB, tile=True)
    monkeypatch.setattr(memplan, "PAIR_EXTRA_N_EMBD", 0)
    assert memplan.decide(cfg, 524288, 45.1 * GiB, host=73.8 * GiB, tile=True).pairs == 12


# ------------------------------------------------------------------------------------------------
# CUDA graphs: what they buy and what they hold (the capture stubbed: CPU)
# ------------------------------------------------------------------------------------------------
def _runner(monkeypatch, max_tokens=None):
    cfg, _, model = _lora_pair(dropout=0.0)
    apply_liger(model, LigerConfig(cuda_graphs=True, cuda_graphs_max_tokens=max_tokens))
    runner = graphs.runner_for(model)
    runner._walk()
    monkeypatch.setattr(runner, "why_not", lambda idx: None)  # (CPU tensors are never captured)
    monkeypatch.setattr(graphs, "_total_memory", lambda device: 100 * GiB)
    before = dict(state_of(model).captures)
    return cfg, model, runner, before


def test_auto_max_tokens_from_a_block_s_parameters():
    with torch.device("meta"):
        from litgpt.model import GPT

        big, small = GPT(_config("Llama-3.1-8B")), GPT(_config("Llama-3.2-1B"))
    per_block = sum(p.numel() for p in big.transformer.h[0].parameters())
    assert graphs.auto_max_tokens(big) == graphs.CAPTURE_MAX_WORK // per_block
    assert graphs.auto_max_tokens(small) > 3 * graphs.auto_max_tokens(big)
    cfg, _, model = _lora_pair(dropout=0.0)
    apply_liger(model)
    assert model._liger_graphs_max_tokens == graphs.auto_max_tokens(model)
    report = str(apply_liger(model, LigerConfig(cuda_graphs_max_tokens=100)))
    assert model._liger_graphs_max_tokens == 100 and "up to 100 tokens per micro-batch" in report
    with pytest.raises(ValueError, match="cuda_graphs_max_tokens"):
        LigerConfig(cuda_graphs_max_tokens=-1)


def test_longer_micro_batches_run_uncaptured(monkeypatch):
    cfg, model, runner, before = _runner(monkeypatch, max_tokens=20)
    monkeypatch.setattr(graphs, "_Graphs", lambda *a, **kw: pytest.fail("captured above the limit"))
    x = torch.randint(0, cfg.vocab_size, (2, 12))  # 24 tokens
    assert runner.hidden(x) is None and state_of(model).captures["long"] == before["long"] + 1
    stats = {k: state_of(model).captures[k] - before[k] for k in before}
    assert "none captured; 1 micro-batches longer than cuda_graphs_max_tokens" in graphs.capture_report(stats)


def test_out_of_memory_in_capture_falls_back_for_that_length(monkeypatch):
    """An out-of-memory error during a shape's warm-up or capture: no crash, one warning, the graphs and pool
    released, that length and longer run uncaptured from then on, shorter ones are still captured."""
    cfg, model, runner, before = _runner(monkeypatch)
    tried = []

    def oom(runner_, idx, params, plan=None, **kw):
        tried.append(idx.numel())
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(graphs, "_Graphs", oom)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    with pytest.warns(UserWarning, match="out of memory capturing 24 tokens.*more than 23 tokens run uncaptured"):
        assert runner.hidden(x) is None
    assert runner.disabled is None and runner.max_tokens == 23 and not runner.graphs and tried == [24]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert runner.hidden(x) is None  # not tried again
    assert tried == [24]
    assert runner.hidden(x[:, :8]) is None and tried == [24, 16]  # a shorter one is tried
    loss, _ = _step(model, x, x)  # and training goes on uncaptured
    assert torch.isfinite(loss)


def test_capture_failure_inside_ddp_says_how_to_construct_it(monkeypatch):
    """A capture that fails inside a DistributedDataParallel forward says to construct DDP on a side stream (DDP made on
    the default stream puts the gradient accumulators there, and the captured backward then fails); elsewhere the
    warning is the failure alone."""
    from lit_liger import _dist

    def fail(runner_, idx, params, plan=None, **kw):
        raise RuntimeError("CUDA error: operation would make the legacy stream depend on a capturing blocking stream")

    x = torch.randint(0, 100, (2, 12))
    for inside_ddp in (False, True):
        cfg, model, runner, _ = _runner(monkeypatch)
        monkeypatch.setattr(graphs, "_Graphs", fail)
        monkeypatch.setattr(graphs, "_repair_generator", lambda device: True)
        monkeypatch.setattr(_dist, "replicated", lambda gpt: inside_ddp)
        with pytest.warns(UserWarning, match="capture failed: RuntimeError") as record:
            assert runner.hidden(x) is None
        said = " ".join(str(w.message) for w in record)
        assert ("construct it on a side stream" in said) is inside_ddp, said


def test_pool_over_budget_releases_the_graphs(monkeypatch):
    cfg, model, runner, before = _runner(monkeypatch)
    monkeypatch.setattr(graphs, "POOL_FRACTION", 0.25)  # 25 GiB of the stubbed 100
    reserved = iter([0, 10 * GiB, 10 * GiB, 30 * GiB])
    monkeypatch.setattr(graphs, "_reserved", lambda device: next(reserved))
    stub = types.SimpleNamespace(grads=[], params=[], static_idx=None)
    monkeypatch.setattr(graphs, "_Graphs", lambda *a, **kw: stub)
    monkeypatch.setattr(graphs._Replay, "apply", staticmethod(lambda *a: "replayed"))
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    assert runner.hidden(x[:, :6]) == "replayed" and runner.pool_bytes == 10 * GiB and len(runner.graphs) == 1
    with pytest.warns(UserWarning, match=r"memory pool reached 30.0 GiB, over its budget of 25.0 GiB; released, "
                                         r"micro-batches of more than 23 tokens run uncaptured"):
        assert runner.hidden(x) is None
    assert not runner.graphs and runner.pool_bytes == 0 and runner.max_tokens == 23
    assert state_of(model).captures["released"] == before["released"] + 1


def test_pool_that_leaves_the_run_short_of_room_releases_the_graphs(monkeypatch):
    """Under its budget, the pool is still released where what it holds leaves the run less than nothing of
    ``graphs.ROOM_FRACTION`` of the device (``graphs._room``: the optimizer's state still to come counted), said with
    that state."""
    cfg, model, runner, before = _runner(monkeypatch)
    reserved = iter([0, 6 * GiB, 6 * GiB, 12 * GiB])
    monkeypatch.setattr(graphs, "_reserved", lambda device: next(reserved))
    stub = types.SimpleNamespace(grads=[], params=[], static_idx=None)
    monkeypatch.setattr(graphs, "_Graphs", lambda *a, **kw: stub)
    monkeypatch.setattr(graphs._Replay, "apply", staticmethod(lambda *a: "replayed"))
    monkeypatch.setattr(graphs, "_room", lambda gpt, device: 10 * GiB)
    state_of(model).state_ahead.append(lambda: 3 * GiB)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    assert runner.hidden(x[:, :6]) == "replayed" and runner.pool_bytes == 6 * GiB  # (10 - 6 >= 0)
    with pytest.warns(UserWarning, match=r"memory pool \(12.0 GiB\) left the run 2.0 GiB short of "
                                         r"graphs.ROOM_FRACTION \(0.9\) of the device, with 3.0 GiB of optimizer "
                                         r"state still to come; released, micro-batches of more than 23 tokens"):
        assert runner.hidden(x) is None
    assert not runner.graphs and runner.max_tokens == 23


def test_optimizer_state_ahead_counts_what_the_first_step_will_make():
    """``memplan.optimizer_state_ahead``: the bytes of the state each parameter's first step makes (Adam: 2 tensors
    of its size and dtype, 3 with amsgrad; SGD with momentum 1, without 0), for the parameters this process steps
    only; 0 once stepped. ``available_bytes`` leaves it free (the model's ``ModelState.state_ahead``)."""
    a, b = torch.nn.Parameter(torch.zeros(10, 4)), torch.nn.Parameter(torch.zeros(6, dtype=torch.bfloat16))
    adam = torch.optim.AdamW([a, b], lr=0.1)
    ahead = memplan.optimizer_state_ahead(adam)
    assert ahead() == 2 * (40 * 4 + 6 * 2)
    assert memplan.optimizer_state_ahead(adam, mine=lambda p: p is b)() == 2 * 6 * 2  # (zero1: this rank's share)
    assert memplan.optimizer_state_ahead(torch.optim.Adam([a], amsgrad=True))() == 3 * 160
    assert memplan.optimizer_state_ahead(torch.optim.SGD([a], lr=0.1))() == 0
    assert memplan.optimizer_state_ahead(torch.optim.SGD([a], lr=0.1, momentum=0.9))() == 160
    a.grad = torch.ones_like(a)
    adam.step()  # (b has no gradient: no state yet)
    assert ahead() == 2 * 6 * 2
    gpt = torch.nn.Module()  # (a model's ModelState: lit_liger.swap.state.state_of)
    state_of(gpt).state_ahead.append(ahead)
    assert memplan.state_ahead(gpt) == 24
    state_of(gpt).state_ahead.remove(ahead)
    assert memplan.state_ahead(gpt) == 0


def test_the_command_counts_the_optimizer_state_ahead_of_litgpts_fit():
    """``lit_liger.cli._state_ahead``: Fabric's optimizer (its wrapper's ``.optimizer``), under zero1 (the strategy's
    ``owners``) this rank's share and the parameters every rank steps; litgpt's ``fit`` wrapped by the command holds
    it in the model's ``ModelState.state_ahead`` while ``fit`` runs, removed after."""
    from lit_liger import cli

    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (8, 4, 2))
    wrapped = types.SimpleNamespace(optimizer=torch.optim.AdamW([a, b, c]))
    fabric = types.SimpleNamespace(global_rank=1, strategy=types.SimpleNamespace(owners={id(a): 0, id(b): 1}))
    ahead = cli._state_ahead(fabric, wrapped)
    assert ahead() == 2 * 4 * (4 + 2)  # (b and c: not a)
    one = cli._state_ahead(types.SimpleNamespace(global_rank=0), wrapped)  # (one process: every parameter)
    assert one() == 2 * 4 * 14 and cli._state_ahead(fabric, None) is None
    _, _, model = _lora_pair(dropout=0.0)
    apply_liger(model)
    seen = []

    def fit(fabric, model, optimizer):  # litgpt's fit, as far as its arguments go
        seen.append((list(state_of(model).state_ahead), memplan.state_ahead(model)))

    cli._fit_freezing_unoptimized(fit)(fabric=None, model=model, optimizer=wrapped)
    assert len(seen) == 1 and len(seen[0][0]) == 1 and seen[0][1] == 2 * 4 * 14  # (one process: every parameter)
    assert state_of(model).state_ahead == []


def test_available_bytes_leaves_the_state_ahead_free(monkeypatch):
    cfg, _, model = _lora_pair(dropout=0.0)
    monkeypatch.setattr(memplan, "_total_memory", lambda device: 100 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 20 * GiB)
    for p in model.parameters():
        p.requires_grad_(False)
    base = memplan.available_bytes(model, torch.device("cuda", 0))
    assert base == pytest.approx(0.75 * 100 * GiB - 20 * GiB)
    monkeypatch.setattr(state_of(model), "state_ahead", [lambda: 5 * GiB, lambda: GiB])
    assert memplan.available_bytes(model, torch.device("cuda", 0)) == pytest.approx(base - 6 * GiB)
    assert memplan.available_bytes(model, torch.device("cuda", 0), 0.9) == pytest.approx(90 * GiB - 26 * GiB)


def test_available_bytes_counts_the_gradients_to_come_once(monkeypatch):
    """The gradients the backward will allocate count against the room, except those the CUDA graphs' capture made
    already (allocated: ``GraphRunner.buffers``, the parameters' ``.grad`` from the first replay) and those that
    exist."""
    cfg, model, runner, _ = _runner(monkeypatch)
    monkeypatch.setattr(memplan, "_total_memory", lambda device: 100 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 20 * GiB)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) >= 2 and all(p.grad is None for p in trainable)
    nbytes = [p.numel() * p.element_size() for p in trainable]
    assert memplan.grads_to_come(model) == sum(nbytes)
    runner.grad_buffers(trainable[:1])  # (a capture's buffer: allocated now)
    assert memplan.grads_to_come(model) == sum(nbytes[1:])
    trainable[-1].grad = torch.zeros_like(trainable[-1])
    assert memplan.grads_to_come(model) == sum(nbytes[1:-1])
    assert memplan.available_bytes(model, torch.device("cuda", 0)) == \
        pytest.approx(0.75 * 100 * GiB - 20 * GiB - sum(nbytes[1:-1]))


def test_pool_budget_leaves_out_the_gradient_buffers(monkeypatch):
    """The gradient buffers a capture makes become the parameters' ``.grad`` (memory the step holds anyway): the
    reserved memory they add is not the graphs' pool."""
    cfg, model, runner, _ = _runner(monkeypatch)
    reserved = iter([0, 10 * GiB, 10 * GiB, 10 * GiB])
    monkeypatch.setattr(graphs, "_reserved", lambda device: next(reserved))
    def make(runner_, idx, params, plan, **kw):  # (the captured backward writes every buffer)
        return types.SimpleNamespace(grads=runner_.grad_buffers(params), params=params, static_idx=idx)

    monkeypatch.setattr(graphs, "_Graphs", make)
    monkeypatch.setattr(graphs._Replay, "apply", staticmethod(lambda *a: "replayed"))
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    assert runner.hidden(x[:, :6]) == "replayed"
    assert grad_bytes > 0 and runner.grad_bytes_made == grad_bytes
    assert runner.pool_bytes == 10 * GiB - grad_bytes
    assert runner.hidden(x[:, :8]) == "replayed"  # (its buffers exist: the next shape's growth counts whole)
    assert runner.grad_bytes_made == grad_bytes and runner.pool_bytes == 10 * GiB - grad_bytes


def _replayed_stubs(monkeypatch) -> None:
    """Captures stubbed (no pool growth; their gradient buffers made), a replay returns "replayed", this is rank 1."""
    monkeypatch.setattr(graphs, "_reserved", lambda device: 0)
    monkeypatch.setattr(graphs, "_Graphs", lambda runner_, idx, params, plan, **kw: types.SimpleNamespace(
        grads=runner_.grad_buffers(params), params=params, static_idx=idx))
    monkeypatch.setattr(graphs._Replay, "apply", staticmethod(lambda *a: "replayed"))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a: 1)


def test_a_capture_after_the_replicas_pre_capture_is_said(monkeypatch, capsys):
    """In a replica whose lengths were captured together at the first step, a later capture stalls the other
    processes at the next all-reduce: the log says which process met which micro-batch."""
    cfg, model, runner, _ = _runner(monkeypatch)
    _replayed_stubs(monkeypatch)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    assert runner.hidden(x) == "replayed"
    assert "pre-capture" not in capsys.readouterr().out  # (no pre-capture ran: nothing to say)
    runner.precaptured, runner.precaptured_n = True, 16
    assert runner.hidden(x[:, :6]) == "replayed"
    assert "process 1 met a micro-batch outside the first step's pre-capture (unpacked (2, 6))" in capsys.readouterr().out
    assert graphs._describe_key(((1, 1280), torch.long, True, 6, (0, 0))) == "4 samples packed into 1,280 tokens"
    assert graphs._describe_key(((1, 640), torch.long, False, 3, (2, 1))) == \
        "1 sample packed into 640 tokens, evaluation, 2 Blocks recomputed, 1 Blocks' MLP inputs recomputed"


def _precapture_setup(monkeypatch, refuse=lambda runner, idx: False):
    """A runner whose model has ``max_seq_length`` 24, ``_capture`` stubbed to record ``(key, unpacked, shape,
    warmup)`` of each capture asked (``refuse(runner, idx)`` True: refused, as a release for memory returns None), and a
    packed micro-batch of 3 samples: ``(runner, calls, params, idx, plan, before, model)`` (the caller keeps the model:
    the runner holds it weakly)."""
    from lit_liger.swap.packing import Pack, Plan

    cfg, model, runner, before = _runner(monkeypatch)
    model.max_seq_length = 24
    calls = []

    def capture(key, idx, params, plan, warmup=True):
        calls.append((key, plan is None, tuple(idx.shape), warmup))
        if refuse(runner, idx):
            return None
        if warmup:  # (a warm-up learns the hidden states' width and dtype)
            runner.hidden_spec = (cfg.n_embd, torch.float32)
        runner.graphs[key] = types.SimpleNamespace(static_idx=idx)
        runner.captures += 1
        return runner.graphs[key]

    monkeypatch.setattr(runner, "_capture", capture)
    monkeypatch.setattr(swap_gpt, "_memory_plan_here", lambda gpt, idx: swap_gpt.NO_PLAN)
    monkeypatch.setattr(graphs, "_driver_version", lambda: 12080)
    monkeypatch.setattr(graphs, "_triton_runtime_knobs", lambda: types.SimpleNamespace(jit_cache_hook=None))
    state_of(model).expected_lengths = None
    idx = torch.ones((1, 40), dtype=torch.long)
    plan = Plan(idx, torch.zeros(40, dtype=torch.long), Pack(torch.tensor([0, 10, 30, 40, 40]), 20, [0, 10, 30, 40, 40]),
                None, 40)
    params = [p for p in model.parameters() if p.requires_grad]
    return runner, calls, params, idx, plan, before, model


def test_replicas_pre_capture_the_packed_ladder(monkeypatch):
    """The replicas' first-step pre-capture: every packed length of the micro-batch's sample count, longest first; a
    batch without padding runs as the ladder's longest packed length (``lit_liger.swap.packing.plan``): nothing
    more to capture (run unpacked, its capture had stalled every 2-GPU recipe run at its iteration 89)."""
    runner, calls, params, idx, plan, _, model = _precapture_setup(monkeypatch)
    S = 3
    runner._precapture(idx, plan, params)
    keys = [c[:3] for c in calls]
    packed = [k for k in keys if not k[1]]
    assert [k[2][1] for k in packed] == sorted(graphs.precapture_lengths(S, 24), reverse=True)
    assert runner.precaptured_n == len(keys)
    # the first (longest) packed length is warmed up, the other packed lengths are recorded without a warm-up (guarded:
    # graphs._compile_guard)
    assert [c[3] for c in calls] == [True] + [False] * (len(packed) - 1)
    assert len(keys) == len(packed)  # (no unpacked batch)
    # within cuda_graphs_max_tokens only: the ladder's longest left out
    ladder = graphs.precapture_lengths(S, 24)
    runner.graphs.clear()
    calls.clear()
    runner.max_tokens = ladder[-2]
    runner._precapture(idx, plan, params)
    assert [c[2][-1] for c in calls] == sorted(ladder[:-1], reverse=True)


def test_replicas_pre_capture_only_the_lengths_the_data_is_expected_to_give(monkeypatch, capsys):
    """With the data's lengths estimated before the run (``ModelState.expected_lengths``, the dealt replicas), the first
    step pre-captures only the ladder's lengths expected at least ``PRECAPTURE_MIN_COUNT`` times per process; the log
    and the report say how many were left out."""
    runner, calls, params, idx, plan, before, model = _precapture_setup(monkeypatch)
    ladder = graphs.precapture_lengths(3, 24)
    assert len(ladder) >= 2
    state_of(model).expected_lengths = {ladder[0]: 9.0, ladder[-1]: 0.49, None: 0.2, 10**6: 50.0}
    runner._precapture(idx, plan, params)
    assert [(c[1], c[2][-1]) for c in calls] == [(False, ladder[0])]  # (0.49 < 0.5 left out)
    left = len(ladder) - 1
    assert state_of(model).captures["left_out"] - before["left_out"] == left
    out = capsys.readouterr().out
    assert f"1 packed lengths of {ladder[0]:,}-{ladder[0]:,} tokens captured at the first step" in out
    assert f"{left} lengths of the ladder left out, expected fewer than 0.5 times per process" in out
    assert f"(expected per process: {ladder[0]:,}: 9.0, {ladder[-1]:,}: 0.5, 1,000,000: 50.0, unpacked: 0.2)" in out
    runner.graphs.clear()
    calls.clear()
    state_of(model).expected_lengths = {None: 0.5}  # (no packed length expected: none captured, all left out)
    runner._precapture(idx, plan, params)
    assert calls == []
    stats = {k: state_of(model).captures[k] - before[k] for k in before}
    stats.update(captures=1, precaptured=1)
    line = graphs.capture_report(stats)
    assert f"{2 * len(ladder) - 1} lengths left out of it (expected fewer than 0.5 times per process)" in line


def test_the_pre_capture_goes_on_below_a_length_released_for_memory(monkeypatch):
    """A pre-captured length that the pool's budget or the run's room refuses (released, longer micro-batches
    uncaptured from then on) does not end the pre-capture: the shorter lengths are captured from scratch; a capture
    failure does."""
    refused = []

    def refuse(runner, idx):  # (the longest, the first asked: refused, as give_up_above would)
        if not refused:
            refused.append(idx.numel())
            runner.max_tokens = idx.numel() - 1
        return len(refused) == 1 and idx.numel() == refused[0]

    runner, calls, params, idx, plan, _, model = _precapture_setup(monkeypatch, refuse)
    runner._precapture(idx, plan, params)
    ladder = graphs.precapture_lengths(3, 24)
    assert [c[2][-1] for c in calls] == sorted(ladder, reverse=True)
    assert runner.captures == len(ladder) - 1
    tried = []

    def fail(*a, **kw):
        tried.append(1)
        runner.disabled = "capture failed: RuntimeError"

    runner.graphs.clear()
    runner.max_tokens = None
    monkeypatch.setattr(runner, "_capture", fail)
    runner._precapture(idx, plan, params)
    assert tried == [1]


def test_a_replica_captures_a_shape_outside_its_pre_capture_at_its_micro_batch_capture_after(monkeypatch, capsys):
    """With ``CAPTURE_AFTER`` 4, a replica's shape outside its first-step pre-capture runs uncaptured until its fourth
    micro-batch, then is captured and replayed; the report counts the uncaptured ones. One process captures at once,
    as with the default 1."""
    cfg, model, runner, before = _runner(monkeypatch)
    _replayed_stubs(monkeypatch)
    x = torch.randint(0, cfg.vocab_size, (2, 12))
    monkeypatch.setattr(graphs, "_several_replicas", lambda gpt: True)
    runner.precaptured, runner.precaptured_n = True, 5
    assert graphs.CAPTURE_AFTER == 1  # (the default: captured at once)
    monkeypatch.setattr(graphs, "CAPTURE_AFTER", 4)
    assert [runner.hidden(x) for _ in range(5)] == [None, None, None, "replayed", "replayed"]
    assert runner.captures == 1 and state_of(model).captures["deferred"] - before["deferred"] == 3
    assert "met a micro-batch outside the first step's pre-capture (unpacked (2, 12))" in capsys.readouterr().out
    assert runner.hidden(x[:, :6]) is None  # (another shape counts on its own)
    stats = {k: state_of(model).captures[k] - before[k] for k in before}
    assert "4 micro-batches of shapes outside it ran uncaptured (a shape is captured at its micro-batch 4)" in \
        graphs.capture_report(stats)
    monkeypatch.setattr(graphs, "CAPTURE_AFTER", 1)
    assert runner.hidden(x[:, :6]) == "replayed"
    monkeypatch.setattr(graphs, "CAPTURE_AFTER", 4)
    monkeypatch.setattr(graphs, "_several_replicas", lambda gpt: False)  # (one process: at once)
    assert runner.hidden(x[:, :4]) == "replayed"


def _warmup_stub(monkeypatch, cfg, made, refuse_without=False):
    """``graphs._Graphs`` stubbed: records (tokens, warmup); a warm-up learns the hidden states' spec; with
    ``refuse_without`` a capture without warm-up stops as a Triton compilation would stop it. The driver can load
    modules inside a capture and Triton has its compile hook, unless a test says otherwise."""
    def make(runner_, idx, params, plan=None, warmup=True):
        made.append((idx.numel(), warmup))
        if not warmup and refuse_without:
            raise graphs._NeedsWarmup("a capture without warm-up would compile the Triton kernel k")
        if warmup:
            runner_.hidden_spec = (cfg.n_embd, torch.float32)
        return types.SimpleNamespace(grads=runner_.grad_buffers(params), params=params, static_idx=idx)

    monkeypatch.setattr(graphs, "_Graphs", make)
    monkeypatch.setattr(graphs, "_reserved", lambda device: 0)
    monkeypatch.setattr(graphs._Replay, "apply", staticmethod(lambda *a: "replayed"))
    monkeypatch.setattr(graphs, "_driver_version", lambda: 12080)
    monkeypatch.setattr(graphs, "_triton_runtime_knobs", lambda: types.SimpleNamespace(jit_cache_hook=None))


def _packed(cfg, n: int):
    """Token ids (1, n) packed from two samples, with their plan."""
    from lit_liger.swap.packing import Pack, Plan

    idx = torch.randint(0, cfg.vocab_size, (1, n))
    bounds = [0, n // 2, n, n]
    return idx, Plan(idx, torch.zeros(n, dtype=torch.long), Pack(torch.tensor(bounds), n // 2, bounds), None, n)


def test_warm_up_only_where_a_capture_would_record_first_call_work(monkeypatch):
    """``GraphRunner._warmup_needed``: a model's first capture warms its shape up; a packed length after it is recorded
    with no warm-up; an unpacked shape is warmed up (cuDNN attention plans each shape); after a reset (a parameter
    moved, the graphs released) the first capture warms up again; a driver older than CUDA 12.3 or a Triton without
    the compile hook: every capture warms up."""
    cfg, model, runner, before = _runner(monkeypatch)
    made = []
    _warmup_stub(monkeypatch, cfg, made)
    x, _ = _data(cfg, T=12)
    assert runner.hidden(x[:, :6]) == "replayed" and made == [(12, True)]  # the model's first capture
    idx, plan = _packed(cfg, 16)
    assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (16, False)  # a packed length
    assert runner.hidden(x) == "replayed" and made[-1] == (24, True)  # a new unpacked shape
    runner.reset()
    assert runner.hidden_spec is None
    assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (16, True)  # the first since the reset
    assert runner.hidden(x) == "replayed" and made[-1] == (24, True)
    idx, plan = _packed(cfg, 14)
    assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (14, False)
    with monkeypatch.context() as m:
        m.setattr(graphs, "_driver_version", lambda: 12020)
        idx, plan = _packed(cfg, 18)
        assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (18, True)
    with monkeypatch.context() as m:
        m.setattr(graphs, "_triton_runtime_knobs", lambda: None)
        idx, plan = _packed(cfg, 20)
        assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (20, True)
    idx, plan = _packed(cfg, 22)  # (both back: no warm-up again)
    assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (22, False)


@pytest.mark.eager_first
def test_the_first_micro_batch_runs_uncaptured_and_the_captures_after_it_need_no_warm_up(monkeypatch):
    """``graphs.EAGER_FIRST``: the first micro-batch since a reset runs uncaptured (the caller's forward) and tells the
    runner the hidden states' width and dtype; the next packed lengths are captured without a warm-up pass, an
    unpacked shape still with one. A caller that does not tell leaves the next capture to warm up; several processes,
    or the switch off: the first micro-batch is captured after a warm-up. The run's report says it."""
    assert graphs.EAGER_FIRST
    cfg, model, runner, before = _runner(monkeypatch)
    made = []
    _warmup_stub(monkeypatch, cfg, made)
    idx, plan = _packed(cfg, 16)
    assert runner.hidden(idx, plan=plan) is None and made == [] and runner.eager_first
    runner.note_hidden(torch.zeros(1, 16, cfg.n_embd, dtype=torch.bfloat16))
    assert runner.hidden_spec == (cfg.n_embd, torch.bfloat16)
    assert runner.hidden(idx, plan=plan) == "replayed" and made == [(16, False)]
    idx2, plan2 = _packed(cfg, 20)
    assert runner.hidden(idx2, plan=plan2) == "replayed" and made[-1] == (20, False)
    runner.note_hidden(torch.zeros(1, 4, 7))  # (a later uncaptured micro-batch changes nothing)
    assert runner.hidden_spec == (cfg.n_embd, torch.bfloat16)
    x, _ = _data(cfg, T=12)
    assert runner.hidden(x) == "replayed" and made[-1] == (24, True)  # (unpacked: cuDNN plans each shape)
    stats = {k: state_of(model).captures[k] - before[k] for k in before}
    assert stats["eager_first"] == 1 and stats["captures"] == 3
    assert "1 first micro-batch(es) ran uncaptured in place of a warm-up pass" in graphs.capture_report(stats)
    runner.reset()  # (graphs released: the next micro-batch runs uncaptured again)
    assert runner.hidden(idx, plan=plan) is None
    assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (16, True)  # (nothing told: a warm-up)
    runner.reset()
    with monkeypatch.context() as m:  # (several processes: warmed up as before, not measured on 2 GPUs)
        m.setattr(graphs._dist, "several_processes", lambda: True)
        assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (16, True)
    runner.reset()
    monkeypatch.setattr(graphs, "EAGER_FIRST", False)
    assert runner.hidden(idx, plan=plan) == "replayed" and made[-1] == (16, True)


@pytest.mark.eager_first
def test_an_uncaptured_micro_batch_grad_becomes_the_graphs_buffer_where_the_replay_adds_into_grad(monkeypatch):
    """``GraphRunner.grad_buffers``: a trainable parameter's plain ``.grad`` (an uncaptured micro-batch's) is its
    buffer where the replay adds into ``.grad`` (one copy of the gradients); a view, a hooked parameter or a replay that
    hands its gradients to autograd get a new buffer. A replay that hands them to autograd moves the gradients out of a
    buffer that is ``.grad`` before it zeroes the buffer."""
    cfg, model, runner, before = _runner(monkeypatch)
    params = [p for p in model.parameters() if p.requires_grad][:3]
    a, b, c = params
    a.grad = torch.randn_like(a)
    b.grad = torch.zeros(2 * b.numel())[: b.numel()].view(b.shape)  # (a view: not adopted)
    bufs = runner.grad_buffers(params)
    assert bufs[0] is a.grad and bufs[1] is not b.grad and bufs[2] is not None and c.grad is None
    assert runner.grad_bytes_made == (b.numel() + c.numel()) * b.element_size()
    runner.reset()
    monkeypatch.setattr(graphs, "whole_model", lambda gpt: False)  # (a DDP replica: autograd accumulates)
    assert runner.grad_buffers(params)[0] is not a.grad
    # the replay's backward where it hands the gradients to autograd, with a buffer that is .grad
    runner.reset()
    monkeypatch.setattr(graphs, "whole_model", lambda gpt: True)
    held = a.grad.clone()
    bufs = runner.grad_buffers(params)
    assert bufs[0] is a.grad
    monkeypatch.setattr(graphs, "whole_model", lambda gpt: False)
    fake = types.SimpleNamespace(runner=runner, params=params, grads=bufs, direct=True, bwds=[], notify=[],
                                 static_grad=torch.zeros(2))
    ctx = types.SimpleNamespace(graphs=fake, generation=runner.generation)
    out = graphs._Replay.backward(ctx, torch.ones(2))
    assert a.grad is not bufs[0] and torch.equal(a.grad, held)  # (kept: autograd adds the buffer into it)
    assert torch.equal(bufs[0], torch.zeros_like(bufs[0])) and out[3] is bufs[0]


def test_a_capture_without_warm_up_that_would_compile_starts_again_with_one(monkeypatch):
    """A capture without warm-up stopped by ``graphs._compile_guard`` (a Triton kernel not compiled yet) is made again
    with a warm-up: no warning, graphs stay on, the stopped capture is kept until the next reset; the run's report
    counts it."""
    cfg, model, runner, before = _runner(monkeypatch)
    made = []
    _warmup_stub(monkeypatch, cfg, made, refuse_without=True)
    x, _ = _data(cfg, T=12)
    assert runner.hidden(x[:, :6]) == "replayed"
    idx, plan = _packed(cfg, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runner.hidden(idx, plan=plan) == "replayed"
    assert made == [(12, True), (16, False), (16, True)] and runner.disabled is None and len(runner.aborted) == 1
    assert state_of(model).captures["rewarmed"] == before["rewarmed"] + 1
    runner.reset()
    assert not runner.aborted
    stats = {k: state_of(model).captures[k] - before[k] for k in before}
    assert "1 captures restarted with a warm-up (a Triton compilation)" in graphs.capture_report(stats, 10.0)


def test_capture_report_names_the_process_s_first_warm_up():
    """The report's share of the run with and without the process's first warm-up pass (whose first calls, Triton's
    compilations included, an uncaptured run makes too), its time said; the recipe benchmark reads both back."""
    from benchmarks.recipe import padding_from_log

    stats = {k: 0 for k in CAPTURE_COUNTERS}
    stats.update(captures=10, replays=2400, release=0.05, warmup=1.19, forward=0.42, backward=0.43, first_replay=0.01,
                 warmed=1, first_warmup=1.19)
    line = graphs.capture_report(stats, 39.2)
    assert line.startswith("lit-liger: CUDA graphs: 10 input shapes captured in 2.10 s, 5.4% of the run's 39.2 s; "
                           "2.3% besides the process's first warm-up pass (1.19 s), which also made every kernel's "
                           "first call"), line
    assert "(per phase: release 0.05 s, warmup 1.19 s, forward 0.42 s, backward 0.43 s, first_replay 0.01 s)" in line
    parsed = padding_from_log(line)
    assert parsed["graph_capture_s"] == 2.10 and abs(parsed["graph_capture_share"] - 0.054) < 1e-12
    assert parsed["graph_first_warmup_s"] == 1.19 and parsed["graph_capture_phases_s"]["warmup"] == 1.19
    assert "of which the process's first warm-up pass (1.19 s)" in graphs.capture_report(stats)
    stats["first_warmup"] = 0.0  # (a later fit in the same process: its warm-ups are its own cost)
    assert "first warm-up" not in graphs.capture_report(stats, 39.2)


def test_capture_report_says_the_gpu_s_wait_for_the_captures():
    """Captures recorded beside queued work: the report gives the seconds the GPU waited for the captures (measured with
    events) beside their host seconds, with and without the first warm-up; the recipe benchmark reads it back."""
    from benchmarks.recipe import padding_from_log

    stats = {k: 0 for k in CAPTURE_COUNTERS}
    stats.update(captures=9, replays=800, warmup=1.20, forward=0.30, backward=0.40, warmed=1, first_warmup=1.10,
                 gpu_wait=1.50)
    line = graphs.capture_report(stats, 10.0)
    assert "; the GPU waited 1.50 s for them, 15.0% of the run, 4.0% besides the first warm-up" in line, line
    assert padding_from_log(line)["graph_gpu_wait_s"] == 1.50
    stats["gpu_wait"] = 0.0  # (a CPU run, or torch.cuda.graph's synchronized captures measured by nothing)
    assert "GPU waited" not in graphs.capture_report(stats, 10.0)


def test_a_capture_empties_the_cache_first_only_where_the_pool_may_need_it(monkeypatch):
    """graphs._release_first: the synchronize + empty_cache before a capture runs at the pool's first capture, when the
    device's free memory (within the card the memory plans see, less what the allocator reserved) is below
    RELEASE_BELOW_FREE of that card; never on CPU nor with EMPTY_CACHE_BEFORE_CAPTURE off."""
    runner = types.SimpleNamespace(graphs={})
    cuda = torch.device("cuda", 0)
    free = [100]
    reserved = [0]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[0], 400))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved[0])
    monkeypatch.setattr(graphs, "_total_memory", lambda device: 400)
    assert graphs._release_first(runner, cuda)  # (the first capture: the validation pass's cache goes)
    runner.graphs = {("shape",): object()}
    assert not graphs._release_first(runner, cuda)  # 100 of 400 free: 25%, not below
    free[0] = 99
    assert graphs._release_first(runner, cuda)
    free[0] = 300
    assert not graphs._release_first(runner, cuda)
    monkeypatch.setattr(graphs, "_total_memory", lambda device: 200)  # a card capped below the device (150 free)
    reserved[0] = 160  # (40 of its 200 left to the pool: below 25%)
    assert graphs._release_first(runner, cuda)
    monkeypatch.setattr(graphs, "EMPTY_CACHE_BEFORE_CAPTURE", False)
    assert not graphs._release_first(runner, cuda)
    monkeypatch.setattr(graphs, "EMPTY_CACHE_BEFORE_CAPTURE", True)
    assert not graphs._release_first(runner, torch.device("cpu"))


def test_compile_guard_refuses_a_triton_compilation_and_puts_the_hook_back(monkeypatch):
    """``graphs._compile_guard`` sets Triton's ``knobs.runtime.jit_cache_hook`` (called before Triton compiles a kernel
    its cache lacks) to raise ``_NeedsWarmup`` naming the kernel, and puts the earlier hook back, after an error too."""
    rt = types.SimpleNamespace(jit_cache_hook=None)
    monkeypatch.setattr(graphs, "_triton_runtime_knobs", lambda: rt)
    earlier = lambda **kw: False  # noqa: E731
    rt.jit_cache_hook = earlier
    with graphs._compile_guard():
        assert rt.jit_cache_hook is not earlier
        with pytest.raises(graphs._NeedsWarmup, match=r"compile the Triton kernel add\[num_warps=4\]"):
            rt.jit_cache_hook(key="k", repr="add[num_warps=4]", fn=None, compile=None, is_manual_warmup=False,
                              already_compiled=False)
    assert rt.jit_cache_hook is earlier
    with pytest.raises(RuntimeError, match="inside"), graphs._compile_guard():
        raise RuntimeError("inside")
    assert rt.jit_cache_hook is earlier
    monkeypatch.undo()
    real = graphs._triton_runtime_knobs()  # the installed Triton's (3.4 on), where it has one
    if real is not None:
        kept = real.jit_cache_hook
        with graphs._compile_guard():
            with pytest.raises(graphs._NeedsWarmup):
                real.jit_cache_hook(repr="k")
        assert real.jit_cache_hook is kept


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
def _add_one_kernel():
    """A Triton kernel this process has not compiled (a new ``JITFunction`` on every call; ``tl`` is this module's)."""
    import triton

    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    return triton.jit(add_one)


def test_release_pinned_hands_the_cache_back_once_training_ends(monkeypatch):
    """``release_pinned`` empties PyTorch's pinned-memory cache after a synchronize and says how much went; nothing
    where nothing is held, where CUDA never started, or where this PyTorch has no way to empty it."""
    held, calls = [8 * GiB], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"allocated_bytes.current": held[0]})

    def empty():
        calls.append("empty")
        held[0] = 1 * GiB  # (a block still in use stays)

    monkeypatch.setattr(torch.accelerator, "empty_host_cache", empty, raising=False)
    line = memplan.release_pinned()
    assert calls == ["sync", "empty"]
    assert line == ("lit-liger: training ended: 7.00 GiB of pinned host memory (offloaded activations' copies) handed "
                    "back to the system")
    held[0] = 1 * GiB + 4 * 2**20  # (less than a GiB handed back: said in MiB)
    assert memplan.release_pinned().startswith("lit-liger: training ended: 4 MiB of pinned host memory")
    calls.clear()
    held[0] = 0
    assert memplan.release_pinned() is None and calls == []  # (nothing held: nothing to do)
    held[0] = 2 * GiB
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert memplan.release_pinned() is None and calls == []


@pytest.mark.gpu
def test_gpu_release_pinned_after_offloaded_copies():
    """An offloaded tensor's pinned pieces, freed, stay in PyTorch's cache until ``release_pinned`` hands them back."""
    x = torch.randn(64 * 2**20, device="cuda")  # (256 MiB; CUDA started before the allocator's statistics are read)
    if memplan._pinned_held() is None:
        pytest.skip("this PyTorch does not report its pinned-memory allocator")
    memplan.release_pinned()
    base = memplan._pinned_held()
    saved = memplan.to_host(x)
    back = memplan.from_host(saved)
    assert torch.equal(back, x)
    del saved, back, x
    assert memplan._pinned_held() >= base + 256 * 2**20  # (cached)
    line = memplan.release_pinned()
    assert line is not None and "handed back" in line, line
    assert memplan._pinned_held() <= base


@pytest.mark.gpu
def test_gpu_compile_guard_stops_a_capture_before_a_triton_compilation():
    """A capture without warm-up that meets a Triton kernel not compiled yet: ``graphs._compile_guard`` stops it before
    the compilation (whose module load CUDA refuses while a stream captures); the capture ends cleanly, the kernel then
    compiles outside it, and a guarded capture of the compiled kernel replays what it should."""
    if graphs._triton_runtime_knobs() is None:
        pytest.skip("this Triton has no knobs.runtime.jit_cache_hook")
    kernel = _add_one_kernel()
    x = torch.zeros(1000, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with pytest.raises(graphs._NeedsWarmup, match="add_one"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream), graphs._compile_guard():
            kernel[(8,)](x, 1000, BLOCK=128)
    kernel[(8,)](x, 1000, BLOCK=128)  # compiled and loaded outside a capture: x = 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream), graphs._compile_guard():
        kernel[(8,)](x, 1000, BLOCK=128)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 3.0))


@pytest.mark.gpu
def test_gpu_planned_recompute_and_offload_same_as_keeping(monkeypatch):
    """Real widths (Llama-3.2-1B, 6 layers, LoRA on q and v with dropout, bf16, 2 x 2048 tokens): a device made to
    look small (``MEMORY_FRACTION``) gets a plan that recomputes MLP inputs only, one that also recomputes some
    Blocks, then one that offloads; losses and LoRA gradients equal keeping everything, and the step's peak is
    lower."""
    from test_buckets import _gpu_models

    cfg, _, plain = _gpu_models(True, dropout=0.05, block_size=2048, n_layer=6)
    auto = copy.deepcopy(plain)
    apply_liger(plain, LigerConfig(cuda_graphs=False, activation_checkpointing=False))
    apply_liger(auto, LigerConfig(cuda_graphs=False))
    x = torch.randint(0, cfg.vocab_size, (2, 2048), device="cuda")
    # the rooms that give each kind of plan (the forward sees a little more allocated than the room measured here)
    n, rooms = cfg.n_layer, {}
    for room in range(1, 64 * 1024):
        try:
            plan = memplan.decide(cfg, x.numel(), room * 2**20, mlp=True)
        except memplan.MemoryPlanError:
            continue  # (too small a room for any plan)
        kind = ("mlp" if not plan.recompute and plan.mlp >= 2 else
                "partial" if 0 < plan.recompute < n - 1 and not plan.offload else
                "offload" if plan.offload and plan.need <= room * 2**20 else "")
        rooms.setdefault(kind, []).append(room * 2**20)
    assert {"mlp", "partial", "offload"} <= rooms.keys(), rooms.keys()
    rooms = {kind: sizes[len(sizes) // 2] for kind, sizes in rooms.items()}  # (the middle room of each kind)
    total = memplan._total_memory(x.device)
    results, peaks = [], []
    for model, room in ((plain, None), (auto, rooms["mlp"]), (auto, rooms["partial"]), (auto, rooms["offload"])):
        fraction = memplan.MEMORY_FRACTION if room is None else (torch.cuda.memory_allocated() + room) / total
        monkeypatch.setattr(memplan, "MEMORY_FRACTION", fraction)
        auto.__dict__.pop("_liger_mem_memo", None)
        _step(model, x, x)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        results.append((*_step(model, x, x), getattr(model, "_liger_mem_now", None)))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    (loss_a, grads_a, _), *rest = results
    plan_m, plan_b, plan_c = (r[2] for r in rest)
    assert plan_m[2] > 0 and plan_m[0] < n - 1 and not plan_m[1], plan_m
    assert 0 < plan_b[0] < n and not plan_b[1] and plan_c[:3] == (n, True, 0) and 0 < plan_c[3] <= n, \
        (plan_b, plan_c)
    for loss, grads, _ in rest:
        assert rel_err(loss, loss_a) <= 1e-3 and grads.keys() == grads_a.keys() and grads_a
        for name in grads_a:  # flash attention's backward accumulates dq with atomics: not bit for bit on a GPU
            assert rel_err(grads[name], grads_a[name]) <= 2e-2, (name, rel_err(grads[name], grads_a[name]))
    assert peaks[3] < peaks[2] < peaks[0] and peaks[1] < peaks[0], peaks


@pytest.mark.gpu
def test_gpu_offloaded_pairs_same_as_keeping_and_no_higher_peak(monkeypatch):
    """Real widths (Llama-3.2-1B, 6 layers, LoRA with dropout on CUDA's generator, bf16, 2 x 2048 tokens): every
    Block's input on the host, then the same with 3 pairs: half the inputs copied out, losses and LoRA gradients equal
    to keeping everything, and the paired step's peak no higher than the unpaired one's (within 2%: a pair's backward
    holds what one offloaded Block's holds, ``memplan.PAIR_EXTRA_N_EMBD`` 0; the pair as one autograd Function was
    16.7 MB over, one (T, C) tensor, benchmarks/results/h200-2026-12-02e)."""
    from test_buckets import _gpu_models

    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    packed, real_init = [], memplan._OnHost.__init__
    monkeypatch.setattr(memplan._OnHost, "__init__", lambda self, h, e, d, *a: packed.append(d)
                        or real_init(self, h, e, d, *a))
    cfg, _, plain = _gpu_models(True, dropout=0.05, block_size=2048, n_layer=6)
    auto = copy.deepcopy(plain)
    apply_liger(plain, LigerConfig(cuda_graphs=False, activation_checkpointing=False))
    apply_liger(auto, LigerConfig(cuda_graphs=False))
    x = torch.randint(0, cfg.vocab_size, (2, 2048), device="cuda")
    results, peaks, copies = [], [], []
    for model, pairs in ((plain, None), (auto, 0), (auto, 3)):
        if pairs is not None:
            _force(monkeypatch, 6, True, host=6, pairs=pairs)
        _step(model, x, x)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base, n0 = torch.cuda.memory_allocated(), len(packed)
        results.append(_step(model, x, x))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        copies.append(len(packed) - n0)
    assert copies == [0, 6, 3], copies
    (loss_a, grads_a), *rest = results
    for loss, grads in rest:
        assert rel_err(loss, loss_a) <= 1e-3 and grads.keys() == grads_a.keys() and grads_a
        for name in grads_a:  # (flash attention's backward: atomics)
            assert rel_err(grads[name], grads_a[name]) <= 2e-2, (name, rel_err(grads[name], grads_a[name]))
    one = x.numel() * cfg.n_embd * 2  # a (T, C) bf16 tensor
    extra = memplan.PAIR_EXTRA_N_EMBD * one
    assert peaks[2] <= 1.02 * peaks[1] + extra and peaks[1] < peaks[0] and peaks[2] < peaks[0], (peaks, one)


@pytest.mark.gpu
def test_gpu_thirty_lengths_keep_the_pool_under_its_budget(monkeypatch):
    """LoRA (2 layers of Llama-3.2-1B, bf16), 30 distinct lengths, a pool budget of a few shapes' activations: the
    pool is released when it goes over, stays under budget plus one shape from then on, training goes on, and the
    reserved memory at the end is bounded."""
    from test_buckets import _gpu_models

    cfg, graphed, _ = _gpu_models(True, block_size=2048)
    apply_liger(graphed, LigerConfig(cuda_graphs=True, seq_buckets=False, packing=False))
    total = memplan._total_memory(torch.device("cuda"))
    # a few shapes' growth: on an H200 the pool grew 96 MiB at the first capture (128 tokens: the fused loss's
    # logits chunks over Llama's 128k vocabulary), 172 MiB by 448 tokens, 350 MiB by 1,920
    # (benchmarks/calls/pool_growth.py, benchmarks/results/h200-2026-12-02c)
    budget = 160 * 2**20
    monkeypatch.setattr(graphs, "POOL_FRACTION", budget / total)
    runner = graphs.runner_for(graphed)
    lengths = [64 * (i + 1) for i in range(30)]
    torch.cuda.synchronize()
    start, reserved, pool_seen = torch.cuda.memory_reserved(), [], 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for T in lengths:
            x = torch.randint(0, cfg.vocab_size, (1, T), device="cuda")
            loss, _ = _step(graphed, x, x)
            assert torch.isfinite(loss)
            pool_seen = max(pool_seen, runner.pool_bytes)  # (a release resets it: this sees what stayed)
            reserved.append(torch.cuda.memory_reserved())
    assert 0 < pool_seen <= budget, (pool_seen, budget)  # the pool's growth is tracked, and never kept over budget
    assert any("over its budget" in str(w.message) for w in caught)
    assert runner.max_tokens is not None and runner.max_tokens < lengths[-1] and runner.captures >= 3
    # the pool's budget, plus an uncaptured step at the longest length (its activations, the loss's logits chunk)
    assert max(reserved) - start <= budget + 2 * GiB, [r / GiB for r in reserved]


def test_no_offload_inside_a_ddp_wrapper(monkeypatch):
    """Several processes that are not lit-liger's replica (DDP's wrapper, whose reducer does not take the reentrant
    checkpoint the offload uses): the plan may recompute, not offload."""
    from lit_liger import _dist

    cfg, _, model = _lora_pair(dropout=0.0)
    apply_liger(model)
    x, _ = _data(cfg)
    _force(monkeypatch, cfg.n_layer, True)
    assert swap_gpt._memory_plan_here(model, x) == (cfg.n_layer, True, 0, cfg.n_layer, 0, 0, 0, 0)
    monkeypatch.setattr(_dist, "several_processes", lambda: True)
    monkeypatch.setattr(_dist, "replicated", lambda gpt: True)  # (inside DDP's forward)
    monkeypatch.setattr(swap_gpt, "sharded_processes", lambda gpt: False)
    assert swap_gpt._memory_plan_here(model, x) == (cfg.n_layer, False, 0, 0, 0, 0, 0, 0)


def test_long_sequences_take_pytorch_s_sdpa_choice_uncaptured():
    """``sdpa_backend="auto"``: a sequence of ``attention.SDPA_LONG`` tokens or more is keyed like a captured step
    (PyTorch's choice, cuDNN on an H100) even uncaptured."""
    from lit_liger.swap import attend as attention

    cfg, _, model = _lora_pair(dropout=0.0)
    apply_liger(model)
    attn = model.transformer.h[0].attn
    q = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0), size=lambda dim: attention.SDPA_LONG)
    assert attn._liger_sdpa_flags(q) == attention.SDPA_BACKENDS["torch"]
    assert list(attn._liger_sdpa_cache) == [(torch.device("cuda", 0), True)]


@pytest.mark.gpu
def test_gpu_long_document_recipe_completes(tmp_path):
    """litgpt's LoRA recipe through the ``lit-liger`` command with the defaults on 16k-token documents (Llama-3.1-8B's
    widths, 2 layers): it trains and completes, litgpt's final save and ``merge_lora`` included, with the plan and
    the graphs' lines in its log (the full-depth run: ``benchmarks/results/h100-2026-11-26f``)."""
    from benchmarks import recipe

    result = recipe.main(["--models", "Llama-3.1-8B", "--n_layer", "2", "--methods", "lora", "--micro_batches", "1",
                          "--lengths", "long", "--max_seq_length", "16384", "--global_batch", "1", "--iters", "3",
                          "--warmup", "1", "--variants", "liger", "--work_dir", str(tmp_path / "work"),
                          "--out", str(tmp_path / "out")])
    (row,) = result["rows"]
    assert row["status"] == "ok" and row["completed"], row
    log = next((tmp_path / "work" / "recipe-runs").glob("*/stdout.txt")).read_text()
    assert "lit-liger: memory plan at 16,384 tokens per micro-batch" in log
    assert "Saved merged weights" in log


def test_offloaded_block_s_moment_counts_without_the_gpu_s_inputs():
    """An offloaded Block's backward holds ``OFFLOADED_EXTRA_N_EMBD`` (T, C) tensors more than a GPU-input Block's,
    when the GPU's inputs are freed: with every input on the host that moment sets the plan's need (8B LoRA at 262k:
    7 + 2 tensors, the tile, the input back and the gradient flowing in: 23 GiB, where the GPU's moment counts 19), so
    21 GiB is refused, and at 23 GiB two inputs stay on the GPU (the GPU's moment with them is no larger); with 25 GiB
    the GPU's moment with three inputs kept there is the larger, as before."""
    cfg = _config("Llama-3.1-8B")
    T = 262144
    unit = T * cfg.n_embd * 2  # (2 GiB)
    tile = memplan.TILE_WORKING * memplan.tile_tokens(cfg, T, 2) * 14336 * 2
    off = (memplan.TILED_N_EMBD + memplan.OFFLOADED_EXTRA_N_EMBD + 2) * unit + tile
    assert memplan.OFFLOADED_EXTRA_N_EMBD == 2 and off == 22 * GiB + tile
    with pytest.raises(memplan.MemoryPlanError) as err:
        memplan.decide(cfg, T, 21 * GiB, tile=True)
    assert err.value.gpu_need == off
    plan = memplan.decide(cfg, T, 23 * GiB, tile=True)
    assert (plan.host, plan.need) == (30, off)
    roomy = memplan.decide(cfg, T, 25 * GiB, tile=True)
    assert roomy.host == 29 and roomy.need == (memplan.TILED_N_EMBD + 2) * unit + tile + 3 * unit > off
