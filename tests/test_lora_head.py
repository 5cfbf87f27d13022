"""A LoRA lm_head (LitGPT's ``LoRALinear`` with r > 0, ``lora_head: true``) inside the fused linear cross-entropy:
the kernel's LoRA inputs against plain PyTorch, and a swapped ``litgpt.lora.GPT`` against stock LitGPT."""

import copy
import importlib

import pytest
import torch
import torch.nn.functional as F
from helpers import TOL, assert_same_grads, rel_err

from lit_liger.kernels import fused_linear_cross_entropy
from lit_liger.swap import gpt as swap_gpt

flce = importlib.import_module("lit_liger.kernels.fused_linear_cross_entropy")

N, H, V, R = 37, 72, 1000, 3  # odd sizes: H not a power of two, V not a multiple of any block or chunk
IGNORE = -100
CHUNK = {"fast": 16, "lean": 300}  # chunks that do not divide the rows ("fast") / the vocabulary ("lean")


def _inputs(device, dtype, *, bias=False, dropout=False, frozen_w=True, seed=0, shape=(N,)):
    g = torch.Generator().manual_seed(seed)

    def leaf(t, grad=True):
        return t.to(device=device, dtype=dtype).requires_grad_(grad)

    x = leaf(torch.randn(*shape, H, generator=g))
    w = leaf(torch.randn(V, H, generator=g) / H**0.5 * 2, not frozen_w)
    b = leaf(torch.randn(V, generator=g) * 0.5, not frozen_w) if bias else None
    a = leaf(torch.randn(R, H, generator=g) / H**0.5)
    lb = leaf(torch.randn(V, R, generator=g) * 0.7)  # non-zero B: the update changes the logits
    xl = None
    if dropout:  # an independent LoRA-branch input (the dropout's output), differentiable
        keep = (torch.rand(*shape, H, generator=g) > 0.3).to(dtype) / 0.7
        xl = leaf(torch.randn(*shape, H, generator=g) * keep)
    t = torch.randint(0, V, shape, generator=g)
    t[torch.rand(shape, generator=g) < 0.25] = IGNORE
    return x, w, b, a, lb, xl, t.to(device)


def _torch_loss(x, w, b, a, lb, xl, t, s, *, reduction="mean", softcap=None, dtype=torch.float64):
    """Plain PyTorch in ``dtype``: LitGPT's LoRALinear forward, then cross-entropy in fp32/fp64."""
    leaves = [v.detach().to(dtype).requires_grad_() if v is not None else None for v in (x, w, b, a, lb, xl)]
    x_, w_, b_, a_, lb_, xl_ = leaves
    xl_ = x_ if xl_ is None else xl_
    logits = F.linear(x_, w_, b_) + (xl_ @ a_.t() @ lb_.t()) * s  # (..., V)
    logits = logits.reshape(-1, V).to(torch.float64)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    loss = F.cross_entropy(logits, t.reshape(-1), ignore_index=IGNORE, reduction=reduction)
    return (loss.reshape(t.shape) if reduction == "none" else loss), leaves


def _check(device, dtype, mode, *, bias=False, dropout=False, frozen_w=True, reduction="mean", softcap=None, s=2.5,
           shape=(N,), chunk=True):
    x, w, b, a, lb, xl, t = _inputs(device, dtype, bias=bias, dropout=dropout, frozen_w=frozen_w, shape=shape)
    loss = fused_linear_cross_entropy(x, w, t, b, reduction=reduction, softcap=softcap, mode=mode,
                                      chunk_size=CHUNK[mode] if chunk else None, lora_a=a, lora_b=lb, lora_scale=s,
                                      x_lora=xl)
    ref, leaves = _torch_loss(x, w, b, a, lb, xl, t, s, reduction=reduction, softcap=softcap)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    assert rel_err(loss, ref) <= (1e-5 if dtype == torch.float32 else 1e-2)
    go = torch.randn(loss.shape, generator=torch.Generator().manual_seed(7)).to(device)
    mine = {n: v for n, v in zip(("x", "w", "b", "A", "B", "x_lora"), (x, w, b, a, lb, xl))
            if v is not None and v.requires_grad}
    refs = {n: v for n, v in zip(("x", "w", "b", "A", "B", "x_lora"), leaves) if n in mine}
    grads = torch.autograd.grad(loss, list(mine.values()), go)
    grads_ref = torch.autograd.grad(ref, list(refs.values()), go.double())
    for (name, v), gm, gr in zip(mine.items(), grads, grads_ref):
        assert gm.dtype == v.dtype and gm.shape == v.shape, name
        assert rel_err(gm, gr) <= TOL[dtype], (name, rel_err(gm, gr))
    return loss


