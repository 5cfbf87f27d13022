"""Sequence buckets (padding parity against stock LitGPT on the unpadded batch) and CUDA graphs
(fallbacks on CPU; capture and replay equal to uncaptured steps on a GPU)."""

import copy
import warnings

import pytest
import torch
from helpers import rel_err
from litgpt import GPT
from litgpt.utils import chunked_cross_entropy as litgpt_ce
from test_adapter import _pair, tiny_config

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy
from lit_liger.swap import adapter as adapter_mod
from lit_liger.swap.buckets import MIN_BUCKET, bucket_length
from lit_liger.runtime import graphs
from lit_liger.runtime.graphs import RECAPTURE_ON_GROWTH, runner_for
from lit_liger.swap.state import state_of
from lit_liger.swap import gpt as swap_gpt


def test_bucket_ladder():
    seen = {bucket_length(t, 512) for t in range(1, 513)}
    assert seen == set(range(64, 513, 64))  # 8 shapes for every length up to 512
    for t in range(1, 5000):
        b = bucket_length(t)
        assert b >= t and b % MIN_BUCKET == 0
        assert b - t < MIN_BUCKET or (b - t) / t <= 1 / 8  # at most 1/8 padding above 512
        assert bucket_length(t, max_length=t + 1) in (t, t + 1)  # never past max_seq_length
    assert bucket_length(700, max_length=600) == 700  # longer than max: not shortened (the model raises)
    assert len({bucket_length(t) for t in range(513, 4097)}) == 24  # 8 per doubling


@pytest.fixture
def buckets_on_cpu(monkeypatch):
    monkeypatch.setattr(swap_gpt, "_BUCKETS_ON_CPU", True)


def _grads(model):
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("call", "name"), [("finetune_lora", "Llama-3.2-1B"), ("finetune_lora", "Qwen3-0.6B"),
                                           ("finetune_lora", "gemma-2-2b"), ("finetune_full", "Llama-3.2-1B")])
def test_padded_batch_equals_unpadded_stock(name, call, buckets_on_cpu):
    """A batch of length 21 runs padded to 64 in the swapped model; loss and every gradient equal stock
    LitGPT's on the unpadded batch, with the training scripts' own calls and shift (the full script's on one family:
    its call is the same code for each)."""
    cfg = tiny_config(name, block_size=96)
    ref, ours = _pair(cfg)
    apply_liger(ours)
    torch.manual_seed(3)
    x = torch.randint(0, cfg.vocab_size, (2, 21))
    y = torch.randint(0, cfg.vocab_size, (2, 21))
    y[1, 15:] = -100  # litgpt's collate: the shorter sample's tail is ignored
    if call == "finetune_lora":  # litgpt/finetune/lora.py
        out = ours(x, lm_head_chunk_size=128)
        assert out[0].hidden.shape[1] == 64 and out[0].shape == (2, 21, cfg.padded_vocab_size)
        out[-1] = out[-1][..., :-1, :]
        loss = chunked_cross_entropy(out, y[..., 1:])
        ref_out = ref(x, lm_head_chunk_size=128)
        ref_out[-1] = ref_out[-1][..., :-1, :]
        loss_ref = litgpt_ce(ref_out, y[..., 1:])
    else:  # litgpt/finetune/full.py
        out = ours(x)
        assert out.hidden.shape[1] == 64
        loss = chunked_cross_entropy(out[..., :-1, :], y[..., 1:])
        loss_ref = litgpt_ce(ref(x)[..., :-1, :], y[..., 1:])
    assert rel_err(loss, loss_ref) <= 1e-5, (loss.item(), loss_ref.item())
    loss.backward()
    loss_ref.backward()
    g, g_ref = _grads(ours), _grads(ref)
    assert g.keys() == g_ref.keys() and len(g) > 0
    for n in g:
        assert rel_err(g[n], g_ref[n]) <= 1e-4, (n, rel_err(g[n], g_ref[n]))


def test_padded_logits_window(buckets_on_cpu):
    cfg = tiny_config("Llama-3.2-1B", block_size=96)
    ref, ours = _pair(cfg)
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 10))
    y = torch.randint(0, cfg.vocab_size, (2, 10))
    out = ours(x)
    assert out.hidden.shape[1] == 64 and out.shape == (2, 10, cfg.padded_vocab_size)
    with torch.no_grad():
        logits = ref(x)
    assert rel_err(out.materialize(), logits) <= 1e-5  # the window's logits, not the padding's
    shifted = out[:, 2:-1, :]
    assert shifted.shape == (2, 7, cfg.padded_vocab_size) and (shifted.t0, shifted.t1) == (2, 9)
    per_token = shifted.loss(y[:, 3:], reduction="none")
    ref_tok = torch.nn.functional.cross_entropy(logits[:, 2:-1].reshape(-1, logits.size(-1)), y[:, 3:].reshape(-1),
                                                reduction="none").view(2, 7)
    assert per_token.shape == (2, 7) and rel_err(per_token, ref_tok) <= 1e-5
    assert rel_err(out[1, :, :].materialize(), logits[1]) <= 1e-5  # other indexing: drops the padding first
    with pytest.raises(ValueError, match="does not match"):
        out.loss(y[:, 1:])  # an unshifted output with shifted targets is still caught


def test_buckets_off_and_cpu_default(monkeypatch):
    cfg = tiny_config("Llama-3.2-1B", block_size=96)
    _, ours = _pair(cfg)
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (1, 10))
    assert ours(x).hidden.shape[1] == 10  # CPU tensors: nothing to gain, no padding
    monkeypatch.setattr(swap_gpt, "_BUCKETS_ON_CPU", True)  # as the buckets_on_cpu fixture does
    apply_liger(ours, LigerConfig(seq_buckets=False))
    assert ours(x).hidden.shape[1] == 10
    apply_liger(ours, LigerConfig())
    assert ours(x).hidden.shape[1] == 64
    with torch.no_grad():
        assert ours(x).shape[1] == 10  # validation's real logits are never padded


