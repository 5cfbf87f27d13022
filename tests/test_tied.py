"""LigerConfig.tied_weights: one copy of a frozen lm_head equal to the frozen embedding (lit_liger/swap/tied.py)."""

import copy
import io

import pytest
import torch
from litgpt.lora import GPT as LoRAGPT
from litgpt.lora import Config as LoRAConfig
from litgpt.lora import mark_only_lora_as_trainable
from test_adapter import tiny_config

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy, remove_liger
from lit_liger.swap import tied
from lit_liger.swap.state import state_of


def _lora_pair(tie=True, **extra):
    """Stock and swapped LitGPT LoRA models with the same weights; ``tie``: lm_head = wte, as litgpt's conversion
    of a tied-embedding Hugging Face checkpoint writes them."""
    cfg = tiny_config("Llama-3.2-1B", LoRAConfig, lora_r=4, lora_alpha=8, lora_query=True, lora_value=True, **extra)
    torch.manual_seed(0)
    ref = LoRAGPT(cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.05)
        if tie:
            ref.lm_head.linear.weight.copy_(ref.transformer.wte.weight)
    ours = copy.deepcopy(ref)
    for m in (ref, ours):
        mark_only_lora_as_trainable(m)
    return cfg, ref, ours


def _shared(m) -> bool:
    return m.lm_head.linear.weight.data_ptr() == m.transformer.wte.weight.data_ptr()


def _step(m, x):
    loss = chunked_cross_entropy(m(x), x)
    loss.backward()
    return loss.detach()


def test_frozen_equal_head_shares_the_embedding_and_trains_the_same():
    cfg, ref, ours = _lora_pair()
    said = []
    report = apply_liger(ours)
    state_of(ours).on_share.append(said.append)  # (the model's own: made by apply_liger)
    assert "tied_weights" in str(report)
    assert not _shared(ours)  # nothing happens before a forward (a checkpoint is loaded after set-up)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    loss = _step(ours, x)
    assert _shared(ours) and len(said) == 1 and "one copy kept" in said[0]
    apply_liger(ref, LigerConfig(tied_weights=False))  # the same kernels, two copies: bit for bit the same step
    assert torch.equal(loss, _step(ref, x))
    assert not _shared(ref)
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), n
    assert list(ours.state_dict()) == list(ref.state_dict())  # the same keys, both matrices still there
    # a no-grad forward (validation) and a second step keep the share and do not compare again
    calls = []
    real_equal = torch.equal
    try:
        torch.equal = lambda a, b: calls.append(1) or real_equal(a, b)
        with torch.no_grad():
            ours(x)
        _step(ours, x)
    finally:
        torch.equal = real_equal
    assert _shared(ours) and not calls


def test_different_trained_or_switched_off_heads_stay_separate():
    # random init (the head differs from the embedding): compared once, not on every forward
    cfg, _, ours = _lora_pair(tie=False)
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    _step(ours, x)
    assert not _shared(ours)
    calls = []
    real_equal = tied._bit_equal
    try:
        tied._bit_equal = lambda a, b: calls.append(1) or real_equal(a, b)
        _step(ours, x)
        ours.lm_head.linear.weight.data = ours.lm_head.linear.weight.data.clone()  # a new state: compared again
        _step(ours, x)
    finally:
        tied._bit_equal = real_equal
    assert calls == [1]
    # equal but trained (full fine-tuning): separate
    cfg, _, ours = _lora_pair()
    for p in ours.parameters():
        p.requires_grad_(True)
    apply_liger(ours)
    _step(ours, x)
    assert not _shared(ours)
    # switched off
    cfg, _, ours = _lora_pair()
    apply_liger(ours, LigerConfig(tied_weights=False))
    _step(ours, x)
    assert not _shared(ours)
    # parameters that are views into one flat buffer (FSDP's original parameters): separate
    cfg, _, ours = _lora_pair()
    head, emb = ours.lm_head.linear.weight, ours.transformer.wte.weight
    flat = torch.cat([head.detach().flatten(), emb.detach().flatten()])
    head.data, emb.data = flat[:head.numel()].view_as(head), flat[head.numel():].view_as(emb)
    apply_liger(ours)
    _step(ours, x)
    assert not _shared(ours)
    # a LoRA update on the head: LitGPT's own layer (its merge would write into the shared weight in place) and a
    # merged one are not candidates; the swapped layer is (tests/test_lora_head.py: its merge takes its own copy first)
    cfg, _, ours = _lora_pair(lora_head=True)
    assert tied.head_weight(ours) is None
    ours.lm_head.merge()
    assert "tied_weights" not in str(apply_liger(ours))
    _step(ours, x)
    assert not _shared(ours)


