"""Training code written for stock LitGPT runs unchanged on a swapped model (issue 34, part 1).

Each pattern that stock code uses on the training logits is run on stock LitGPT and on the swapped model:
the loss and every gradient must be equal, the loss patterns must run the fused loss (the real logits are
never computed), and the other patterns must compute the real logits once per output, with one warning.
"""

import copy
import warnings

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err
from litgpt import GPT
from litgpt.utils import chunked_cross_entropy as litgpt_ce
from test_adapter import _pair, _randomize, tiny_config

from lit_liger import LigerCallback, LigerLogits, apply_liger
from lit_liger.swap import loss as loss_mod
from lit_liger.swap import gpt as swap_gpt
from lit_liger.swap.state import state_of

V = 160  # tiny_config's padded vocabulary


def _shift(o):
    return o[..., :-1, :]


# pattern name -> loss(output, targets); "fused" patterns must not compute the logits
FUSED = {
    "litgpt_chunked_default": lambda o, y: litgpt_ce(_shift(o), y[..., 1:]),
    "litgpt_chunked_5": lambda o, y: litgpt_ce(_shift(o), y[..., 1:], chunk_size=5),
    "litgpt_chunked_0": lambda o, y: litgpt_ce(o, y, chunk_size=0),
    "F_reshape": lambda o, y: F.cross_entropy(o.reshape(-1, o.size(-1)), y.reshape(-1)),
    "F_view_contiguous_float": lambda o, y: F.cross_entropy(
        o[:, :-1, :].contiguous().float().view(-1, V), y[:, 1:].reshape(-1)
    ),
    "F_flatten_sum_smoothing": lambda o, y: F.cross_entropy(
        o.flatten(0, 1), y.flatten(), reduction="sum", label_smoothing=0.1
    ),
    "F_none_masked": lambda o, y: (
        F.cross_entropy(o.reshape(-1, V), y.reshape(-1), reduction="none") * (y.reshape(-1) % 3 == 0)
    ).sum(),
    "torch_split_cat": lambda o, y: torch.cat(
        [F.cross_entropy(c, t, reduction="none") for c, t in zip(torch.split(o.reshape(-1, V), 7), y.reshape(-1).split(7))]
    ).sum()
    / 20,
}
# patterns that need the real logits (a metric, a hand-written loss): computed once, same numbers
REAL = {
    "argmax_metric_plus_loss": lambda o, y: litgpt_ce(o, y) + (o.argmax(-1) == y).float().mean().detach(),
    "log_softmax_gather": lambda o, y: -torch.log_softmax(o.float(), -1).gather(-1, y.clamp(min=0).unsqueeze(-1)).mean(),
    "softmax_entropy": lambda o, y: -(o.softmax(-1) * o.log_softmax(-1)).sum(-1).mean(),
    "arithmetic": lambda o, y: F.cross_entropy((o / 2.0).reshape(-1, V), y.reshape(-1)),
    "vocab_slice": lambda o, y: F.cross_entropy(o[..., :150].reshape(-1, 150), y.reshape(-1)),
    "class_weights": lambda o, y: F.cross_entropy(o.reshape(-1, V), y.reshape(-1), weight=torch.linspace(0.5, 1.5, V)),
    "torch_cat_outputs": lambda o, y: torch.cat([o, o], 0).float().logsumexp(-1).mean(),
}


