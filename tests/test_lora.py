"""LitGPT's LoRA layers in one autograd function (``lit_liger.swap.lora``) against LitGPT's own LoRA forward."""

import copy
import os

import pytest
import torch
from litgpt.lora import GPT, Config, LoRALinear, LoRAQKVLinear, mark_only_lora_as_trainable, merge_lora_weights

from helpers import TOL, rel_err
from lit_liger import LigerConfig, apply_liger
from lit_liger.swap.adapter import _swap_class, is_swapped
from lit_liger.swap.lora import _LoRAMixin
from lit_liger.swap.lora import lora_linear, lora_parts, part_tables

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _qkv(enable, n_head=8, n_query_groups=2, head_size=16, dropout=0.0, bias=False):
    C = n_head * head_size
    m = LoRAQKVLinear(C, (n_head + 2 * n_query_groups) * head_size, r=4, lora_alpha=8, lora_dropout=dropout,
                      enable_lora=enable, head_size=head_size, n_head=n_head, n_query_groups=n_query_groups, bias=bias)
    torch.nn.init.normal_(m.lora_B, std=0.2)  # LitGPT starts B at zero: the update would vanish
    return m


CASES = {
    "qkv GQA q+v": lambda d: _qkv((True, False, True), dropout=d),
    "qkv GQA k only, bias": lambda d: _qkv((False, True, False), dropout=d, bias=True),
    "qkv MHA q+k+v": lambda d: _qkv((True, True, True), n_query_groups=8, dropout=d),
    "qkv GQA q+k+v": lambda d: _qkv((True, True, True), dropout=d),  # the parts side by side: one GEMM (tables)
    "qkv GQA k+v, bias": lambda d: _qkv((False, True, True), dropout=d, bias=True),
    "qkv MQA q+v": lambda d: _qkv((True, False, True), n_query_groups=1, dropout=d),
    "linear": lambda d: _init_b(LoRALinear(96, 80, r=6, lora_alpha=12, lora_dropout=d, bias=True)),
}