def test_comparison_is_bit_for_bit_a_block_of_rows_at_a_time(monkeypatch):
    """``-0.0`` and ``0.0`` (equal to ``torch.equal``) are different bits: no sharing. With blocks of one row, a
    difference in the last row or the first is found, and equal matrices compare equal."""
    monkeypatch.setattr(tied, "COMPARE_BYTES", 1)
    a = torch.randn(7, 5).to(torch.bfloat16)
    assert tied._bit_equal(a, a.clone())
    for r in (0, 6):
        b = a.clone()
        b[r, 3] = b[r, 3] + 1
        assert not tied._bit_equal(a, b)
    z = torch.zeros(7, 5)
    assert torch.equal(z, -z) and not tied._bit_equal(z, -z)
    cfg, _, ours = _lora_pair()
    with torch.no_grad():
        ours.lm_head.linear.weight[3, 2] = 0.0
        ours.transformer.wte.weight[3, 2] = -0.0
    apply_liger(ours)
    _step(ours, torch.randint(0, cfg.vocab_size, (2, 8)))
    assert not _shared(ours)


def test_unfreezing_the_head_gives_it_its_own_copy_first():
    cfg, _, ours = _lora_pair()
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    _step(ours, x)
    assert _shared(ours)
    wte_before = ours.transformer.wte.weight.detach().clone()
    head = ours.lm_head.linear.weight
    head.requires_grad_(True)
    opt = torch.optim.SGD([head], lr=1.0)
    _step(ours, x)  # the forward gives the head its own copy before its gradient and the step
    assert not _shared(ours) and head.grad is not None
    opt.step()
    assert torch.equal(ours.transformer.wte.weight, wte_before)  # the embedding did not move with the head
    assert not torch.equal(head, wte_before)


@pytest.mark.parametrize("into", ["model", "head", "embedding"])
def test_load_state_dict_after_sharing_loads_both_matrices(into):
    cfg, _, ours = _lora_pair()
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    _step(ours, x)
    assert _shared(ours)
    sd = {k: v.clone() for k, v in ours.state_dict().items()}
    sd["lm_head.linear.weight"] = torch.randn_like(sd["lm_head.linear.weight"])  # an untied checkpoint
    sd["transformer.wte.weight"] = torch.randn_like(sd["transformer.wte.weight"])
    if into == "model":
        ours.load_state_dict(sd)
    elif into == "head":
        ours.lm_head.load_state_dict({"linear.weight": sd["lm_head.linear.weight"]}, strict=False)
    else:
        ours.transformer.wte.load_state_dict({"weight": sd["transformer.wte.weight"]})
    head, emb = ours.lm_head.linear.weight, ours.transformer.wte.weight
    assert not _shared(ours)
    if into in ("model", "head"):
        assert torch.equal(head, sd["lm_head.linear.weight"])
    if into in ("model", "embedding"):
        assert torch.equal(emb, sd["transformer.wte.weight"])
    if into == "head":
        assert not torch.equal(emb, head)  # the embedding kept its values
    _step(ours, x)
    assert not _shared(ours)  # no longer equal


def test_copies_pickles_and_removal():
    cfg, ref, ours = _lora_pair(lora_dropout=0.1)  # (nn.Dropout: with 0, litgpt's identity lambda does not pickle)
    ours.eval()  # (no dropout masks: the copies' steps are compared with the original's)
    apply_liger(ours)
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    _step(ours, x)
    assert _shared(ours)
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    dup = copy.deepcopy(ours)
    for m in (loaded, dup):
        m.zero_grad(set_to_none=True)
        assert torch.equal(_step(m, x), _step(ours, x))
        # still guarded: a load into the copy's head leaves its embedding alone
        emb = m.transformer.wte.weight.detach().clone()
        m.lm_head.linear.load_state_dict({"weight": torch.zeros_like(emb)})
        assert torch.equal(m.transformer.wte.weight, emb)
    remove_liger(ours)
    assert not _shared(ours) and torch.equal(ours.lm_head.linear.weight, ref.lm_head.linear.weight)
