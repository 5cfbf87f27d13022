"""Packed micro-batches (LigerConfig.packing) against stock LitGPT on the padded batch, on CPU: the swapped model
runs the samples end to end (LitGPT's attention per sample), and the loss, the per-token losses, the logits and
every gradient equal stock's on litgpt's padded batch."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err
from litgpt import GPT
from litgpt.utils import chunked_cross_entropy as litgpt_ce
from test_adapter import FAMILIES, _pair, tiny_config

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy
from lit_liger.swap import packing
from lit_liger.swap import gpt as swap_gpt
from lit_liger.swap.state import state_of

LENGTHS = (21, 9, 14)  # the longest sets the collated length, as litgpt's collate pads


@pytest.fixture
def pack_on_cpu(monkeypatch):
    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", True)
    monkeypatch.setattr(swap_gpt, "_BUCKETS_ON_CPU", True)


def _batch(cfg, lengths=LENGTHS, seed=3):
    """litgpt's SFT collate: token ids right-padded with 0, targets with -100; real ids are never 0 here."""
    torch.manual_seed(seed)
    T = max(lengths)
    x = torch.zeros(len(lengths), T, dtype=torch.long)
    y = torch.full((len(lengths), T), -100, dtype=torch.long)
    for b, L in enumerate(lengths):
        x[b, :L] = torch.randint(1, cfg.vocab_size, (L,))
        y[b, :L] = torch.randint(0, cfg.vocab_size, (L,))
        y[b, : L // 3] = -100  # the prompt is not trained on
    return x, y


def _lora_step_loss(model, x, y, ce=litgpt_ce):
    """litgpt/finetune/lora.py's loss: lm_head chunks, the last one shifted, litgpt's chunked_cross_entropy (``ce``:
    lit-liger's, as lit-liger's CLI patches it into the script)."""
    out = model(x, lm_head_chunk_size=128)
    out[-1] = out[-1][..., :-1, :]
    return ce(out, y[..., 1:])


def _full_step_loss(model, x, y, ce=litgpt_ce):
    """litgpt/finetune/full.py's loss."""
    return ce(model(x)[..., :-1, :], y[..., 1:])


def _compare(ref, ours, loss_fn, x, y, tol=1e-4):
    loss_ref = loss_fn(ref, x, y)
    loss_ref.backward()
    loss = loss_fn(ours, x, y)
    loss.backward()
    assert rel_err(loss, loss_ref) <= 1e-5, (loss.item(), loss_ref.item())
    grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    ours_grads = {n: p.grad for n, p in ours.named_parameters() if p.grad is not None}
    assert grads.keys() == ours_grads.keys() and grads
    for n in grads:
        assert rel_err(ours_grads[n], grads[n]) <= tol, (n, rel_err(ours_grads[n], grads[n]))


def test_plan_lays_samples_end_to_end():
    x = torch.tensor([[5, 6, 7, 0, 0], [8, 0, 9, 0, 0], [1, 2, 3, 4, 5]])
    assert packing.row_lengths(x) == [3, 3, 5]  # trailing zeros only; a zero inside a sample stays
    plan = packing.plan(x, lambda n: 16, max_position=32)
    assert plan.real == 11 and plan.idx.shape == (1, 16)
    assert plan.idx[0, :11].tolist() == [5, 6, 7, 8, 0, 9, 1, 2, 3, 4, 5] and plan.idx[0, 11:].eq(0).all()
    assert plan.positions.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert plan.pack.bounds == (0, 3, 6, 11, 16) and plan.pack.cu_seqlens.tolist() == [0, 3, 6, 11, 16]
    assert plan.pack.cu_seqlens.dtype == torch.int32 and plan.pack.max_len == 16
    assert plan.rows.tolist() == [[0, 1, 2, -1, -1], [3, 4, 5, -1, -1], [6, 7, 8, 9, 10]]
    assert packing.plan(x[:1], None, 32) is None  # one row: nothing to gain
    assert packing.plan(torch.ones(2, 4, dtype=torch.long), None, 32) is None  # no padding, no bucket ladder
    assert packing.row_lengths(torch.zeros(2, 3, dtype=torch.long)) == [1, 1]  # an empty row keeps one position
    assert packing.plan(x, lambda n: 40, max_position=5).positions.max() == 4  # the pad's positions stay in range


@pytest.mark.parametrize(("call", "name"), [("finetune_lora", name) for name in sorted(FAMILIES)]
                         + [("finetune_full", name) for name in ("Llama-3.2-1B", "gemma-2-2b", "pythia-14m")])
def test_packed_batch_equals_stock_padded_batch(name, call, pack_on_cpu):
    """Every family: the packed step's loss and every gradient equal stock LitGPT's on the padded batch (logit
    softcapping too: lit-liger's softcap kernel over the samples' starts), through the LoRA script's call (its head in
    chunks, the last one shifted); the full script's call (the whole output, shifted) on three of them: the call is
    the same code for every family (each family's pair with both calls cost the CPU suite ~2.5 minutes)."""
    cfg = tiny_config(name, block_size=64)
    ref, ours = _pair(cfg)
    report = apply_liger(ours, LigerConfig(packing=True))
    packable = True
    assert "training batches packed" in str(report) and "packing off" not in str(report)
    x, y = _batch(cfg)
    before = dict(state_of(ours).tokens)
    out = ours(x)
    assert (out.rows is not None) is packable
    if packable:  # the samples' 44 tokens, padded to the 64 bucket, instead of 3 x 21 -> 3 x 64
        assert out.hidden.shape[0] == 64 and out.shape == (3, 21, cfg.padded_vocab_size)
        assert state_of(ours).tokens["packed"] - before["packed"] == 63
    del out
    _compare(ref, ours, _lora_step_loss if call == "finetune_lora" else _full_step_loss, x, y)


def test_batch_without_padding_is_packed_with_a_bucket_ladder(pack_on_cpu, monkeypatch):
    """With a bucket ladder (the captured step), a batch whose samples all fill its length runs as the ladder's packed
    length of its tokens (the graphs the packed batches share), planned on the host or in the forward, once the run
    has had a batch with padding (before: unpacked), and its loss and gradients equal stock's; without a ladder it is
    not packed."""
    full = torch.arange(1, 9).view(2, 4)
    plan = packing.plan(full, lambda n: 16, max_position=32)
    data = packing.host_plan(full, None, lambda n: 16)
    assert packing.plan(full, None, 32) is None and packing.host_plan(full, None, None) is None
    assert plan.real == 8 and plan.pack.bounds == (0, 4, 8, 16) and plan.idx[0, :8].tolist() == list(range(1, 9))
    assert plan.rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and plan.positions[:8].tolist() == [0, 1, 2, 3] * 2
    assert data[1][2:5] == (8, 16, (0, 4, 8, 16))  # (real, packed length, boundaries), the same on the host
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=True))
    x, y = _batch(cfg, lengths=(20, 20, 20))
    assert ours(x).rows is None  # (no batch with padding yet: data that fill their length, such as pretraining's)
    assert ours(_batch(cfg)[0]).rows is not None  # (a batch with padding: packed)
    out = ours(x)
    assert out.rows is not None
    assert out.hidden.shape[0] == 64  # (60 tokens: the ladder's 64)
    del out
    _compare(ref, ours, _lora_step_loss, x, y)