def _init_b(m):
    torch.nn.init.normal_(m.lora_B, std=0.2)
    return m


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("trainable_base", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_litgpt(case, trainable_base, dropout, dtype, device):
    torch.manual_seed(0)
    stock = CASES[case](dropout).to(device=device, dtype=dtype)
    stock.linear.weight.requires_grad_(trainable_base)
    if stock.linear.bias is not None:
        stock.linear.bias.requires_grad_(trainable_base)
    ours = copy.deepcopy(stock)
    _swap_class(ours, _LoRAMixin)  # the class swap apply_liger does, on one layer
    C = stock.linear.in_features
    x0 = torch.randn(3, 7, C + 5, device=device, dtype=dtype)[..., 2:C + 2]  # a non-contiguous view
    xs, xo = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    torch.manual_seed(1)
    ys = stock(xs)
    torch.manual_seed(1)  # the same dropout mask (the LoRA branch draws it first in both)
    yo = ours(xo)
    g = torch.randn_like(ys)
    ys.backward(g)
    yo.backward(g)
    tol = TOL[dtype]
    assert rel_err(yo, ys) < tol
    assert rel_err(xo.grad, xs.grad) < tol
    for (name, ps), (_, po) in zip(stock.named_parameters(), ours.named_parameters()):
        if ps.requires_grad:
            assert po.grad is not None, name
            assert rel_err(po.grad, ps.grad) < tol, name
        else:
            assert po.grad is None, name
    # the LoRA branch changes the output (the test above would not notice a dropped update otherwise)
    assert rel_err(ys, torch.nn.functional.linear(xs, stock.linear.weight, stock.linear.bias)) > 10 * tol


def test_parts_follow_litgpt_layout():
    m = _qkv((True, False, True), n_head=8, n_query_groups=2, head_size=16)
    assert lora_parts(m) == ((0, 128), (160, 192))
    assert lora_parts(LoRALinear(10, 20, r=2)) == ((0, 20),)
    assert part_tables(lora_parts(m), "cpu", torch.float32) is None  # (q and v: a gap, one GEMM per part)
    # q, k, v side by side (GQA: 128 + 32 + 32 columns): each column's part, as a 0/1 mask and as an index
    mask, part_of = part_tables(lora_parts(_qkv((True, True, True))), "cpu", torch.bfloat16)
    expected = torch.tensor([0] * 128 + [1] * 32 + [2] * 32)
    assert torch.equal(part_of.view(-1), expected) and mask.dtype == torch.bfloat16
    assert torch.equal(mask, (expected == torch.arange(3).unsqueeze(1)).to(torch.bfloat16))
    ours = _qkv((True, True, True))
    _swap_class(ours, _LoRAMixin)
    ours(torch.randn(2, 3, 128))
    assert [t is not None for t in ours._liger_tables.values()] == [True]  # (the swapped layer takes one GEMM)


@pytest.mark.parametrize("kw", [dict(lora_query=True, lora_value=True),
                                dict(lora_query=True, lora_key=True, lora_value=True, lora_projection=True,
                                     lora_mlp=True)])
def test_model_matches_litgpt_and_checkpoints_unchanged(kw):
    torch.manual_seed(0)
    cfg = Config.from_name("Llama-3.2-1B", n_layer=2, n_embd=128, n_head=8, n_query_groups=2, head_size=16,
                           intermediate_size=256, padded_vocab_size=320, vocab_size=300, block_size=64, lora_r=4,
                           lora_alpha=8, lora_dropout=0.1, **kw)
    stock = GPT(cfg)
    for n, p in stock.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    mark_only_lora_as_trainable(stock)
    ours = copy.deepcopy(stock)
    report = apply_liger(ours, {"fused_linear_cross_entropy": False})
    lora_layers = [n for n, m in ours.named_modules() if isinstance(m, LoRALinear) and m.r > 0]
    assert lora_layers and all(is_swapped(ours.get_submodule(n)) for n in lora_layers)
    assert set(report.paths(next(k for _, _, k in report.swapped if k.startswith("LoRA r=4 on q")))) >= {
        "transformer.h.0.attn.qkv", "transformer.h.1.attn.qkv"}
    assert list(ours.state_dict()) == list(stock.state_dict())
    x = torch.randint(0, 300, (2, 19))
    torch.manual_seed(3)
    ys = stock(x)
    torch.manual_seed(3)
    yo = ours(x)
    ys.float().logsumexp(-1).mean().backward()
    yo.float().logsumexp(-1).mean().backward()
    assert rel_err(yo, ys) < 1e-5
    for (n, ps), (_, po) in zip(stock.named_parameters(), ours.named_parameters()):
        if ps.requires_grad:
            assert rel_err(po.grad, ps.grad) < 1e-5, n
    # merging after training with lit-liger: the same merged weights as LitGPT's, and LitGPT's forward after it
    stock.eval(), ours.eval()
    merge_lora_weights(stock)
    merge_lora_weights(ours)
    for (n, ps), (_, po) in zip(stock.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(ps, po), n
    with torch.no_grad():
        assert rel_err(ours(x), stock(x)) < 1e-5


@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b"])
def test_lora_layers_reading_a_norm_keep_its_input_not_its_output(name, dropout):
    """LoRA ``qkv`` (``norm_1``'s reader) and LoRA ``fc_1`` / ``fc_2`` (``norm_2``'s) form the norm's output again in
    backward from the norm's input, which the norm keeps anyway: two ``(B, T, C)`` tensors per layer fewer than with
    ``recompute_norm`` off (with dropout, the qkv dropout's mask kept as bits instead of the dropped copy), the same
    loss and gradients bit for bit, and LitGPT's."""
    from helpers import saved_bytes

    over = dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=136,
                padded_vocab_size=128, vocab_size=128, block_size=32)
    cfg = Config.from_name(name, **over, lora_r=4, lora_alpha=8, lora_dropout=dropout, lora_query=True,
                           lora_value=True, lora_mlp=True)
    cfg.sliding_window_indices = None
    torch.manual_seed(0)
    stock = GPT(cfg)
    for n, p in stock.named_parameters():
        if "lora_B" in n or "norm" in n:
            torch.nn.init.normal_(p, mean=1.0 if "norm" in n else 0.0, std=0.2)
    mark_only_lora_as_trainable(stock)
    ours = copy.deepcopy(stock)
    x = torch.randint(0, 128, (2, 9))

    def run(model):
        torch.manual_seed(3)
        y, kept = saved_bytes(lambda: model(x), exclude=list(model.parameters()))
        loss = y.float().logsumexp(-1).mean()
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)
        return loss.detach(), kept, grads

    loss_s, _, grads_s = run(stock)
    got = {}
    for on in (False, True):
        apply_liger(ours, {"fused_linear_cross_entropy": False, "recompute_norm": on})
        got[on] = run(ours)
    (loss_off, kept_off, grads_off), (loss_on, kept_on, grads_on) = got[False], got[True]
    assert torch.equal(loss_on, loss_off) and grads_on.keys() == grads_off.keys() == grads_s.keys()
    for n in grads_s:
        assert torch.equal(grads_on[n], grads_off[n]), n
        assert rel_err(grads_on[n], grads_s[n]) < 1e-5, n
    assert rel_err(loss_on, loss_s) < 1e-6
    # (the first Block's norm_1 reads the frozen embedding's output, which needs no gradient: that norm keeps nothing,
    # so its LoRA qkv keeps the embedding's output in place of the norm's, of one size)
    N, C, L = x.numel(), cfg.n_embd, cfg.n_layer
    bits = (N * C + 7) // 8 if dropout else 0
    assert kept_off - kept_on == (2 * L - 1) * N * C * 4 - L * bits