def test_report_and_settings():
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    def graphs_line(text):
        return next(line for line in text.splitlines() if "(cuda_graphs" in line)

    text = str(apply_liger(ours))
    assert "seq_buckets" in text and "automatic" in graphs_line(text)  # default: automatic
    assert f"up to {graphs.auto_max_tokens(ours):,} tokens per micro-batch" in graphs_line(text)
    text = str(apply_liger(ours, LigerConfig(cuda_graphs=True)))
    assert "seq_buckets" in text and "automatic" not in graphs_line(text)
    text = str(apply_liger(ours, LigerConfig(seq_buckets=False, cuda_graphs=False)))
    assert "seq_buckets" not in text and "cuda_graphs" not in text
    assert "seq_buckets" not in LigerConfig.switches() and "cuda_graphs" not in LigerConfig.switches()
    with pytest.raises(TypeError):
        LigerConfig(cuda_graphs="yes")
    text = str(apply_liger(ours, LigerConfig(fused_linear_cross_entropy=False)))
    assert "no seq_buckets, cuda_graphs or activation_checkpointing" in text


def test_graphs_not_used_on_cpu_and_no_warning():
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (1, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chunked_cross_entropy(ours(x), x).backward()
    runner = runner_for(ours)
    assert runner.why_not(x) == "" and runner.captures == 0 and not runner.graphs


def test_graph_runner_reasons(monkeypatch):
    """Where capture cannot apply, the reason names it (the runner then warns once and runs uncaptured)."""
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    runner = runner_for(ours)
    fake_cuda = torch.empty(1, 4, dtype=torch.long, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert runner.why_not(fake_cuda) is None
    h = ours.transformer.h[0].register_forward_hook(lambda *a: None)
    assert "has hooks" in runner.why_not(fake_cuda)
    h.remove()
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    assert "several processes" in runner.why_not(fake_cuda)
    with monkeypatch.context() as m:  # inside a DDP forward: a replica, captured (DDP's hooks reduce the gradients)
        m.setattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", object(), raising=False)
        assert runner.why_not(fake_cuda) is None
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)
    with pytest.warns(UserWarning, match="CUDA graphs off for this step"):
        runner.warn_once("a reason")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.warn_once("a reason")  # once


@pytest.mark.parametrize("full", [True, "ddp"])
@pytest.mark.parametrize("lora", [True, False])
def test_automatic_graphs_only_where_few_parameters_train(monkeypatch, lora, full):
    """cuda_graphs=None captures full fine-tuning too in one process; in a DDP replica (the gradients go through
    autograd there, a second copy; lit-liger's own replica plan counts as one process) it captures LoRA-style runs
    (at most 1/8 of the parameters trained) and leaves full fine-tuning uncaptured, without a warning;
    cuda_graphs=True captures both."""
    from lit_liger.runtime import graphs as graphs_mod

    if full == "ddp":  # several processes, inside a DDP forward (where capture applies)
        monkeypatch.setattr(graphs_mod, "whole_model", lambda gpt: False)
        full = False

    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)  # cuda_graphs automatic
    if lora:
        for n, p in ours.named_parameters():
            p.requires_grad_(n.startswith("transformer.h.0.attn.proj"))  # a small trained part
    attempts = []

    class Capture:
        def __init__(self, runner, idx, params, plan=None, **kw):
            attempts.append(len(params))
            raise RuntimeError("no capture in this test")

    monkeypatch.setattr(graphs_mod, "_Graphs", Capture)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    runner = runner_for(ours)
    fake_cuda = torch.empty(1, 4, dtype=torch.long, device="meta")
    if lora or full:
        with pytest.warns(UserWarning, match="capture failed"):
            assert runner.hidden(fake_cuda, auto=True) is None
        assert len(attempts) == 1 and runner.few_trained is lora
        assert attempts == [1] or not lora  # the proj weight (no bias in Llama)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert runner.hidden(fake_cuda, auto=True) is None
        assert attempts == [] and not runner.few_trained and not runner.disabled
        with monkeypatch.context() as m:  # automatic mode says nothing where it would not capture anyway
            m.setattr(torch.distributed, "is_initialized", lambda: True)
            m.setattr(torch.distributed, "get_world_size", lambda: 2)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert runner.hidden(fake_cuda, auto=True) is None
            with pytest.warns(UserWarning, match="several processes"):
                assert runner.hidden(fake_cuda, auto=False) is None
        with pytest.warns(UserWarning, match="capture failed"):
            runner.hidden(fake_cuda, auto=False)  # cuda_graphs=True: captured all the same
        assert len(attempts) == 1


def test_graph_runner_sees_model_changes(monkeypatch):
    """The per-call check is cheap but complete: a new submodule (registration), a moved parameter, a
    changed trainable set or dropout all change what a replay would compute."""
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    runner = runner_for(ours)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    fake_cuda = torch.empty(1, 4, dtype=torch.long, device="meta")
    assert runner.why_not(fake_cuda) is None and not runner._tree_changed()
    before = runner._fingerprint()
    ours.transformer.h[0].attn.proj = torch.nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)  # a new module
    assert runner._tree_changed()
    runner.why_not(fake_cuda)  # walks again
    assert not runner._tree_changed() and runner._fingerprint() != before
    fp = runner._fingerprint()
    p = ours.lm_head.weight
    p.data = p.data.clone()  # moved
    assert runner._fingerprint() != fp
    fp = runner._fingerprint()
    p.requires_grad_(False)
    assert runner._fingerprint() != fp