def test_batches_that_fill_their_length_have_their_lengths_read_now_and_then(pack_on_cpu, monkeypatch):
    """``swap_gpt.LENGTH_READS``: where no loader laid the batch out, reading its lengths is a host sync on a GPU. While
    every batch read has filled its length, a model reads only its 1st, 4th, 16th, ... batch's; the others run
    unpacked, unread, with stock's loss and gradients, a padded one among them too. From the first read that finds
    padding every batch is read and packed."""
    monkeypatch.setattr(swap_gpt, "_lengths_sync", lambda idx: True)  # (as a device tensor's read would be)
    read, plan = [], packing.plan
    monkeypatch.setattr(packing, "plan", lambda idx, *a, **k: read.append(len(read) + 1) or plan(idx, *a, **k))
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=True))
    full, _ = _batch(cfg, lengths=(20, 20, 20))
    padded, y = _batch(cfg)
    ours(full[:1])  # (one row: nothing to read, not counted)
    assert ours(full).rows is None  # batch 1: read, filled, unpacked
    for n in range(2, 18):  # (the forward's decision alone, without running the model through the interpreter)
        assert ours._liger_plan(full) is None, n
    assert len(read) == 3  # batches 1, 4 and 16
    assert ours(padded).rows is None and len(read) == 3  # batch 18: not read, unpacked
    _compare(ref, ours, _lora_step_loss, padded, y)  # batch 19: unpacked, stock's numbers
    assert len(read) == 3
    ours.__dict__["_liger_unread"] = 63
    assert ours(padded).rows is not None and len(read) == 4  # batch 64: read, padding found, packed
    # (filled, after padding was seen: read, and packed as such a run packs a batch without padding)
    assert ours._liger_plan(full) is not None and ours._liger_plan(full) is not None
    assert len(read) == 6  # every batch read from then on
    assert [n for n in range(1, 1100) if swap_gpt._reads_lengths_at(n)] == [1, 4, 16, 64, 256, 512, 768, 1024]