def test_fallbacks_run_litgpt_forward():
    m = _qkv((True, False, True))
    _swap_class(m, _LoRAMixin)
    x = torch.randn(2, 5, 128)
    assert m._liger_lora_here(x)
    m.merged = True
    assert not m._liger_lora_here(x)  # merged: W already holds the update, LitGPT's plain Linear
    m.merged = False
    h = m.linear.register_forward_hook(lambda *a: None)
    assert not m._liger_lora_here(x)  # a hook on the base Linear must run: LitGPT's forward calls it
    h.remove()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not m._liger_lora_here(x)  # autocast: LitGPT's forward (its casts per op)
    assert not m._liger_lora_here(x.double())  # dtypes differ from the weights'
    assert m._liger_lora_here(x)


def test_switch_off_and_r0_layers_are_left_alone():
    cfg = Config.from_name("Llama-3.2-1B", n_layer=1, n_embd=64, n_head=4, n_query_groups=2, head_size=16,
                           intermediate_size=128, padded_vocab_size=128, vocab_size=128, block_size=32, lora_r=2,
                           lora_alpha=4, lora_query=True, lora_value=True)
    m = GPT(cfg)
    rep = apply_liger(m, LigerConfig(lora=False))
    assert not is_swapped(m.transformer.h[0].attn.qkv)
    assert ("transformer.h.0.attn.qkv", "LoRAQKVLinear", "lora switched off") in rep.skipped
    apply_liger(m)
    assert is_swapped(m.transformer.h[0].attn.qkv)
    assert not is_swapped(m.transformer.h[0].mlp.fc_1)  # r = 0 (lora_mlp off): LitGPT's forward is its Linear