@pytest.mark.parametrize("lora", [True, False])
def test_graph_runner_does_not_keep_the_model_alive(monkeypatch, lora):
    """The runners live in a dict under their model's weak key: a runner that has walked its model (every
    CUDA training forward does, captured or not) must not reach the model back, or the model, its weights
    and gradients stay allocated for the rest of the process. Found on an H100: after a lit-liger variant
    of ``benchmarks step`` (full training, graphs automatic, so uncaptured), the next variants ran out of
    memory. Here with a model hook that references the model, and, for LoRA, a failed capture."""
    import functools
    import gc
    import weakref

    from lit_liger.runtime import graphs as graphs_mod

    class Capture:
        def __init__(self, runner, idx, params, plan=None, **kw):
            raise RuntimeError("no capture in this test")

    monkeypatch.setattr(graphs_mod, "_Graphs", Capture)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def make():
        cfg = tiny_config("Llama-3.2-1B")
        _, ours = _pair(cfg)
        apply_liger(ours)
        if lora:
            for n, p in ours.named_parameters():
                p.requires_grad_(n.startswith("transformer.h.0.attn.proj"))
        runner = runner_for(ours)
        fake_cuda = torch.empty(1, 4, dtype=torch.long, device="meta")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert runner.hidden(fake_cuda, auto=True) is None  # walked the model; LoRA: the capture failed
        assert runner._tree is not None and runner.few_trained is lora
        assert bool(runner.disabled)  # (one process: automatic mode captures LoRA and full training alike)
        # a hook that holds the model (a cycle the garbage collector frees, unless something outside holds it)
        ours.transformer.h[1].register_forward_hook(functools.partial(lambda model, *a: None, ours))
        assert "has hooks" in runner.why_not(fake_cuda) or runner.disabled
        return weakref.ref(ours), weakref.ref(ours.lm_head.weight)

    model, weight = make()
    gc.collect()
    assert model() is None and weight() is None


def test_swapped_model_still_deepcopies_and_pickles():
    import pickle

    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    runner_for(ours)  # the runner lives outside the model
    copy.deepcopy(ours)
    pickle.loads(pickle.dumps(ours))


# ------------------------------------------------------------------------------------------------
# GPU: graphs against uncaptured steps
# ------------------------------------------------------------------------------------------------
def _gpu_models(lora: bool, dropout: float = 0.0, name: str = "Llama-3.2-1B", **over):
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    if lora:
        cfg = LoRAConfig.from_name(name, lora_r=8, lora_alpha=16, lora_query=True, lora_value=True,
                                   lora_dropout=dropout, **{"n_layer": 2, "block_size": 512, **over})
        cls = LoRAGPT
    else:
        cfg = tiny_config("Llama-3.2-1B").__class__.from_name("Llama-3.2-1B", n_layer=2, block_size=512)
        cls = GPT
    torch.manual_seed(0)
    with torch.device("cuda"):
        a = cls(cfg).to(torch.bfloat16)
    a.apply(a._init_weights)
    if lora:
        for n, p in a.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)
        mark_only_lora_as_trainable(a)
    b = copy.deepcopy(a)
    apply_liger(a, LigerConfig(cuda_graphs=True))
    apply_liger(b, LigerConfig(cuda_graphs=False))
    return cfg, a, b


@pytest.mark.gpu
@pytest.mark.parametrize("lora, caller_thread", [(True, False), (False, False), (True, True), (False, True)])
def test_gpu_graphs_equal_uncaptured_with_accumulation(lora, caller_thread):
    """Several micro-batches of different lengths (two buckets, a repeated one), gradient accumulation
    over them: captured-graph grads and losses equal the uncaptured model's (same kernels, same order);
    with autograd's backward on the device thread and on the caller's (``LigerConfig.caller_thread_backward``)."""
    cfg, graphed, plain = _gpu_models(lora)
    torch.manual_seed(1)
    lengths = [100, 300, 90, 310, 120, 100]
    for model in (graphed, plain):
        model.zero_grad(set_to_none=True)
    with torch.autograd.set_multithreading_enabled(not caller_thread):
        _accumulate(cfg, graphed, plain, lengths)
    runner = runner_for(graphed)
    assert len(runner.graphs) == 2 and runner.captures == 2 + runner.regrown  # buckets 128 and 320
    assert runner.regrown == (1 if RECAPTURE_ON_GROWTH else 0)  # 320 is longer than the first capture's 128
    assert runner.replays == len(lengths)
    gp, pp = _grads(graphed), _grads(plain)
    assert gp.keys() == pp.keys() and gp
    for n in gp:
        assert rel_err(gp[n], pp[n]) <= 2e-2, (n, rel_err(gp[n], pp[n]))