@pytest.mark.parametrize("window", [3, 7])
def test_packed_sliding_window_layers(window, pack_on_cpu):
    """Sliding-window layers (Gemma-3's pattern: local and global) attend inside each sample with LitGPT's window."""
    cfg = tiny_config("gemma-3-1b-it", block_size=64, sliding_window_size=window)
    cfg.sliding_window_indices = [1, 0]
    ref, ours = _pair(cfg)
    assert ref.transformer.h[0].attn.apply_sliding_window_attention
    apply_liger(ours, LigerConfig(packing=True))
    x, y = _batch(cfg)
    assert ours(x).rows is not None
    _compare(ref, ours, _full_step_loss, x, y)


def test_packed_lora_model_with_checkpointing(pack_on_cpu):
    """A LoRA model (litgpt.lora.GPT), with activation checkpointing: the recomputed Blocks see the packing too."""
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable

    cfg = tiny_config("Llama-3.2-1B", config_cls=LoRAConfig, block_size=64, lora_r=4, lora_alpha=8,
                      lora_query=True, lora_value=True, lora_mlp=True)
    ref, ours = _pair(cfg, LoRAGPT)
    for n, p in ref.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)  # (LoRA's B starts at zero)
    ours.load_state_dict(ref.state_dict())
    for m in (ref, ours):
        mark_only_lora_as_trainable(m)
    apply_liger(ours, LigerConfig(packing=True, activation_checkpointing=True))
    x, y = _batch(cfg, lengths=(30, 4, 17, 11))
    _compare(ref, ours, _lora_step_loss, x, y)


def test_packed_output_per_token_losses_and_logits(pack_on_cpu, monkeypatch):
    """What else stock code does with the output: per-token losses (F.cross_entropy, reduction="none") equal stock's,
    padding positions included (0); the real logits, padding positions included, are stock's (an unpacked forward
    computes them, with the materializing warning); a metric's argmax too."""
    cfg = tiny_config("Qwen2.5-0.5B", block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=True))
    x, y = _batch(cfg)
    V = cfg.padded_vocab_size
    per_token_ref = F.cross_entropy(ref(x)[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1), reduction="none")
    per_token = F.cross_entropy(ours(x)[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1), reduction="none")
    assert per_token.shape == per_token_ref.shape
    assert rel_err(per_token, per_token_ref) <= 1e-5
    assert (per_token[y[:, 1:].reshape(-1) == -100] == 0).all()
    with torch.no_grad():
        logits_ref = ref(x)
    out = ours(x)
    state_of(ours).warned.discard("materialize")  # (warned once a model)
    with pytest.warns(UserWarning, match="needs the real"):
        logits = out.softmax(-1)
    assert rel_err(logits, logits_ref.softmax(-1)) <= 1e-5  # every position, the padding's too
    assert torch.equal(out.argmax(-1), logits_ref.argmax(-1))
    sliced = ours(x)[1:, 2:-1]  # basic indexing stays deferred and packed
    assert sliced.rows is not None and sliced.shape == (2, 18, V)
    assert rel_err(chunked_cross_entropy(sliced, y[1:, 3:]), litgpt_ce(ref(x)[1:, 2:-1], y[1:, 3:], chunk_size=0)) <= 1e-5