def _data(cfg, B=2, T=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    y[0, :3] = -100
    return x, y


class _Counter:
    """Counts computations of the real logits and lit-liger's warnings."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = LigerLogits.materialize

        def counting(obj):
            self.n += 1
            return real(obj)

        monkeypatch.setattr(LigerLogits, "materialize", counting)
        # (the warnings: once per model, ModelState.warned; every test here counts on a fresh model)


def _run(fn, model, x, y):
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = fn(model(x), y)
        loss.backward()
    msgs = [str(w.message) for w in caught if "lit-liger" in str(w.message)]
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, msgs


def _check_equal(loss, grads, loss_ref, grads_ref, tol=1e-5):
    assert loss.dtype == loss_ref.dtype
    assert rel_err(loss, loss_ref) <= tol, (loss.item(), loss_ref.item())
    assert grads.keys() == grads_ref.keys()
    for n, g in grads.items():
        assert (g is None) == (grads_ref[n] is None), n
        if g is not None:
            assert rel_err(g, grads_ref[n]) <= 10 * tol, (n, rel_err(g, grads_ref[n]))


def _against_stock(family, fn, monkeypatch):
    """``fn(output, targets)`` and its backward on stock LitGPT and on the swapped copy: loss and every gradient
    equal; returns (the logits computations counter, lit-liger's warnings, the swapped model, x, y)."""
    cfg = tiny_config(family)
    ref, ours = _pair(cfg)
    apply_liger(ours)
    count = _Counter(monkeypatch)
    x, y = _data(cfg)
    loss_ref, grads_ref, _ = _run(fn, ref, x, y)
    loss, grads, msgs = _run(fn, ours, x, y)
    _check_equal(loss, grads, loss_ref, grads_ref)
    return count, msgs, ours, x, y


@pytest.mark.parametrize("family", ["Llama-3.2-1B", "gemma-2-2b", "phi-2"])  # plain, final softcap, lm_head bias
@pytest.mark.parametrize("pattern", list(FUSED))
def test_loss_patterns_run_fused(pattern, family, monkeypatch):
    count, msgs, _, _, _ = _against_stock(family, FUSED[pattern], monkeypatch)
    assert count.n == 0 and not msgs  # the logits never existed, nothing to warn about


@pytest.mark.parametrize("pattern", list(REAL))
def test_other_patterns_compute_the_logits_once(pattern, monkeypatch):
    count, msgs, ours, x, y = _against_stock("gemma-2-2b", REAL[pattern], monkeypatch)
    assert count.n == 1  # once per output, however many ops used it
    assert len(msgs) == 1 and "lit_liger.chunked_cross_entropy" in msgs[0]  # names the faster call
    _, _, again = _run(REAL[pattern], ours, x, y)
    assert not again  # one warning per model


def test_bucketed_output_patterns(monkeypatch):
    """With seq_buckets the output is padded inside (hidden longer than the caller's T): every pattern still
    sees the caller's (B, T, V) and gives stock's numbers."""
    from lit_liger.swap import adapter

    monkeypatch.setattr(swap_gpt, "_BUCKETS_ON_CPU", True)
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    count = _Counter(monkeypatch)
    x, y = _data(cfg, T=11)
    out = ours(x)
    assert out.hidden.shape[1] > 11 and out.shape == (2, 11, V)  # padded inside, the caller's shape outside
    for fn in (*FUSED.values(), REAL["argmax_metric_plus_loss"], REAL["vocab_slice"]):
        loss_ref, grads_ref, _ = _run(fn, ref, x, y)
        loss, grads, _ = _run(fn, ours, x, y)
        _check_equal(loss, grads, loss_ref, grads_ref)
    assert count.n == 2  # the two REAL patterns, once per output each


def test_materialized_logits_regain_a_graph_after_no_grad_use():
    """A metric computed under no_grad first must not leave gradient-less cached logits for a later loss."""
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    state_of(ours).warned.add("materialize")  # (silenced: warned already)
    x, y = _data(cfg)

    def fn(o, y):
        with torch.no_grad():
            acc = (o.argmax(-1) == y).float().mean()
        return o.log_softmax(-1).mean() + 0 * acc

    loss_ref, grads_ref, _ = _run(fn, ref, x, y)
    loss, grads, _ = _run(fn, ours, x, y)
    _check_equal(loss, grads, loss_ref, grads_ref)


def test_metadata_and_errors():
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    x, y = _data(cfg)
    out = ours(x)
    assert out.shape == (2, 12, V) and out.size(-1) == V and out.dim() == out.ndim == 3 and len(out) == 2
    assert out.dtype == torch.float32 and out.float() is out and out.contiguous() is out
    assert out.bfloat16().dtype == torch.bfloat16 and out.device == x.device and out.requires_grad
    with pytest.raises(AttributeError, match="nor does a tensor"):
        out.not_a_tensor_attribute
    with pytest.raises(ValueError, match="shape"):
        F.cross_entropy(out.reshape(-1, V), y[:, 1:].reshape(-1))  # unshifted output, shifted targets
    with pytest.raises(RuntimeError):
        out.reshape(5, V)  # leading dims that do not fit: stock's error
    with pytest.raises(ValueError, match="index|range|vocab"):
        F.cross_entropy(out.reshape(-1, V), torch.full((24,), V + 3))  # class index out of range


def test_lm_head_chunked_list_with_litgpt_loss(monkeypatch):
    """litgpt's finetune scripts call ``model(x, lm_head_chunk_size=128)`` and LitGPT's loss on the list."""
    cfg = tiny_config("Llama-3.2-1B")
    ref, ours = _pair(cfg)
    apply_liger(ours)
    count = _Counter(monkeypatch)
    x, y = _data(cfg)
    for chunk in (0, 128):
        ref.zero_grad(set_to_none=True)
        ours.zero_grad(set_to_none=True)
        loss_ref = litgpt_ce(ref(x, lm_head_chunk_size=4), y, chunk_size=chunk)
        loss_ref.backward()
        loss = litgpt_ce(ours(x, lm_head_chunk_size=4), y, chunk_size=chunk)
        loss.backward()
        _check_equal(loss.detach(), {n: p.grad for n, p in ours.named_parameters()},
                     loss_ref.detach(), {n: p.grad for n, p in ref.named_parameters()})
    assert count.n == 0


def test_llm_logits_usable():
    """``litgpt.LLM``: ``logits, loss = llm(x, y)``; the loss is fused, the logits still work as logits."""
    from litgpt.api import LLM

    cfg = tiny_config("Qwen3-0.6B")
    ref, ours = _pair(cfg)
    stock, llm = LLM(ref), LLM(ours)
    apply_liger(llm)
    state_of(ours).warned.add("materialize")  # (silenced: warned already)
    x, _ = _data(cfg)
    logits_ref, loss_ref = stock(x, x)
    logits, loss = llm(x, x)
    assert rel_err(loss, loss_ref) <= 1e-5
    assert torch.equal(logits.argmax(-1), logits_ref.argmax(-1))
    assert rel_err(logits.softmax(-1), logits_ref.softmax(-1)) <= 1e-5


class StockLoRAModule(L.LightningModule):
    """What a stock LitGPT user writes: a LoRA GPT built in configure_model, LitGPT's own loss, an accuracy metric."""

    def __init__(self, cfg, state):
        super().__init__()
        self.cfg, self.state, self.model = cfg, state, None
        self.losses, self.accs, self.preds = [], [], []

    def configure_model(self):
        if self.model is not None:
            return
        from litgpt.lora import GPT as LoRAGPT
        from litgpt.lora import mark_only_lora_as_trainable

        self.model = LoRAGPT(self.cfg)
        self.model.load_state_dict(self.state, strict=False)
        mark_only_lora_as_trainable(self.model)

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        logits = self.model(ids)
        loss = litgpt_ce(logits[..., :-1, :], ids[..., 1:])
        self.losses.append(loss.detach())
        if batch_idx == 1:
            preds = logits[..., :-1, :].argmax(-1)  # (B, T - 1): an accuracy metric's input
            self.preds.append(preds)
            self.accs.append((preds == ids[..., 1:]).float().mean())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.5)


def test_trainer_stock_lightning_module_unchanged(tmp_path):
    from litgpt.lora import Config as LoRAConfig
    from test_callback import _data as loader
    from test_callback import _trainer

    cfg = tiny_config("Llama-3.2-1B", LoRAConfig, lora_r=4, lora_alpha=8, lora_query=True, lora_value=True)
    torch.manual_seed(0)
    from litgpt.lora import GPT as LoRAGPT

    base = LoRAGPT(cfg)
    _randomize(base)
    state = base.state_dict()
    stock, ours = StockLoRAModule(cfg, state), StockLoRAModule(cfg, copy.deepcopy(state))
    _trainer(tmp_path / "a", None).fit(stock, loader())
    with pytest.warns(UserWarning, match="argmax"):  # the accuracy metric: the one warning, nothing crashes
        _trainer(tmp_path / "b", LigerCallback(log_metrics=False)).fit(ours, loader())
    assert len(ours.losses) == len(stock.losses) == 3
    for a, b in zip(ours.losses, stock.losses):  # three SGD steps: the parameters followed stock's
        assert rel_err(a, b) <= 1e-4
    # the metric saw stock's predictions token for token (the accuracy itself may well be 0 on random weights)
    assert torch.equal(ours.preds[0], stock.preds[0]) and torch.equal(ours.accs[0], stock.accs[0])


def test_fabric_loop_with_f_cross_entropy(monkeypatch):
    """A Fabric loop (bf16-true: Fabric casts outputs to fp32) with ``F.cross_entropy`` on reshaped logits."""
    from test_callback import bf16_pair

    cfg = tiny_config("gemma-2-2b")
    stock, ours = bf16_pair(cfg)
    count = _Counter(monkeypatch)
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    m_stock, m_ours = fabric.setup_module(stock), fabric.setup_module(ours)
    x, y = _data(cfg)

    def step(m):
        logits = m(x)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), y[:, 1:].reshape(-1))
        fabric.backward(loss)
        return loss.detach()

    loss_ref, loss = step(m_stock), step(m_ours)
    assert loss.dtype == loss_ref.dtype == torch.float32  # Fabric's output cast: stock's loss is fp32 too
    assert rel_err(loss, loss_ref) <= 1e-2
    assert count.n == 0
    # bf16 gradients: both against the fp32 computation of the same (bf16) weights, ours no further than stock's
    exact = copy.deepcopy(stock).float()
    exact.zero_grad(set_to_none=True)
    logits = exact(x)
    F.cross_entropy(logits[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1)).backward()
    for (n, p), (_, q), (_, e) in zip(ours.named_parameters(), stock.named_parameters(), exact.named_parameters()):
        assert rel_err(p.grad, e.grad) <= max(1e-2, 1.5 * rel_err(q.grad, e.grad)), n