@pytest.mark.gpu
def test_gpu_graphs_flex_attention_model_across_buckets(monkeypatch):
    """With ``graphs.CAPTURE_FLEX`` on (the default): gemma-2 (logit softcap; a sliding-window layer of 128 and a global layer)
    with LoRA, captured across four buckets and replayed in mixed order: losses and gradients equal the uncaptured
    model's. Before the block masks were built outside the graphs' pool this failed on an H100 with an illegal
    memory access after the second bucket's capture (h100-2026-11-23e/recipe-gemma2-2L-graphs-crash)."""
    from lit_liger.runtime import graphs as graphs_mod
    from lit_liger.swap.attend import _BLOCK_MASKS

    monkeypatch.setattr(graphs_mod, "CAPTURE_FLEX", True)

    _BLOCK_MASKS.clear()  # every bucket's mask is built during its capture's warm-up, as in a fresh run
    cfg, graphed, plain = _gpu_models(True, dropout=0.0, name="gemma-2-2b", sliding_window_size=128)
    torch.manual_seed(1)
    lengths = [100, 300, 90, 200, 310, 120, 450, 100, 300]
    for model in (graphed, plain):
        model.zero_grad(set_to_none=True)
    _accumulate(cfg, graphed, plain, lengths)
    runner = runner_for(graphed)
    assert runner.disabled is None and runner.captures == len(runner.graphs) == 4  # 128, 256, 320, 512
    assert runner.replays == len(lengths)
    gp, pp = _grads(graphed), _grads(plain)
    assert gp.keys() == pp.keys() and gp
    for n in gp:
        assert rel_err(gp[n], pp[n]) <= 2e-2, (n, rel_err(gp[n], pp[n]))


def _accumulate(cfg, graphed, plain, lengths):
    for T in lengths:
        x = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
        y = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
        losses = []
        for model in (graphed, plain):
            out = model(x, lm_head_chunk_size=128)
            out[-1] = out[-1][..., :-1, :]
            loss = chunked_cross_entropy(out, y[..., 1:])
            (loss / len(lengths)).backward()
            losses.append(loss.detach().float())
        assert rel_err(losses[0], losses[1]) <= 1e-3, (T, losses)


@pytest.mark.gpu
def test_gpu_capture_records_beside_queued_gpu_work(monkeypatch):
    """A new shape's capture is recorded while the GPU still runs the work queued before it (here ~2 s of
    ``torch.cuda._sleep``, and the input computed after it), and the step's loss and gradients equal the uncaptured
    model's. The GPU's measured wait for such a capture is a small part of its host time."""
    cfg, graphed, plain = _gpu_models(lora=True)
    torch.manual_seed(1)
    lengths = [100, 300, 180]  # three buckets: three captures
    graphed.zero_grad(set_to_none=True)
    plain.zero_grad(set_to_none=True)
    waits, hosts = [], []
    for i, T in enumerate(lengths):
        x0 = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
        y = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
        losses = []
        for model in (graphed, plain):
            torch.cuda.synchronize()
            graphs.settle_waits(graphs.runner_for(graphed), block=True)
            before = dict(state_of(graphed).captures)
            if model is graphed:
                # queued GPU work (~2 s, longer than a capture with its Triton compilations); the input is made after
                # it, on the same stream
                torch.cuda._sleep(4 * 10**9)
            x = (x0 + 1) - 1
            out = model(x, lm_head_chunk_size=128)
            out[-1] = out[-1][..., :-1, :]
            loss = chunked_cross_entropy(out, y[..., 1:])
            (loss / len(lengths)).backward()
            losses.append(loss.detach().float())
            if model is graphed and i > 0:  # (the pool's first capture synchronizes and empties the cache anyway)
                graphs.settle_waits(graphs.runner_for(graphed), block=True)
                waits.append(state_of(graphed).captures["gpu_wait"] - before["gpu_wait"])
                # (the recording's host seconds: the synced captures' wait for the sleep itself is their "release")
                hosts.append(sum(state_of(graphed).captures[k] - before[k] for k in ("warmup", "forward", "backward")))
        assert rel_err(losses[0], losses[1]) <= 1e-3, (T, losses)
    assert runner_for(graphed).captures == len(lengths) + runner_for(graphed).regrown
    gp, pp = _grads(graphed), _grads(plain)
    assert gp.keys() == pp.keys() and gp
    for n in gp:
        assert rel_err(gp[n], pp[n]) <= 2e-2, (n, rel_err(gp[n], pp[n]))
    assert all(h > 0 for h in hosts), hosts
    # the recording overlapped the sleep: the GPU waited for the warm-up's own GPU work at most
    assert sum(waits) <= 0.25 * sum(hosts), (waits, hosts)


@pytest.mark.gpu
def test_gpu_full_training_queued_far_ahead_of_the_gpu(monkeypatch):
    """The host far ahead of the GPU (lazylog.LAG's lead; made certain here by ~2 s of ``torch.cuda._sleep`` queued
    before each optimizer step's micro-batches): full fine-tuning captured, new shapes captured while the GPU still
    sleeps (recorded beside queued work), fused AdamW steps and ``zero_grad()`` between, all of it queued behind the
    sleep, gives the uncaptured model's losses and parameters."""
    cfg, graphed, plain = _gpu_models(False)
    apply_liger(graphed, LigerConfig(cuda_graphs=None))  # automatic: full training captured
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True) for m in (graphed, plain)}
    torch.manual_seed(4)
    steps = [[100, 300], [180, 100], [300, 60]]  # a new shape in every step
    data = [[(torch.randint(0, cfg.vocab_size, (2, T), device="cuda"),
              torch.randint(0, cfg.vocab_size, (2, T), device="cuda")) for T in lengths] for lengths in steps]
    losses = {}
    for model in (graphed, plain):
        torch.cuda.synchronize()
        got = []
        for step in data:
            if model is graphed:
                torch.cuda._sleep(4 * 10**9)  # everything below is queued behind it
            for x0, y in step:
                x = (x0 + 1) - 1  # (made behind the sleep)
                out = model(x, lm_head_chunk_size=128)
                out[-1] = out[-1][..., :-1, :]
                loss = chunked_cross_entropy(out, y[..., 1:])
                (loss / len(step)).backward()
                got.append(loss.detach().float())
            opts[model].step()
            opts[model].zero_grad()
        if model is graphed:  # the host got here before the GPU did (no step waited for it)
            assert not torch.cuda.current_stream().query()
        losses[model] = torch.stack(got)
    runner = runner_for(graphed)
    assert runner.captures == 4 and runner.replays == 6 and not runner.disabled
    assert rel_err(losses[graphed], losses[plain]) <= 1e-3, (losses[graphed], losses[plain])
    for (n, a), b in zip(graphed.named_parameters(), plain.parameters()):
        assert rel_err(a, b) <= 2e-2, n