@pytest.mark.parametrize("mode", ["fast", "lean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_lora_matches_torch(device, dtype, mode):
    # frozen head (LoRA's case): gradients of x, A and B, the same pass; ignored rows, softcap
    _check(device, dtype, mode, softcap=5.0)


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_kernel_lora_with_dropout_input_bias_and_trained_weight(device, mode):
    # x_lora separate from x (dropout): its own gradient; a trained weight and bias get theirs too
    _check(device, torch.float32, mode, bias=True, dropout=True, frozen_w=False)


@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_kernel_lora_reductions(device, mode, reduction):
    _check(device, torch.float32, mode, reduction=reduction, dropout=reduction == "none", bias=True,
           shape=(3, 13))


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_kernel_lora_default_chunks_bf16_dropout(device, mode):
    _check(device, torch.bfloat16, mode, dropout=True, softcap=30.0, chunk=False)


def test_kernel_lora_no_rows_and_no_grad(device):
    x, w, b, a, lb, xl, t = _inputs(device, torch.float32)
    for mode in ("fast", "lean"):
        loss = fused_linear_cross_entropy(x[:0], w, t[:0], lora_a=a, lora_b=lb, lora_scale=2.0, mode=mode)
        loss.backward()
        assert loss.item() == 0.0 and float(a.grad.abs().sum()) == 0.0 and float(lb.grad.abs().sum()) == 0.0
        a.grad = lb.grad = None
        with torch.no_grad():
            loss = fused_linear_cross_entropy(x, w, t, lora_a=a, lora_b=lb, lora_scale=2.0, mode=mode)
        ref, _ = _torch_loss(x, w, None, a, lb, None, t, 2.0)
        assert rel_err(loss, ref) <= 1e-5


def test_kernel_lora_zero_b_is_the_plain_head(device):
    # LitGPT initializes B to zero: the loss is the plain head's, and A gets no gradient, B one
    x, w, _, a, lb, _, t = _inputs(device, torch.float32)
    zero_b = torch.zeros_like(lb).requires_grad_()
    loss = fused_linear_cross_entropy(x, w, t, lora_a=a, lora_b=zero_b, lora_scale=4.0, chunk_size=16)
    plain = fused_linear_cross_entropy(x.detach(), w, t, chunk_size=16)
    assert rel_err(loss, plain) <= 1e-6
    loss.backward()
    assert float(a.grad.abs().max()) == 0.0 and float(zero_b.grad.abs().max()) > 0


def test_kernel_lora_checks(device):
    x, w, _, a, lb, xl, t = _inputs(device, torch.float32, dropout=True)
    f = fused_linear_cross_entropy
    with pytest.raises(ValueError, match="both lora_a"):
        f(x, w, t, lora_a=a)
    with pytest.raises(ValueError, match="x_lora"):
        f(x, w, t, x_lora=xl)
    with pytest.raises(ValueError, match=r"lora_a must have shape \(r, H\)"):
        f(x, w, t, lora_a=a[:, :-1], lora_b=lb)
    with pytest.raises(ValueError, match=r"lora_b must have shape \(V, r\)"):
        f(x, w, t, lora_a=a, lora_b=lb[:, :-1])
    with pytest.raises(ValueError, match="x_lora"):
        f(x, w, t, lora_a=a, lora_b=lb, x_lora=xl[:-1])
    with pytest.raises(TypeError, match="dtype"):
        f(x, w, t, lora_a=a.double().float().half(), lora_b=lb)
    with pytest.raises(ValueError, match="lora_scale"):
        f(x, w, t, lora_a=a, lora_b=lb, lora_scale=float("nan"))
    if device == "cpu":
        with pytest.raises(ValueError, match="device"):
            f(x, w, t, lora_a=a.detach().to("meta"), lora_b=lb)


def test_kernel_lora_meta_and_ops():
    x = torch.randn(10, H, device="meta")
    w = torch.randn(V, H, device="meta")
    a = torch.randn(R, H, device="meta", requires_grad=True)
    lb = torch.randn(V, R, device="meta", requires_grad=True)
    t = torch.zeros(10, dtype=torch.long, device="meta")
    assert fused_linear_cross_entropy(x, w, t, lora_a=a, lora_b=lb, lora_scale=2.0).shape == ()
    out = torch.ops.lit_liger.flce_fwd(x, w, t, None, None, -1, IGNORE, "mean", 0.0, 0.0, 0.0, "fast", 0,
                                       True, False, False, a, lb, x, 2.0, True, True, True)
    assert [tuple(o.shape) for o in out] == [(), (10, H), (0,), (0,), (R, H), (V, R), (10, H)]
    out = torch.ops.lit_liger.flce_bwd_rows(torch.ones(10, device="meta"), x, w, t, None, IGNORE, 0.0, 0.0, 0.0,
                                            "lean", 0, True, False, False, a, lb, None, 2.0, True, True, False)
    assert [tuple(o.shape) for o in out] == [(10, H), (0,), (0,), (R, H), (V, R), (0,)]


def test_frozen_head_weight_gets_no_gradient_gemm(device, monkeypatch):
    # the frozen (V, H) base: no dW GEMM in either mode; the LoRA matrices get theirs from the same pass
    calls = []
    real = flce._grad_weight_gemm
    monkeypatch.setattr(flce, "_grad_weight_gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, w, _, a, lb, _, t = _inputs(device, torch.float32)
    for mode in ("fast", "lean"):
        fused_linear_cross_entropy(x, w, t, lora_a=a, lora_b=lb, lora_scale=2.0, mode=mode,
                                   chunk_size=CHUNK[mode]).backward()
    assert not calls and w.grad is None and a.grad is not None and lb.grad is not None


# ----------------------------------------------------------------------------------------------
# A swapped litgpt.lora.GPT with lora_head=True against stock LitGPT
# ----------------------------------------------------------------------------------------------
def _gpt_pair(name="Llama-3.2-1B", dropout=0.0, dtype=torch.float32):
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from test_adapter import _randomize, tiny_config

    cfg = tiny_config(name, Config, lora_r=4, lora_alpha=8, lora_dropout=dropout, lora_query=True,
                      lora_value=True, lora_head=True)
    torch.manual_seed(0)
    stock = GPT(cfg)
    _randomize(stock)  # lora_B included: a trained, non-zero update (LitGPT starts it at zero)
    mark_only_lora_as_trainable(stock)
    stock = stock.to(dtype)
    assert stock.lm_head.r == 4 and stock.lm_head.lora_B.detach().abs().min().item() > 0
    return cfg, stock, copy.deepcopy(stock)


def _batch(cfg, B=2, T=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y[0, :4] = IGNORE
    return x, y


def _step(model, x, y, loss_fn, seed=3):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks in stock and swapped models (drawn in the same order)
    out = model(x)
    loss = loss_fn(out[..., :-1, :], y[..., 1:])
    loss.backward()
    return out, loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def _fused_on(report) -> None:
    text = str(report)
    assert "fused loss off" not in text, text
    kinds = [k for _, _, k in report.swapped]
    assert any(k.startswith("fused linear cross-entropy") and "LoRA head r=4" in k for k in kinds), kinds


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b"])  # gemma-2: final logit softcapping
def test_gpt_lora_head_matches_stock(name, dropout):
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger import apply_liger, chunked_cross_entropy
    from lit_liger.swap.loss import LigerLogits

    cfg, stock, ours = _gpt_pair(name, dropout)
    _fused_on(apply_liger(ours))
    x, y = _batch(cfg)
    logits_ref, loss_ref, grads_ref = _step(stock, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    assert "lm_head.lora_A" in grads_ref and "lm_head.lora_B" in grads_ref
    # lit-liger's loss, stock code's own (chunk_size 0: reshape; 5: split into row chunks, per-token losses joined)
    for fn in (chunked_cross_entropy, lambda o, t: litgpt_ce(o, t, chunk_size=0),
               lambda o, t: litgpt_ce(o, t, chunk_size=5)):
        out, loss, grads = _step(ours, x, y, fn)
        assert isinstance(out, LigerLogits)
        assert rel_err(loss, loss_ref) <= 1e-5
        assert grads.keys() == grads_ref.keys()
        for n, g in grads.items():
            assert rel_err(g, grads_ref[n]) <= 1e-5, (n, rel_err(g, grads_ref[n]))
        # the real logits of that very output (its dropout mask included) are stock's
        assert rel_err(out.real(), logits_ref) <= 1e-5
    # the head's update matters (the comparisons above would not notice it dropped otherwise)
    without = copy.deepcopy(stock)
    with torch.no_grad():
        without.lm_head.lora_B.zero_()
        torch.manual_seed(3)
        assert rel_err(without(x), logits_ref) > 1e-3


def test_gpt_lora_head_under_fabric_bf16_true_keeps_the_models_tensors():
    # Fabric's bf16-true precision casts the output's floating fields to float32: the swapped output keeps the model's
    # bf16 hidden states and dropout input (no float32 copies living through the backward), says float32 as its dtype,
    # and gives the loss and gradients of the same model called directly
    import lightning as L

    from lit_liger import apply_liger, chunked_cross_entropy
    from lit_liger.swap.loss import LigerLogits

    cfg, _, ours = _gpt_pair(dropout=0.3, dtype=torch.bfloat16)
    apply_liger(ours)
    direct = copy.deepcopy(ours)
    wrapped = L.Fabric(accelerator="cpu", devices=1, precision="bf16-true").setup_module(ours)
    x, y = _batch(cfg)
    out, loss, grads = _step(wrapped, x, y, chunked_cross_entropy)
    assert isinstance(out, LigerLogits) and out.dtype == torch.float32
    assert out.hidden.dtype == out.x_lora.dtype == torch.bfloat16 and out.hidden.shape == out.x_lora.shape
    ref, loss_ref, grads_ref = _step(direct, x, y, chunked_cross_entropy)
    assert ref.dtype == torch.bfloat16 and torch.equal(out.x_lora, ref.x_lora)  # the same dropout mask was drawn
    assert loss.dtype == torch.float32 and torch.equal(loss, loss_ref)
    grads = {n.removeprefix("_forward_module."): g for n, g in grads.items()}
    assert grads.keys() == grads_ref.keys() and all(torch.equal(g, grads_ref[n]) for n, g in grads.items())
    with torch.no_grad():
        assert out.real().dtype == torch.float32 and torch.equal(out.real(), ref.real().float())
    # a field set to a tensor of the same dtype (not a cast) is taken as it is
    other = torch.zeros_like(out.hidden)
    out.hidden = other
    assert out.hidden is other


def test_gpt_lora_head_per_token_losses_of_row_chunks():
    # dropout > 0: every view of the output (reshape, split) takes the same view of the LoRA branch's input
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger import apply_liger

    cfg, stock, ours = _gpt_pair(dropout=0.3)
    apply_liger(ours)
    x, y = _batch(cfg)

    def per_token(o, t):
        parts = o.reshape(-1, o.size(-1)).split(7)
        tparts = t.reshape(-1).split(7)
        losses = [F.cross_entropy(p, q, ignore_index=IGNORE, reduction="none") for p, q in zip(parts, tparts)]
        return sum(loss.float().sum() for loss in losses) / (t != IGNORE).sum()

    _, loss_ref, grads_ref = _step(stock, x, y, per_token)
    _, loss, grads = _step(ours, x, y, per_token)
    assert rel_err(loss, loss_ref) <= 1e-5
    for n, g in grads.items():
        assert rel_err(g, grads_ref[n]) <= 1e-5, n
    _, loss_ref2, _ = _step(stock, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    assert rel_err(loss_ref, loss_ref2) <= 1e-5  # (the same loss, another pattern)


def test_gpt_lora_head_no_grad_kv_cache_and_materialize():
    from lit_liger import apply_liger
    from lit_liger.swap.loss import LigerLogits

    cfg, stock, ours = _gpt_pair(dropout=0.3)
    apply_liger(ours)
    x, _ = _batch(cfg)
    stock.eval(), ours.eval()  # (no dropout: a no-grad call is comparable without seeding)
    with torch.no_grad():
        ref = stock(x)
        out = ours(x)
        assert isinstance(out, torch.Tensor) and not isinstance(out, LigerLogits)
        assert rel_err(out, ref) <= 1e-5
        for m in (stock, ours):
            m.set_kv_cache(batch_size=2)
        pos = torch.arange(0, 5)
        ref_kv = stock(x[:, :5], input_pos=pos)
        out_kv = ours(x[:, :5], input_pos=pos)
        assert isinstance(out_kv, torch.Tensor) and rel_err(out_kv, ref_kv) <= 1e-5
    for m in (stock, ours):
        m.clear_kv_cache()
    # training output: materialize() (computed each call) and arithmetic on it give stock's logits, its dropout too
    stock.train(), ours.train()
    torch.manual_seed(4)
    ref = stock(x)
    torch.manual_seed(4)
    out = ours(x)
    assert isinstance(out, LigerLogits) and out.x_lora is not None
    assert rel_err(out.materialize(), ref) <= 1e-5
    with pytest.warns(UserWarning, match="real"):
        assert rel_err(out.softmax(-1), ref.softmax(-1)) <= 1e-5


def _set_dropout(model, p):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_gpt_lora_head_buckets_and_packing_keep_the_dropout_input_aligned(mode, monkeypatch):
    # padded (seq_buckets) and packed outputs: the loss and the real logits of one output read the same x_lora rows
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger import LigerConfig, apply_liger

    from lit_liger.swap import adapter

    monkeypatch.setattr(swap_gpt, "_BUCKETS_ON_CPU", True)
    cfg, stock, ours = _gpt_pair(dropout=0.3)
    apply_liger(ours, LigerConfig(flce_mode=mode))
    x, y = _batch(cfg, T=13)
    # no dropout: stock's numbers (a padded batch draws other masks than stock's)
    _set_dropout(stock, 0.0), _set_dropout(ours, 0.0)
    _, loss_ref, grads_ref = _step(stock, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    out, loss, grads = _step(ours, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    assert out.t1 is not None and out.hidden.shape[1] > 13  # padded to a bucket
    assert rel_err(loss, loss_ref) <= 1e-5
    for n in ("lm_head.lora_A", "lm_head.lora_B"):
        assert rel_err(grads[n], grads_ref[n]) <= 1e-5, n
    # packed (right padding left out), no dropout: stock's numbers on the padded batch
    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", True)
    xp, yp = x.clone(), y.clone()
    xp[1, 7:], yp[1, 6:] = 0, IGNORE
    _, loss_ref, grads_ref = _step(stock, xp, yp, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    out, loss, grads = _step(ours, xp, yp, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    assert out.rows is not None and rel_err(loss, loss_ref) <= 1e-5
    for n in ("lm_head.lora_A", "lm_head.lora_B"):
        assert rel_err(grads[n], grads_ref[n]) <= 1e-5, n
    # dropout: the fused loss equals the loss of the output's own real logits, gradients included
    _set_dropout(ours, 0.3)
    for packed in (False, True):
        monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", packed)
        x2 = x.clone()
        if packed:
            x2[1, 7:] = 0  # right padding (the collate's id 0), ignored targets
        y2 = y.clone()
        y2[1, 6:] = IGNORE
        torch.manual_seed(5)
        out = ours(x2)
        assert out.x_lora is not None and (out.rows is not None) == packed
        leaves = [out.hidden, out.x_lora, ours.lm_head.lora_A, ours.lm_head.lora_B]
        loss = litgpt_ce(out[..., :-1, :], y2[..., 1:], chunk_size=0)
        fused = torch.autograd.grad(loss, leaves, retain_graph=True)  # (the head's part of the graph only)
        if packed:  # the packed output's real logits come from its unpadded twin (another forward, another draw)
            continue
        loss_real = litgpt_ce(out.real()[..., :-1, :], y2[..., 1:], chunk_size=0)
        assert rel_err(loss, loss_real) <= 1e-5
        for name, gf, gr in zip(("hidden", "x_lora", "A", "B"), fused, torch.autograd.grad(loss_real, leaves)):
            assert rel_err(gf, gr) <= 1e-5, name


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_qlora_4bit_lora_head_matches_stock(dropout):
    # QLoRA: the head's base is a bitsandbytes 4-bit layer (decoded for the fused loss), its LoRA update joins it
    pytest.importorskip("bitsandbytes")
    from litgpt.utils import chunked_cross_entropy as litgpt_ce
    from test_qlora import _qlora_pair

    from lit_liger import apply_liger, chunked_cross_entropy
    from lit_liger.swap.quant import is_4bit

    cfg, stock, ours = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True, lora_value=True, lora_head=True,
                                   lora_dropout=dropout)
    assert is_4bit(ours.lm_head.linear.weight) and ours.lm_head.r == 4
    _fused_on(apply_liger(ours))
    x, y = _batch(cfg)
    _, loss_ref, grads_ref = _step(stock, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    out, loss, grads = _step(ours, x, y, chunked_cross_entropy)
    assert rel_err(loss, loss_ref) <= 1e-5
    assert "lm_head.lora_A" in grads and grads.keys() == grads_ref.keys()
    for n, g in grads.items():
        assert rel_err(g, grads_ref[n]) <= 1e-4, (n, rel_err(g, grads_ref[n]))
    assert ours.lm_head.linear.weight.grad is None and is_4bit(ours.lm_head.linear.weight)


def test_int8_lora_head_stays_stock_without_a_crash():
    # a bitsandbytes int8 base under the LoRA head: the fused loss cannot read it (int8 activations too); the report
    # says so in one line and the model keeps returning LitGPT's logits
    bnb = pytest.importorskip("bitsandbytes")
    from test_qlora import _qlora_pair

    from lit_liger import apply_liger
    from lit_liger.swap.adapter import is_swapped
    from lit_liger.swap.gpt import _int8_head

    cfg, _, ours = _qlora_pair("Llama-3.2-1B", "nf4", lora_query=True, lora_head=True)
    old = ours.lm_head.linear
    q = bnb.nn.Linear8bitLt(old.in_features, old.out_features, bias=False, has_fp16_weights=False)
    q.weight = bnb.nn.Int8Params(torch.randn(old.out_features, old.in_features), requires_grad=False,
                                 has_fp16_weights=False)
    ours.lm_head.linear = q.to("cpu")
    report = apply_liger(ours)
    lines = [why for _, _, why in report.skipped if "fused loss off" in why]
    assert len(lines) == 1 and "int8" in lines[0], report.skipped
    assert not is_swapped(ours) and _int8_head(ours)
    assert not any(k.startswith("fused linear cross-entropy") for _, _, k in report.swapped)


def test_tied_checkpoint_with_a_lora_head_shares_the_embedding_and_merges_into_its_own_copy():
    # a tied checkpoint (head == embedding, as litgpt converts gemma / gemma-2) with a LoRA update on the head: the
    # head's frozen base shares the embedding's storage, the step equals stock's, and merging the update gives the
    # head its own copy first (the embedding keeps its values)
    from litgpt.lora import merge_lora_weights
    from litgpt.utils import chunked_cross_entropy as litgpt_ce

    from lit_liger import apply_liger, chunked_cross_entropy

    from lit_liger.swap import tied

    cfg, stock, ours = _gpt_pair()
    with torch.no_grad():
        for m in (stock, ours):
            m.lm_head.linear.weight.copy_(m.transformer.wte.weight)
    report = apply_liger(ours)
    _fused_on(report)
    assert "tied_weights" in str(report) and tied.head_weight(ours) is ours.lm_head.linear.weight
    x, y = _batch(cfg)
    _, loss, _ = _step(ours, x, y, chunked_cross_entropy)
    head, emb = ours.lm_head.linear.weight, ours.transformer.wte.weight
    assert head.data_ptr() == emb.data_ptr()  # one copy
    _, loss_ref, _ = _step(stock, x, y, lambda o, t: litgpt_ce(o, t, chunk_size=0))
    assert rel_err(loss, loss_ref) <= 1e-5
    assert_same_grads(stock, ours, 1e-4)
    emb_before = emb.detach().clone()
    merge_lora_weights(ours)  # LoRALinear.merge writes W += s·B·A into the head's base in place
    merge_lora_weights(stock)
    assert ours.lm_head.merged and head.data_ptr() != emb.data_ptr()
    assert torch.equal(emb, emb_before)  # the embedding is not touched
    assert rel_err(head, stock.lm_head.linear.weight) <= 1e-6 and not torch.equal(head, emb)
    assert tied.head_weight(ours) is None  # a merged head shares no more
    with torch.no_grad():
        out, ref = ours(x), stock(x)
    assert rel_err(out, ref) <= 1e-5