def test_sample_ending_in_token_zero_falls_back_to_the_padded_batch(pack_on_cpu, monkeypatch):
    """A real sample whose last tokens are id 0 (the collate's pad id) is shortened by packing; its trained
    targets there are found at the loss, which then comes from the padded batch (a warning), equal to stock's."""
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=True))
    x, y = _batch(cfg)
    x[2, 12:14] = 0  # sample 2 (14 tokens) ends in two zeros, whose targets are trained
    y[2, 11:14] = torch.tensor([3, 0, 0])
    state_of(ours).warned.discard("unpacked loss")  # (warned once a model)
    with pytest.warns(UserWarning, match="lit-liger packing: a sample's trailing token id 0"):
        _compare(ref, ours, _full_step_loss, x, y)
    x2, y2 = _batch(cfg, seed=5)  # and the next, ordinary batch packs again, silently
    ref.zero_grad()
    ours.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compare(ref, ours, _lora_step_loss, x2, y2)


def test_packing_on_by_default_and_off_where_it_cannot_apply(pack_on_cpu, monkeypatch):
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    _, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=False))
    x, y = _batch(cfg)
    assert ours(x).rows is None  # off
    apply_liger(ours)
    assert ours(x).rows is not None  # the default: on
    assert ours(x[:1]).rows is None  # one sample: nothing to pack
    with torch.no_grad():
        assert isinstance(ours(x), torch.Tensor)  # no grad: LitGPT's logits
    monkeypatch.setattr(swap_gpt, "sharded_processes", lambda gpt: True)
    assert ours(x).rows is None  # a multi-process strategy: padded
    monkeypatch.setattr(swap_gpt, "sharded_processes", lambda gpt: False)
    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", False)
    assert ours(x).rows is None  # CPU tensors outside the tests: padded


def test_flash_varlen_only_where_it_runs():
    assert not packing.flash_varlen_ok(torch.device("cpu"), torch.bfloat16, 64)
    cuda = torch.device("cuda", 0)
    assert not packing.flash_varlen_ok(cuda, torch.float32, 64)
    assert not packing.flash_varlen_ok(cuda, torch.bfloat16, 512)
    if not torch.cuda.is_available():  # a pre-Ampere GPU has no flash attention
        from lit_liger.kernels import _launch

        def gpu(capability):
            return _launch.DeviceLimits("a GPU", 32, 1024, 100, capability, False)

        _launch._CUDA_LIMITS[0] = gpu((7, 5))
        try:
            assert not packing.flash_varlen_ok(cuda, torch.bfloat16, 64)
            _launch._CUDA_LIMITS[0] = gpu((9, 0))
            assert packing.flash_varlen_ok(cuda, torch.bfloat16, 64) is (torch.version.hip is None)
        finally:
            _launch._CUDA_LIMITS.pop(0, None)


def test_padding_report_with_packing():
    from lit_liger.cli import padding_report

    line = padding_report({"raw_tokens_plus_prompt_template": 600}, {"collated": 1000, "processed": 700, "packed": 800})
    assert line == ("lit-liger: the GPU ran 700 token positions in training for 600 real tokens: 14.3% padding "
                    "(litgpt's collate padded to 1,000, 40.0%; lit-liger packed the batches of 800 of those positions, "
                    "leaving padding out: -300 positions in all)")


def _gpu_packed_pair(name: str, graphs: bool):
    """A 2-layer bf16 ``name`` on the GPU, packed (captured where ``graphs``), and its padded, uncaptured copy."""
    cfg = tiny_config(name).__class__.from_name(name, n_layer=2, block_size=512)
    torch.manual_seed(0)
    with torch.device("cuda"):
        a = GPT(cfg).to(torch.bfloat16)
    a.apply(a._init_weights)
    b = copy.deepcopy(a)
    apply_liger(a, LigerConfig(packing=True, cuda_graphs=graphs))
    apply_liger(b, LigerConfig(packing=False, cuda_graphs=False))
    return cfg, a, b