@pytest.mark.gpu
@pytest.mark.parametrize("hooked", [False, True])
def test_gpu_full_training_captured_grads_are_the_grad_tensors(monkeypatch, hooked):
    """Full fine-tuning captured by cuda_graphs=None (gradients straight into ``.grad``): several optimizer steps (AdamW, two micro-batches of
    different buckets each, gradient clipping, ``zero_grad()`` to None) give the uncaptured model's parameters and
    optimizer state; each ``.grad`` is the replay's own buffer (no second copy), so the captured model holds no more
    memory than the uncaptured one beyond the graphs' activations. With a tensor hook on a parameter the gradients
    go through autograd's accumulation instead (the hook runs on every backward). The token embedding's gradient is
    added into its ``.grad`` by its own kernel too (the retired ``EMBEDDING_GRAD_INTO`` switch's winner)."""
    cfg, graphed, plain = _gpu_models(False)
    apply_liger(graphed, LigerConfig(cuda_graphs=None))  # automatic: full training captured
    calls = []
    if hooked:
        for m in (graphed, plain):
            m.transformer.h[0].attn.qkv.weight.register_post_accumulate_grad_hook(
                lambda p, m=m: calls.append(m is graphed))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (graphed, plain)]
    torch.manual_seed(4)
    for _ in range(3):
        _accumulate(cfg, graphed, plain, [100, 300])
        for m, opt in zip((graphed, plain), opts):
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    runner = runner_for(graphed)
    assert runner.captures == 2 and runner.replays == 6 and not runner.disabled
    # every Block's qkv, attention proj, fc_1, fc_2 and MLP proj weight gradient is added into .grad by its GEMM
    # (and the token embedding's by its own kernel)
    assert all(g.added_by_gemm == 5 * cfg.n_layer + 1 for g in runner.graphs.values()), \
        [g.added_by_gemm for g in runner.graphs.values()]
    for (n, a), b in zip(graphed.named_parameters(), plain.parameters()):
        assert rel_err(a, b) <= 2e-2, n
        sa, sb = opts[0].state[a], opts[1].state[b]
        assert rel_err(sa["exp_avg"], sb["exp_avg"]) <= 5e-2, n
        assert rel_err(sa["exp_avg_sq"], sb["exp_avg_sq"]) <= 5e-2, n
    if hooked:
        assert calls.count(True) == calls.count(False) == 6
    _accumulate(cfg, graphed, plain, [300])
    bufs = {id(b) for b in runner.buffers.values()}
    grads = [p.grad for p in graphed.parameters() if p.grad is not None and p is not graphed.lm_head.weight]
    assert grads and all((id(g) in bufs) is not hooked for g in grads)
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    held = sum(b.numel() * b.element_size() for b in runner.buffers.values())
    assert held <= grad_bytes * 1.01 or hooked  # the buffers are the grads, not beside them
    if not hooked:  # no buffer beside them either (the lm_head, trained outside the graphs, has none)
        assert {id(b) for b in runner.buffers.values()} <= {id(p.grad) for p in graphed.parameters()}


@pytest.mark.gpu
def test_gpu_graphs_recapture_two_forwards_and_stale_backward():
    cfg, graphed, plain = _gpu_models(lora=True)
    runner = runner_for(graphed)
    x = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda")
    chunked_cross_entropy(graphed(x), x).backward()
    assert runner.captures == 1
    p = next(p for p in graphed.parameters() if p.requires_grad)
    p.data = p.data.clone()  # a parameter moved: the graphs must not read the old address
    chunked_cross_entropy(graphed(x), x).backward()
    assert runner.captures == 2
    # two forwards, then their backwards (in either order): the second forward runs uncaptured
    y = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda")
    for model in (graphed, plain):
        model.zero_grad(set_to_none=True)
    losses = {}
    for name, model in (("graphed", graphed), ("plain", plain)):
        first = chunked_cross_entropy(model(x), y)
        second = chunked_cross_entropy(model(y), x)
        second.backward()
        first.backward()
        losses[name] = (first.detach().float(), second.detach().float())
    assert runner.uncaptured == 1 and runner.replays == 3
    for a, b in zip(losses["graphed"], losses["plain"]):
        assert rel_err(a, b) <= 1e-3
    gp, pp = _grads(graphed), _grads(plain)
    for n in gp:
        assert rel_err(gp[n], pp[n]) <= 2e-2, (n, rel_err(gp[n], pp[n]))
    # a backward whose activations another replay has overwritten (kept through retain_graph) raises
    first = chunked_cross_entropy(graphed(x), y)
    first.backward(retain_graph=True)
    chunked_cross_entropy(graphed(y), x).backward()
    # caught by lit-liger's generation check, or before it by autograd's version check (the fused loss saved the
    # replayed hidden states, which the later replay overwrote through the same storage): an error either way
    with pytest.raises(RuntimeError, match="replayed over|modified by an inplace operation"):
        first.backward()