def test_bad_inputs_raise():
    w, a, b = torch.randn(12, 8), torch.randn(4, 8), torch.randn(12, 2)
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="multiple"):
        lora_linear(x, w, None, torch.randn(3, 8), b, 1.0, ((0, 6), (6, 12)))
    with pytest.raises(ValueError, match="lora_B"):
        lora_linear(x, w, None, a, torch.randn(10, 2), 1.0, ((0, 6), (6, 12)))
    with pytest.raises(ValueError, match="in_features"):
        lora_linear(torch.randn(3, 9), w, None, a, b, 1.0, ((0, 6), (6, 12)))
    with pytest.raises(TypeError, match="dtype"):
        lora_linear(x.bfloat16(), w, None, a, b, 1.0, ((0, 6), (6, 12)))
    y = lora_linear(x, w, None, a, b, 0.5, ((0, 6), (6, 12)))
    ref = x @ w.t()
    ref[:, :6] += 0.5 * (x @ a[:2].t()) @ b[:6].t()
    ref[:, 6:] += 0.5 * (x @ a[2:].t()) @ b[6:].t()
    assert rel_err(y, ref) < 1e-6
    # the parts side by side as one GEMM (part_tables): the same output; tables that do not fit are refused
    tables = part_tables(((0, 6), (6, 12)), "cpu", torch.float32)
    assert rel_err(lora_linear(x, w, None, a, b, 0.5, ((0, 6), (6, 12)), tables=tables), ref) < 1e-6
    assert part_tables(((0, 4), (8, 12)), "cpu", torch.float32) is None  # (a gap: one GEMM per part)
    with pytest.raises(ValueError, match="part_tables"):
        lora_linear(x, w, None, a, b, 0.5, ((0, 6), (6, 12)), tables=part_tables(((0, 5), (5, 12)), "cpu",
                                                                                   torch.float32)[::-1])
    with pytest.raises(ValueError, match="part_tables"):
        lora_linear(x, w, None, a, b, 0.5, ((0, 6), (6, 12)), tables=part_tables(((0, 6), (6, 12)), "cpu",
                                                                                   torch.float64))