def _steps_alike(cfg, a, b, lengths) -> list:
    """One micro-batch of ``lengths`` through ``a`` and ``b``, each backward run: their losses within 0.5%. Returns
    the two losses, autograd graphs attached."""
    x, y = _batch(cfg, lengths)
    x, y = x.cuda(), y.cuda()
    losses = []
    for m in (a, b):
        loss = _lora_step_loss(m, x, y)
        loss.backward()
        losses.append(loss)
    assert rel_err(losses[0].detach().float(), losses[1].detach().float()) <= 5e-3, (lengths, losses)
    return losses


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "Qwen3-0.6B"])
@pytest.mark.parametrize("graphs", [False, True])
def test_gpu_packed_steps_equal_padded_steps(name, graphs):
    """On the GPU (flash attention over cumulative lengths; captured per packed length with graphs): several
    micro-batches of different lengths, accumulated, give the padded lit-liger model's loss and gradients."""
    cfg, a, b = _gpu_packed_pair(name, graphs)
    for lengths in [(100, 300, 90, 310), (50, 120), (100, 300, 90, 310)]:
        _steps_alike(cfg, a, b, lengths)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert rel_err(p.grad, q.grad) <= 3e-2, n
    if graphs:
        from lit_liger.runtime.graphs import runner_for

        assert runner_for(a).captures == 2 and runner_for(a).replays == 3


@pytest.mark.gpu
@pytest.mark.eager_first
def test_gpu_first_micro_batch_uncaptured_then_captures_without_warm_up_equal_padded_steps():
    """``graphs.EAGER_FIRST`` on a real model (full training, packed): the first micro-batch runs uncaptured and its
    ``.grad`` tensors become the graphs' gradient buffers; the packed lengths after it are captured with no warm-up
    pass; the accumulated loss and gradients equal the padded uncaptured model's. Each micro-batch's loss is held past
    the next one's forward (a capture failed when the uncaptured micro-batch's autograd graph outlived its backward)."""
    from lit_liger.runtime.graphs import runner_for

    cfg, a, b = _gpu_packed_pair("Llama-3.2-1B", True)
    before = dict(state_of(a).captures)
    first = None
    kept = []  # (each loss, with its autograd graph, held past the next forward, as litgpt's loop holds its last)
    for i, lengths in enumerate([(100, 300, 90, 310), (50, 120), (100, 300, 90, 310), (50, 120)]):
        kept += _steps_alike(cfg, a, b, lengths)
        if i == 0:
            assert runner_for(a).captures == 0
            first = {id(p): p.grad for p in a.parameters() if p.grad is not None}
    runner = runner_for(a)
    assert runner.disabled is None, runner.error
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert rel_err(p.grad, q.grad) <= 3e-2, n
    body = [p for n, p in a.named_parameters() if n.startswith("transformer.h.")]
    assert body and all(runner.buffers[id(p)] is first[id(p)] is p.grad for p in body)  # (one copy of each gradient)
    stats = {k: state_of(a).captures[k] - before[k] for k in before}
    assert (stats["eager_first"], stats["captures"], stats["replays"], stats["warmed"]) == (1, 2, 3, 0), stats


# -- plans made by the data loader (lit-liger's CLI: ``LigerCollate`` on the host, ``register`` after the move) --------
def _ready(x, y, bucketed=False, max_position=64):
    entry = packing.host_plan(x, y, packing_bucket if bucketed else None)
    batch = {"input_ids": x, "labels": y, packing.BATCH_KEY: entry}
    packing.register(batch)
    assert packing.BATCH_KEY not in batch  # taken out: the training loop sees litgpt's keys only
    return packing.ready_plan(x, bucketed, max_position)


def packing_bucket(n):
    from lit_liger.swap.buckets import packed_bucket_length

    return packed_bucket_length(n)


@pytest.mark.parametrize("bucketed", [False, True])
def test_host_plan_equals_the_forward_plan(bucketed):
    """The data loader's plan (no device sync) is the forward's own plan, field by field."""
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    x, y = _batch(cfg)
    ours = _ready(x, y, bucketed)
    ref = packing.plan(x, packing_bucket if bucketed else None, 64)
    assert ours is not None and ours.check is not None
    for field in ("idx", "positions", "rows"):
        assert torch.equal(getattr(ours, field), getattr(ref, field)), field
    assert torch.equal(ours.pack.cu_seqlens, ref.pack.cu_seqlens) and ours.pack.cu_seqlens.dtype == torch.int32
    assert (ours.pack.max_len, ours.pack.bounds, ours.real) == (ref.pack.max_len, ref.pack.bounds, ref.real)
    assert ours.idx.shape[1] == (packing_bucket(sum(LENGTHS)) if bucketed else sum(LENGTHS))