def seeded_replays_match(cfg, graphed, plain):
    """Capture two buckets of ``graphed`` (longest first: a capture's warm-up draws random numbers of its own), then
    three replays, each from the same seed as a step of the uncaptured ``plain``: same losses and gradients (the same
    dropout masks)."""
    runner = runner_for(graphed)
    for T in (300, 100):
        x = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
        chunked_cross_entropy(graphed(x), x).backward()
    assert runner.captures == 2 and runner.regrown == 0 and not runner.disabled, runner.error
    for model in (graphed, plain):
        model.zero_grad(set_to_none=True)
    for i, T in enumerate((90, 310, 120)):  # replays only
        x = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
        losses = []
        for model in (graphed, plain):
            torch.manual_seed(100 + i)
            out = model(x, lm_head_chunk_size=128)
            out[-1] = out[-1][..., :-1, :]
            loss = chunked_cross_entropy(out, x[..., 1:])
            loss.backward()
            losses.append(loss.detach().float())
        assert rel_err(losses[0], losses[1]) <= 1e-3, (T, losses)
    gp, pp = _grads(graphed), _grads(plain)
    assert gp.keys() == pp.keys() and gp
    for n in gp:
        assert rel_err(gp[n], pp[n]) <= 2e-2, (n, rel_err(gp[n], pp[n]))
    assert runner.captures == 2 and runner.replays == 5


@pytest.mark.gpu
def test_gpu_graphs_with_lora_dropout():
    """LoRA dropout is captured. PyTorch's CUDA generator is graph-safe: a replay reads the generator's
    offset when it runs, so from the same seed a replayed step draws the same masks as the uncaptured step
    (same random-number consumers in the same order) and its loss and gradients match; without reseeding,
    every replay draws new masks; the generator still works afterwards."""
    cfg, graphed, plain = _gpu_models(lora=True, dropout=0.2)
    assert any(isinstance(m, torch.nn.Dropout) for m in graphed.modules())
    seeded_replays_match(cfg, graphed, plain)
    x = torch.randint(0, cfg.vocab_size, (2, 100), device="cuda")
    first = chunked_cross_entropy(graphed(x), x)
    first.backward()
    second = chunked_cross_entropy(graphed(x), x)
    second.backward()
    assert first.item() != second.item()  # new masks on every replay
    torch.randint(0, 10, (3,), device="cuda").sum().item()  # the generator is intact


@pytest.mark.gpu
def test_gpu_graphs_memory_warmup_in_pool():
    """A shape's warm-up allocates from the graphs' pool (WARMUP_IN_POOL): after the longest shape is captured, a
    shorter shape's warm-up and capture fit in the pool's free blocks and barely move the reserved-memory peak
    (outside the pool the warm-up's activations come on top of it: by their sizes, about half the first capture's
    growth at T 256 vs 512; the H100 runs of `python -m benchmarks diag recipe-mem` measured that effect on a whole model)."""
    cfg, graphed, _ = _gpu_models(lora=True)
    runner = runner_for(graphed)

    def step(T: int) -> int:
        x = torch.randint(0, cfg.vocab_size, (4, T), device="cuda")
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        chunked_cross_entropy(graphed(x), x).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_reserved() - before

    step(512)  # first-call work outside the graphs (the loss, optimizer-free grads) settles
    graphed.zero_grad(set_to_none=True)
    runner.reset()
    torch.cuda.empty_cache()
    captures = runner.captures
    first = step(512)
    second = step(256)
    assert runner.captures == captures + 2 and len(runner.graphs) == 2 and runner.regrown == 0
    assert first > 0 and second <= 0.25 * first, (first, second)
    step(448)  # shorter again: captured in the same pool
    assert runner.regrown == 0 and len(runner.graphs) == 3


@pytest.mark.gpu
def test_gpu_failed_capture_falls_back_and_keeps_the_generator():
    """A capture that fails (here: a host sync inside the captured body) turns graphs off with one warning;
    the step and the rest of the run go on uncaptured, dropout included (the CUDA generator is repaired),
    with the uncaptured model's loss."""
    cfg, graphed, plain = _gpu_models(lora=True, dropout=0.2)
    body = type(graphed)._liger_hidden

    def syncing_body(idx, plan=None):
        out = body(graphed, idx, plan)
        if torch.cuda.is_current_stream_capturing():
            out.sum().item()  # not allowed while capturing: the capture fails
        return out

    graphed._liger_hidden = syncing_body
    runner = runner_for(graphed)
    x = torch.randint(0, cfg.vocab_size, (2, 100), device="cuda")
    with pytest.warns(UserWarning, match="capture failed"):
        chunked_cross_entropy(graphed(x), x).backward()
    assert runner.disabled and runner.captures == 0 and "may be unusable" not in runner.disabled
    torch.randint(0, 10, (3,), device="cuda").sum().item()
    torch.cuda.empty_cache()  # the allocator knows the failed capture is over (else: an internal assert, at exit too)
    for model in (graphed, plain):
        model.zero_grad(set_to_none=True)
    losses = []
    for model in (graphed, plain):
        torch.manual_seed(5)
        loss = chunked_cross_entropy(model(x), x)
        loss.backward()
        losses.append(loss.detach().float())
    assert rel_err(losses[0], losses[1]) <= 1e-3, losses


@pytest.mark.gpu
@pytest.mark.parametrize("lora, graphs", [(True, None), (True, True), (False, None)])
def test_gpu_model_memory_is_freed_after_training_steps(lora, graphs):
    """A swapped model trained on the GPU (LoRA captured by the automatic default or when asked; full
    training captured by the automatic default) and then dropped gives its memory back: the graphs' runner, on the
    model's state, holds the model only weakly. Before the fix the model, its weights and gradients
    stayed allocated (the CPU version of this test shows why)."""
    import gc

    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()

    def train():
        cfg, model, _ = _gpu_models(lora)
        apply_liger(model, LigerConfig(cuda_graphs=graphs))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        for T in (100, 200, 100):
            x = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
            chunked_cross_entropy(model(x), x).backward()
            opt.step()
            opt.zero_grad()
        # buckets 128 and 256; automatic mode captures full training too (one process)
        assert runner_for(model).captures == 2
        return torch.cuda.memory_allocated() - base

    used = train()
    gc.collect()
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - base
    assert used > 100 * 2**20 and left < 0.05 * used, (used, left)