@pytest.mark.gpu
def test_gpu_stock_loss_keeps_the_memory_benefit():
    """On a GPU, LitGPT's own ``chunked_cross_entropy`` on a swapped model runs the fused loss: the step's peak
    stays below stock's by most of the (B, T, V) logits (bf16 logits, their fp32 upcast chunks and gradient)."""
    from litgpt import Config

    cfg = Config.from_name("Llama-3.2-1B", n_layer=2, n_embd=512, n_head=8, n_query_groups=2, intermediate_size=1408,
                           head_size=64)
    torch.manual_seed(0)
    with torch.device("cuda"):
        stock = GPT(cfg).to(torch.bfloat16)
    ours = copy.deepcopy(stock)
    apply_liger(ours)
    B, T = 4, 2048  # enough rows that the logits outweigh the fused loss's fixed (V, H) buffers
    x = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")

    def peak(model):
        model.zero_grad(set_to_none=True)
        loss = litgpt_ce(model(x)[..., :-1, :], x[..., 1:])
        loss.backward()  # once: the gradients exist, and the base below counts them
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = litgpt_ce(model(x)[..., :-1, :], x[..., 1:])
        loss.backward()
        torch.cuda.synchronize()
        return loss.detach().float(), torch.cuda.max_memory_allocated() - base

    loss_ref, extra_ref = peak(stock)
    loss, extra = peak(ours)
    logits_bytes = B * T * cfg.padded_vocab_size * 2  # one bf16 copy of the logits
    assert rel_err(loss, loss_ref) <= 1e-2
    assert extra_ref - extra >= logits_bytes, (extra_ref / 2**20, extra / 2**20, logits_bytes / 2**20)


def test_litgpt_chunks_join_into_one_fused_sum(monkeypatch):
    """litgpt's ``chunked_cross_entropy`` splits the rows into chunks, takes each chunk's per-token losses and sums
    their concatenation: the chunks join again, and the sum runs as one fused loss with reduction "sum" (gradients
    in the forward, no per-chunk GEMMs over the vocabulary)."""
    cfg = tiny_config("Llama-3.2-1B")
    _, ours = _pair(cfg)
    apply_liger(ours)
    calls = []
    real = loss_mod._PendingLoss._fused
    monkeypatch.setattr(loss_mod._PendingLoss, "_fused", lambda self, red: calls.append((red, self.target.numel()))
                        or real(self, red))
    x, y = _data(cfg)
    litgpt_ce(ours(x)[..., :-1, :], y[..., 1:], chunk_size=5).backward()
    assert calls == [("sum", 22)]  # one call over all 2 x 11 rows, not five of five rows