def test_ready_plan_only_for_the_registered_unchanged_tensor():
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    x, y = _batch(cfg)
    assert _ready(x, y) is not None
    assert packing.ready_plan(x.clone(), False, 64) is None  # the same values in another tensor: not this batch
    assert packing.ready_plan(x, True, 64) is None  # laid out for another bucket ladder
    assert packing.ready_plan(x, False, x.shape[1] - 1) is None  # ... or positions past the RoPE cache
    x[0, 0] = 7  # written to after the loader planned it
    assert packing.ready_plan(x, False, 64) is None
    packing.register({"input_ids": x})  # the next batch, unplanned, replaces it
    assert packing.ready_plan(x, False, 64) is None
    assert packing.host_plan(x[:1], y[:1], None) is None  # one row: nothing to pack
    assert packing.host_plan(torch.ones(2, 4, dtype=torch.long), None, None) is None  # no padding


def test_left_out_verdict_answers_only_for_the_labels_it_saw():
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    x, y = _batch(cfg)
    plan = _ready(x, y)
    rows, check = plan.rows, plan.check
    assert check.verdict(y, rows, rows, -100) is True  # no trained label at a left-out position
    assert check.verdict(y[..., 1:], rows[..., :-1], rows, -100) is True  # litgpt's shift
    assert check.verdict(y[..., 1:], rows[..., 1:], rows, -100) is None  # another alignment: the device checks
    assert check.verdict(y.clone(), rows, rows, -100) is None  # not the labels it saw
    assert check.verdict(y, rows, rows, 0) is None  # another ignore_index
    x, y = _batch(cfg)
    x[2, 12:14] = 0  # sample 2 ends in two zeros whose targets are trained (see the test above)
    y[2, 11:14] = torch.tensor([3, 0, 0])
    plan = _ready(x, y)
    assert plan.check.verdict(y[..., 1:], plan.rows[..., :-1], plan.rows, -100) is False
    assert plan.check.verdict(y, plan.rows, plan.rows, -100) is False
    y[0, 0] = 5  # written to since: no verdict
    assert plan.check.verdict(y, plan.rows, plan.rows, -100) is None


def _cli_lora_step_loss(model, x, y):
    return _lora_step_loss(model, x, y, ce=chunked_cross_entropy)


def _cli_full_step_loss(model, x, y):
    return _full_step_loss(model, x, y, ce=chunked_cross_entropy)


@pytest.mark.parametrize("loss_fn", [_cli_lora_step_loss, _cli_full_step_loss])
def test_loader_planned_steps_equal_stock_without_a_device_check(pack_on_cpu, monkeypatch, loss_fn):
    """A batch planned by the data loader trains as stock LitGPT on the padded batch; its forward plans nothing and
    its loss checks the left-out targets from the loader's finding, not on the device. (litgpt's own
    ``chunked_cross_entropy`` flattens the targets into a copy, whose left-out positions the device checks: the
    other tests here.)"""
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=True))
    x, y = _batch(cfg)
    assert _ready(x, y, bucketed=True, max_position=ours.cos.size(0)) is not None
    monkeypatch.setattr(packing, "plan", lambda *a: pytest.fail("the forward planned a batch the loader planned"))
    before = dict(state_of(ours).loss_checks)
    _compare(ref, ours, loss_fn, x, y)
    assert state_of(ours).loss_checks["host"] == before["host"] + 1
    assert state_of(ours).loss_checks["device"] == before["device"]


def test_loader_finding_a_trained_left_out_target_falls_back(pack_on_cpu, monkeypatch):
    cfg = tiny_config("Llama-3.2-1B", block_size=64)
    ref, ours = _pair(cfg)
    apply_liger(ours, LigerConfig(packing=True))
    x, y = _batch(cfg)
    x[2, 12:14] = 0
    y[2, 11:14] = torch.tensor([3, 0, 0])
    assert _ready(x, y, bucketed=True, max_position=ours.cos.size(0)) is not None
    state_of(ours).warned.discard("unpacked loss")  # (warned once a model)
    before = dict(state_of(ours).loss_checks)
    with pytest.warns(UserWarning, match="lit-liger packing: a sample's trailing token id 0"):
        _compare(ref, ours, _cli_lora_step_loss, x, y)
    assert state_of(ours).loss_checks["device"] == before["device"]