@pytest.mark.parametrize("name, flex", [("gemma-2-2b", True), ("Llama-3.2-1B", False)])
def test_graphs_capture_flex_attention_models_unless_switched_off(monkeypatch, name, flex):
    """A model with FlexAttention layers is captured like any other; with ``graphs.CAPTURE_FLEX`` off it is
    not, and the runner gives the reason (warned once; the forward runs uncaptured). A plain causal model is
    never refused for it."""
    from lit_liger.runtime import graphs as graphs_mod

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    _, ours = _pair(tiny_config(name))
    apply_liger(ours)
    fake_cuda = torch.empty(1, 4, dtype=torch.long, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert runner_for(ours).why_not(fake_cuda) is None  # CAPTURE_FLEX on (the default)
    monkeypatch.setattr(graphs_mod, "CAPTURE_FLEX", False)
    why = runner_for(ours).why_not(fake_cuda)
    assert (why == graphs_mod.FLEX_WHY) if flex else why is None


def test_capture_warm_up_runs_without_the_garbage_collector(monkeypatch):
    """``graphs._no_gc``: collects first (only where asked: a model's first capture; a full collection costs 0.3 s in
    a litgpt process), keeps the collector off inside (a collection freeing a dead memory pool while allocations are
    routed to a pool aborts the process), and puts its state back, on an error too."""
    import gc

    from lit_liger.runtime.graphs import _no_gc

    collected = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(a) or collect(*a))
    assert gc.isenabled()
    with _no_gc():
        assert not gc.isenabled()
    assert gc.isenabled() and len(collected) == 1
    with _no_gc(collect=False):
        assert not gc.isenabled()
    assert gc.isenabled() and len(collected) == 1
    with pytest.raises(RuntimeError), _no_gc():
        raise RuntimeError("warm-up failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with _no_gc():
            pass
        assert not gc.isenabled()  # it was off before: stays off
    finally:
        gc.enable()


def test_release_drops_graphs_and_pool():
    """``graphs.release`` (run when training ends, by the ``lit-liger`` command and ``LigerCallback``): every swapped
    GPT inside the module loses its captured graphs, buffers and pool, and says so once; nothing captured, no word."""
    from lit_liger.runtime.graphs import release

    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    wrapper = torch.nn.ModuleDict({"model": ours})
    assert release(wrapper) is None  # (no runner yet)
    runner = runner_for(ours)
    assert release(wrapper) is None  # (a runner that captured nothing)
    runner.graphs[("shape", 1)] = object()
    runner.graphs[("shape", 2)] = object()
    runner.buffers[0] = torch.zeros(2)
    runner.pool = ("pool", 1)
    line = release(wrapper)
    assert line.startswith("lit-liger: training ended: the CUDA graphs of 2 input shapes and their memory pool released")
    assert not runner.graphs and not runner.buffers and runner.pool is None and runner.addresses is None
    assert release(wrapper) is None


def test_precapture_lengths_are_the_packed_ladder():
    """A replica's lengths captured at its first packed step (lit_liger.runtime.graphs.GraphRunner._precapture): every bucket a
    packed micro-batch of 4 samples of at most 512 tokens can get, within a token bound; each one is its own bucket."""
    from lit_liger.swap.buckets import packed_bucket_length
    from lit_liger.runtime.graphs import precapture_lengths

    lengths = precapture_lengths(4, 512)
    assert lengths == [64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048]
    assert all(packed_bucket_length(L) == L for L in lengths)
    seen = {packed_bucket_length(n) for n in range(4, 4 * 512 + 1)}
    assert set(lengths) == seen
    assert precapture_lengths(4, 512, max_tokens=1000) == lengths[:11]
    assert max(precapture_lengths(3, 100)) == 320  # (3 x 100 tokens pad up to 320)


# -- a ladder fitted to the data (buckets.fit_packed_tops; runtime.batches.fitted_ladder) -------------------------------
def _alpaca_like_lengths(n, seed=0):
    import math
    import random

    rng = random.Random(seed)
    return [rng.randint(6, 20) + (0 if rng.random() < 0.6 else rng.randint(5, 60))
            + int(min(2000, rng.lognormvariate(math.log(150), 0.75)) * 0.8) + 40 for _ in range(n)]


def test_packed_ladder_with_tops_pads_to_the_first_top_that_holds_a_length():
    from lit_liger.swap.buckets import packed_bucket_length

    tops = (272, 336, 1000)
    assert [packed_bucket_length(n, tops) for n in (1, 272, 273, 336, 337, 1000)] == [272, 272, 336, 336, 1000, 1000]
    for n in (1001, 1500, 5000):  # above the tops: the default ladder
        assert packed_bucket_length(n, tops) == packed_bucket_length(n) >= n
    # walking the ladder (as graphs.precapture_lengths does) stops at each bucket once
    seen, n = [], packed_bucket_length(1, tops)
    while n <= 1300:
        seen.append(n)
        n = packed_bucket_length(n + 1, tops)
    assert seen == [272, 336, 1000, 1024, 1280]  # (the default ladder: 128 apart to 1,024, then 256)


@pytest.mark.parametrize("per_batch", [2, 4])
def test_fitted_ladder_keeps_the_shape_count_and_pads_less(per_batch):
    from lit_liger.swap.buckets import FIT_ALIGN, FIT_TAIL, _draws, fit_packed_tops, packed_bucket_length, padding

    lengths = _alpaca_like_lengths(1024)
    tops, fitted, default = fit_packed_tops(lengths, per_batch, cap=512)
    packed = _draws(lengths, per_batch, 512, 8192, 0)  # (the draws the fit estimated on)
    body = sorted(packed)[:len(packed) - int(len(packed) * FIT_TAIL)]  # (the longest 0.2% left to the fixed ladder)
    assert len(tops) == len({packed_bucket_length(n) for n in body})  # as many shapes as the default ladder's
    assert list(tops) == sorted(set(tops)) and all(t % FIT_ALIGN == 0 for t in tops)
    assert tops[-1] == -(-body[-1] // FIT_ALIGN) * FIT_ALIGN and all(packed_bucket_length(n, tops) in tops for n in body)
    tail = [n for n in packed if n > tops[-1]]
    assert len(tail) <= len(packed) * FIT_TAIL and all(packed_bucket_length(n, tops) == packed_bucket_length(n)
                                                            for n in tail)
    assert fitted == pytest.approx(padding(packed, tops)) and default == pytest.approx(padding(packed))
    assert default > 0.08 and fitted < default - 0.01  # (measured: 8.8% -> 7.2% at 2, 8.6% -> 5.4% at 4)
    # on other draws of the same data the fitted ladder still pads less
    other = _draws(_alpaca_like_lengths(1024, seed=1), per_batch, 512, 8192, 1)
    assert padding(other, tops) < padding(other)


def test_fitted_ladder_is_the_fewest_padded_tokens_for_its_count(monkeypatch):
    """The dynamic program against every choice of tops (small case, exhaustive; every draw in the fit)."""
    import itertools

    from lit_liger.swap import buckets

    monkeypatch.setattr(buckets, "FIT_TAIL", 0.0)
    lengths = [30, 41, 55, 62, 70, 88, 97, 110, 121, 128]  # (13 and 18 candidates: 220 and 2,380 choices)
    for per_batch in (2, 3):
        tops, fitted, _ = buckets.fit_packed_tops(lengths, per_batch, draws=300, seed=3)
        packed = buckets._draws(lengths, per_batch, 0, 300, 3)
        cands = sorted({-(-n // buckets.FIT_ALIGN) * buckets.FIT_ALIGN for n in packed})
        best = min(sum(buckets.packed_bucket_length(n, (*c, cands[-1])) - n for n in packed)
                   for c in itertools.combinations(cands[:-1], len(tops) - 1))
        assert sum(buckets.packed_bucket_length(n, tops) - n for n in packed) == best
        assert tops[-1] == cands[-1]


def test_fitted_ladder_not_for_one_sample_or_no_lengths():
    from lit_liger.swap.buckets import fit_packed_tops

    assert fit_packed_tops([100, 200], 1) == ((), 0.0, 0.0)
    assert fit_packed_tops([], 4) == ((), 0.0, 0.0)


def test_prep_for_fits_the_ladder_to_the_loader_data(capsys):
    """The CLI's and the Trainer's host preparation: a ladder fitted to the training set's lengths (capped at the
    collate's max_seq_length), the GPT's own forward told it, each packed batch padded to one of its lengths."""
    from litgpt.data.base import get_sft_collate_fn
    from torch.utils.data import DataLoader

    from lit_liger.runtime.batches import LigerCollate, prep_for
    from lit_liger.swap.buckets import packed_bucket_length
    from lit_liger.swap.packing import BATCH_KEY

    lengths = _alpaca_like_lengths(600)
    data = [{"input_ids": torch.ones(n, dtype=torch.long), "labels": torch.ones(n, dtype=torch.long),
             "token_counts": {"raw": n, "raw_plus_prompt_template": n}} for n in lengths]
    gpt = torch.nn.Linear(2, 2)
    gpt._liger_packing, gpt._liger_pack_why, gpt._liger_seq_buckets = True, None, True
    collate = get_sft_collate_fn(max_seq_length=512)
    prep = prep_for(gpt, DataLoader(data, batch_size=4, collate_fn=collate))
    assert prep.tops and prep.tops == gpt._liger_packed_tops and prep.tops[-1] <= 4 * 512
    assert "packed micro-batches padded to" in capsys.readouterr().out
    wrapped = LigerCollate(collate, prep.pack, prep.bucketed, prep.tops)
    for i in range(0, 40, 4):
        batch = wrapped(data[i:i + 4])
        real = sum(min(n, 512) for n in lengths[i:i + 4])
        assert batch[BATCH_KEY][1][3] == packed_bucket_length(real, prep.tops)  # (n: the packed length)
    # one sample a micro-batch, no bucket ladder, or no packing: no fitted ladder
    for loader, attrs in ((DataLoader(data, batch_size=1, collate_fn=collate), {}),
                          (DataLoader(data, batch_size=4, collate_fn=collate), {"_liger_seq_buckets": False}),
                          (DataLoader(data, batch_size=4, collate_fn=collate), {"_liger_packing": False})):
        other = torch.nn.Linear(2, 2)
        other._liger_packing, other._liger_pack_why, other._liger_seq_buckets = True, None, True
        for k, v in attrs.items():
            setattr(other, k, v)
        assert prep_for(other, loader).tops == () and "_liger_packed_tops" not in other.__dict__
    # a later fit on data it cannot fit drops the earlier fit's ladder from the forward too
    assert prep_for(gpt, DataLoader(data, batch_size=1, collate_fn=collate)).tops == ()
    assert "_liger_packed_tops" not in gpt.__dict__