# ------------------------------------------------------------------------------------------------
# GPU: the LoRA branch on a second stream inside a CUDA graph's capture (lora._branch_stream)
# ------------------------------------------------------------------------------------------------
def _captured_step(kwargs, x, dy, params, seed):
    """``lora_linear(x, **kwargs)``'s output and the gradients of ``x`` and ``params`` for ``dy``: captured in a CUDA
    graph (forward and backward in one), replayed once after ``torch.manual_seed(seed)``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (warm-up: Triton compiles, cuBLAS picks its kernels)
        for _ in range(2):
            for t in (x, *params):
                t.grad = None
            lora_linear(x, **kwargs).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    for t in (x, *params):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = lora_linear(x, **kwargs)
        y.backward(dy)
    torch.manual_seed(seed)
    graph.replay()
    torch.cuda.synchronize()
    return [y.clone()] + [t.grad.clone() for t in (x, *params)]


def _eager_step(kwargs, x, dy, params, seed):
    for t in (x, *params):
        t.grad = None
    torch.manual_seed(seed)
    y = lora_linear(x, **kwargs)
    y.backward(dy)
    return [y.detach().clone()] + [t.grad.clone() for t in (x, *params)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["dropout-bits", "dropout-encoded", "norm-bits", "glu-bits", "qkv-tables",
                                  "no-dropout"])
def test_gpu_branch_on_a_second_stream_is_bit_for_bit(case):
    """Captured (the LoRA branch on a second stream) and uncaptured (one stream): the output and every gradient are
    bit for bit the same (the same kernels on the same inputs, the same random draws; on Hopper the captured
    backward's frozen GEMM is cuBLASLt's with SMs left to the branch, which gave cuBLAS's bits at these shapes on an
    H200), at recipe-like sizes (300 rows, widths not a power of two)."""
    from lit_liger.kernels.rms_norm import rms_norm
    from lit_liger.swap import lora as lora_mod

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    N, C, out = 300, 576, 1344
    parts = ((0, out),)
    if case == "qkv-tables":
        parts = ((0, 768), (768, 1056), (1056, 1344))  # q, k, v side by side
    n = len(parts)
    w = (torch.randn(out, C, device=dev, dtype=dt) * 0.02)
    a = (torch.randn(n * 8, C, device=dev, dtype=dt) * 0.05).requires_grad_()
    b = (torch.randn(out, 8, device=dev, dtype=dt) * 0.05).requires_grad_()
    s = torch.randn(2, N // 2, C, device=dev, dtype=dt)
    norm_w = torch.rand(C, device=dev, dtype=dt) + 0.5
    g1 = torch.randn(2, N // 2, C, device=dev, dtype=dt)
    g2 = torch.randn(2, N // 2, C, device=dev, dtype=dt)
    kwargs = dict(weight=w, bias=None, lora_a=a, lora_b=b, scaling=2.0, parts=parts)
    if case == "dropout-bits":
        x = s.clone()
        kwargs.update(dropout=0.1, keep_input=True)
    elif case == "dropout-encoded":
        x = s.clone()
        kwargs.update(dropout=0.1)
    elif case == "norm-bits":
        x = rms_norm(s, norm_w).detach()
        kwargs.update(dropout=0.1, norm=(s, norm_w, 1e-6, 0.0))
    elif case == "glu-bits":
        from lit_liger.swap.lora import glu_product

        x = glu_product(g1, g2, "gelu_tanh")  # (the product as lit-liger's GLU kernel rounds it)
        kwargs.update(dropout=0.1, glu=(g1, g2, "gelu_tanh"))
    elif case == "qkv-tables":
        x = s.clone()
        kwargs.update(dropout=0.1, keep_input=True, tables=part_tables(parts, dev, dt))
    else:
        x = s.clone()
    x.requires_grad_()
    dy = torch.randn(2, N // 2, out, device=dev, dtype=dt)
    streams = []
    real = lora_mod._branch_stream
    lora_mod._branch_stream = lambda t: streams.append(real(t)) or streams[-1]  # (which stream each call got)
    try:
        captured = _captured_step(kwargs, x, dy, (a, b), seed=7)
    finally:
        lora_mod._branch_stream = real
    assert any(s is not None for s in streams)  # the capture did fork the branch
    eager = _eager_step(kwargs, x, dy, (a, b), seed=7)
    for name, got, ref in zip(("y", "dx", "dA", "dB"), captured, eager):
        assert torch.equal(got, ref), (case, name, (got.float() - ref.float()).abs().max())
    assert captured[1].abs().sum() > 0 and captured[2].abs().sum() > 0


def test_forward_waits_for_h_not_for_the_dropout_bits(monkeypatch):
    """The forward's order around the LoRA branch (on a second stream while captured): the branch marks what the
    update's addmm waits for after ``h`` and before the dropout's bits are packed; the addmm follows the wait for that
    mark, and the whole branch is joined after it, before the function returns. A recording stand-in for ``_Branch``
    (no GPU here; the GPU test above checks the captured results bit for bit)."""
    from lit_liger.swap import lora as lora_mod

    log = []

    class Recording:
        def __init__(self, side):
            self.side = None  # (_beside_branch: no carveout)
            log.append("fork")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            log.append("exit")

        def mark(self):
            log.append("mark")

        def join_marked(self):
            log.append("join_marked")

        def join(self):
            log.append("join")

    real_pack, real_mm = lora_mod.pack_kept, torch.Tensor.addmm_
    monkeypatch.setattr(lora_mod, "_Branch", Recording)
    monkeypatch.setattr(lora_mod, "pack_kept", lambda m: log.append("pack") or real_pack(m))
    monkeypatch.setattr(torch.Tensor, "addmm_", lambda self, *a, **k: log.append("addmm") or real_mm(self, *a, **k))
    torch.manual_seed(0)
    x = torch.randn(6, 16, requires_grad=True)
    w, a, b = torch.randn(12, 16), torch.randn(4, 16, requires_grad=True), torch.randn(12, 4, requires_grad=True)
    y = lora_linear(x, w, None, a, b, 2.0, ((0, 12),), dropout=0.25, keep_input=True)
    forward = log[:log.index("join") + 1]
    assert forward == ["fork", "mark", "pack", "exit", "join_marked", "addmm", "join"], forward
    y.sum().backward()
    assert x.grad is not None and a.grad is not None and b.grad is not None


# ------------------------------------------------------------------------------------------------
# The SM carveout of a captured LoRA layer's frozen input-gradient GEMM (kernels._launch.lora_branch_sms)
# ------------------------------------------------------------------------------------------------
def test_lora_branch_sms_only_on_hopper_and_for_few_rows(monkeypatch):
    """The carveout where it was measured (Hopper, CUDA, at most LORA_BRANCH_MAX_ROWS rows), nowhere else."""
    from lit_liger.kernels import _launch

    limits = {"h200": _launch.DeviceLimits("h200", 32, 1024, 132, (9, 0), False),
              "a100": _launch.DeviceLimits("a100", 32, 1024, 108, (8, 0), False),
              "mi300": _launch.DeviceLimits("mi300", 64, 1024, 304, (9, 4), True)}
    for name, lim in limits.items():
        monkeypatch.setattr(_launch, "device_limits", lambda device, lim=lim: lim)
        got = _launch.lora_branch_sms(torch.device("cuda"), 512)
        assert got == (_launch.LORA_BRANCH_SMS if name == "h200" else None), name
        assert _launch.lora_branch_sms(torch.device("cuda"), _launch.LORA_BRANCH_MAX_ROWS + 1) is None
    monkeypatch.delattr(torch._C, "_set_sm_carveout_experimental")  # (a torch without PyTorch's carveout)
    assert _launch.lora_branch_sms(torch.device("cuda"), 512) is None


def test_gemm_beside_the_branch_sets_and_restores_the_blas_settings(monkeypatch):
    """``_beside_branch``: cuBLASLt and the carveout for the body where the branch runs beside it (a side stream) and
    the rows call for it, both back as they were after it (an error inside included); untouched otherwise."""
    from types import SimpleNamespace

    from lit_liger.swap import lora as lora_mod

    state = {"blas": "cublas", "carve": 4}

    def preferred(backend=None):
        if backend is not None:
            state["blas"] = backend
        return state["blas"]

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred)
    monkeypatch.setattr(torch._C, "_set_sm_carveout_experimental", lambda v: state.__setitem__("carve", v))
    monkeypatch.setattr(torch._C, "_get_sm_carveout_experimental", lambda: state["carve"])
    monkeypatch.setattr(lora_mod, "lora_branch_sms", lambda device, rows: 16 if rows <= 8 else None)
    side, alone = SimpleNamespace(side=object()), SimpleNamespace(side=None)
    with lora_mod._beside_branch(side, torch.zeros(8, 3)):
        assert state == {"blas": "cublaslt", "carve": 16}
    assert state == {"blas": "cublas", "carve": 4}
    with pytest.raises(RuntimeError, match="inside"):
        with lora_mod._beside_branch(side, torch.zeros(8, 3)):
            raise RuntimeError("inside")
    assert state == {"blas": "cublas", "carve": 4}
    def refuse(value):  # (a carveout PyTorch refuses: the backend already switched is put back too)
        if value == 16:
            raise RuntimeError("refused")
        state["carve"] = value

    monkeypatch.setattr(torch._C, "_set_sm_carveout_experimental", refuse)
    with pytest.raises(RuntimeError, match="refused"):
        with lora_mod._beside_branch(side, torch.zeros(8, 3)):
            pass
    assert state == {"blas": "cublas", "carve": 4}
    monkeypatch.setattr(torch._C, "_set_sm_carveout_experimental", lambda v: state.__setitem__("carve", v))
    for branch, rows in ((side, 9), (alone, 8)):
        with lora_mod._beside_branch(branch, torch.zeros(rows, 3)):
            assert state == {"blas": "cublas", "carve": 4}


def test_quiet_stderr_hides_only_its_body(capfd):
    """What the body writes to file descriptor 2 (PyTorch's C++ notice) is dropped; stderr works as before after it."""
    from lit_liger.swap.lora import _quiet_stderr

    os.write(2, b"before ")
    with _quiet_stderr():
        os.write(2, b"hidden ")
    os.write(2, b"after")
    assert capfd.readouterr().err == "before after"
