"""LigerConfig.recompute_mlp: a Block's residual add, norm_2 and GLU MLP with fc_1 / fc_2 recomputed in backward."""
import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err

from lit_liger.kernels._launch import use_triton
from lit_liger.kernels.rms_norm import rms_norm_linear
from lit_liger.kernels.swiglu import glu_linear, rms_norm_glu_mlp

C, I = 40, 72


def _inputs(device, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)

    def t(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype).requires_grad_()

    x, res = t(2, 9, C), t(2, 9, C)
    nw = t(C, scale=0.1)
    w1, w2, w3 = t(I, C, scale=C**-0.5), t(I, C, scale=C**-0.5), t(C, I, scale=I**-0.5)
    b1, b2, b3 = (t(I), t(I), t(C)) if bias else (None, None, None)
    return x, res, nw, w1, b1, w2, b2, w3, b3


def _fp64(x, res, nw, w1, b1, w2, b2, w3, b3, act, eps, offset):
    s = x + res
    n = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (nw + offset)
    a, b = F.linear(n, w1, b1), F.linear(n, w2, b2)
    h = (F.silu(a) if act == "silu" else F.gelu(a, approximate="tanh")) * b
    return s, F.linear(h, w3, b3)


@pytest.mark.parametrize("chunks", [False, True])
@pytest.mark.parametrize("act,bias", [("silu", False), ("gelu_tanh", True)])
def test_matches_fp64_and_the_kept_path(act, bias, chunks, device, monkeypatch):
    """``chunks``: the backward over 4 chunks of rows (18 rows: 5, 5, 5, 3), the weight gradients summed over them."""
    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton): the function is the kept composition there")
    from lit_liger.kernels import _launch

    if chunks:
        monkeypatch.setattr(_launch, "MLP_MIN_ROWS", 1)
    assert _launch.mlp_chunk_rows(18) == (5 if chunks else 128)
    ins = _inputs(device, torch.float32, bias)
    leaves = [t for t in ins if t is not None]
    ds, dy = torch.randn(2, 9, C, device=device), torch.randn(2, 9, C, device=device)
    s, y = rms_norm_glu_mlp(*ins[:3], 1e-5, 1.0, *ins[3:], activation=act)
    got = torch.autograd.grad((s, y), leaves, (ds, dy))
    # the path that keeps fc_1 / fc_2's outputs (the default): the same math
    x, res, nw, w1, b1, w2, b2, w3, b3 = ins
    s_k, (a, b) = rms_norm_linear(x, nw, [(w1, b1), (w2, b2)], 1e-5, 1.0, residual=res)
    y_k = glu_linear(a, b, w3, b3, act)
    kept = torch.autograd.grad((s_k, y_k), leaves, (ds, dy))
    assert torch.equal(s, s_k) and torch.equal(y, y_k)
    for g, k in zip(got, kept):  # (chunks: the weight gradients summed in another order)
        assert rel_err(g, k) <= 1e-6
    d64 = [t.detach().double().requires_grad_() if t is not None else None for t in ins]
    s64, y64 = _fp64(*d64, act, 1e-5, 1.0)
    ref = torch.autograd.grad((s64, y64), [t for t in d64 if t is not None], (ds.double(), dy.double()))
    assert rel_err(y, y64) <= 1e-5
    for g, r in zip(got, ref):
        assert rel_err(g, r) <= 1e-4


def test_keeps_no_intermediate_sized_tensor(device):
    """Saved for backward: the residual sum, rstd and the weights; no (N, I) tensor (the kept path saves two)."""
    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    ins = _inputs(device, torch.float32, False)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        s, y = rms_norm_glu_mlp(*ins[:3], 1e-5, 0.0, *ins[3:])
    assert (2, 9, I) not in saved and (18, I) not in saved, saved
    saved.clear()
    x, res, nw, w1, b1, w2, b2, w3, b3 = ins
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, (a, b) = rms_norm_linear(x, nw, [(w1, b1), (w2, b2)], 1e-5, 0.0, residual=res)
        glu_linear(a, b, w3, b3)
    assert saved.count((2, 9, I)) == 2, saved


def test_frozen_weights_and_bad_inputs(device):
    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    x, res, nw, w1, b1, w2, b2, w3, b3 = _inputs(device, torch.float32, False)
    for w in (w1, w2, w3, nw):
        w.requires_grad_(False)
    s, y = rms_norm_glu_mlp(x, res, nw, 1e-5, 0.0, w1, b1, w2, b2, w3, b3)
    gx, gr = torch.autograd.grad(y.sum() + s.sum(), (x, res))
    s_k, (a, b) = rms_norm_linear(x, nw, [(w1, b1), (w2, b2)], 1e-5, 0.0, residual=res)  # the kept path
    kx, kr = torch.autograd.grad(glu_linear(a, b, w3, b3).sum() + s_k.sum(), (x, res))
    assert rel_err(gx, kx) <= 1e-6 and rel_err(gr, kr) <= 1e-6
    with pytest.raises(ValueError, match="w3 has shape"):
        rms_norm_glu_mlp(x, res, nw, 1e-5, 0.0, w1, b1, w2, b2, w3.t(), b3)
    with pytest.raises(ValueError, match="residual shape"):
        rms_norm_glu_mlp(x, res[:1], nw, 1e-5, 0.0, w1, b1, w2, b2, w3, b3)
    with pytest.raises(ValueError, match="activation"):
        rms_norm_glu_mlp(x, res, nw, 1e-5, 0.0, w1, b1, w2, b2, w3, b3, activation="relu")


@pytest.mark.parametrize("compiled", [False, True])
def test_adapter_setting(compiled, device):
    """``recompute_mlp=True``: the report says so, the Blocks run the function, and loss and gradients equal the
    default configuration's; ``compiled``: both models under ``torch.compile(fullgraph=True)`` (``aot_eager`` on CPU),
    where the recomputing model's graph holds the custom op once per Block and the default's none."""
    from litgpt import Config
    from litgpt.model import GPT

    import lit_liger.swap.block as swap_block
    from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy

    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    cfg = Config.from_name("pythia-14m", n_layer=2, n_embd=32, n_head=2, head_size=16, intermediate_size=64,
                           padded_vocab_size=96, vocab_size=96, mlp_class_name="LLaMAMLP", norm_class_name="RMSNorm",
                           parallel_residual=False, bias=False)
    torch.manual_seed(0)
    base = GPT(cfg).to(device)
    ours = GPT(cfg).to(device)
    ours.load_state_dict(base.state_dict())
    settings = dict(cuda_graphs=False, compile_min_tokens=0)  # (compile_min_tokens: lit-liger's ops at any size)
    apply_liger(base, LigerConfig(**settings))
    report = apply_liger(ours, LigerConfig(recompute_mlp=True, **settings))
    assert "recompute_mlp" in str(report)
    calls, graph_ops = [], {}
    real = swap_block.rms_norm_glu_mlp
    swap_block.rms_norm_glu_mlp = lambda *a, **k: calls.append(1) or real(*a, **k)

    def backend_for(name):
        def backend(gm, example_inputs):
            graph_ops[name] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
            return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)
        return backend

    try:
        x = torch.randint(0, 96, (2, 12), device=device)
        y = torch.randint(0, 96, (2, 12), device=device)
        losses = []
        for name, m in (("base", base), ("ours", ours)):
            if compiled:
                torch._dynamo.reset()
                m = torch.compile(m, fullgraph=True, backend=backend_for(name))
            loss = chunked_cross_entropy(m(x), y)
            loss.backward()
            losses.append(loss)
    finally:
        swap_block.rms_norm_glu_mlp = real
    assert len(calls) == 2  # one per Block, the recomputing model only (traced once when compiled)
    if compiled:
        count = {name: sum("rms_norm_glu_mlp" in o for o in ops) for name, ops in graph_ops.items()}
        assert count == {"base": 0, "ours": 2}, count
    assert torch.allclose(losses[0], losses[1], rtol=1e-6, atol=1e-6)
    for (n, p), q in zip(base.named_parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), n


@pytest.mark.parametrize("act,bias", [("silu", False), ("gelu_tanh", True)])
def test_under_compile_matches_eager(act, bias, device):
    """Under ``torch.compile(fullgraph=True)`` the function is the custom op ``lit_liger::rms_norm_glu_mlp``: the
    same outputs and gradients as eager mode's autograd function, bit for bit (the same implementations), and the
    traced graph calls the op (not the kept composition). ``aot_eager`` on CPU; inductor in the GPU test."""
    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    ins = _inputs(device, torch.float32, bias)
    leaves = [t for t in ins if t is not None]
    ds, dy = torch.randn(2, 9, C, device=device), torch.randn(2, 9, C, device=device)

    def f(*ins):
        return rms_norm_glu_mlp(*ins[:3], 1e-5, 1.0, *ins[3:], activation=act)

    s, y = f(*ins)
    eager = torch.autograd.grad((s, y), leaves, (ds, dy))
    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    s_c, y_c = torch.compile(f, fullgraph=True, backend=backend)(*ins)
    assert any("rms_norm_glu_mlp" in o for o in ops), ops
    assert not any("rms_norm_linear" in o or "glu_linear" in o for o in ops), ops
    torch._dynamo.reset()
    s_c, y_c = torch.compile(f, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")(*ins)
    compiled = torch.autograd.grad((s_c, y_c), leaves, (ds, dy))
    assert torch.equal(s, s_c) and torch.equal(y, y_c)
    for g, c in zip(eager, compiled):
        assert torch.equal(g, c)


def test_opcheck(device):
    """``torch.library.opcheck`` of the forward and backward ops: schemas and fake implementations (shapes, dtypes
    and the empty gradients of what needs none), and the forward op's registered autograd."""
    from lit_liger.kernels.swiglu import _norm_mlp_bwd, _norm_mlp_op

    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    x, res, nw, w1, b1, w2, b2, w3, b3 = _inputs(device, torch.float32, True)
    args = (x, res, nw, 1e-5, 1.0, w1, b1, w2, b2, w3, b3, "gelu_tanh")
    torch.library.opcheck(_norm_mlp_op, args, test_utils=("test_schema", "test_faketensor",
                                                           "test_autograd_registration"))
    s, rstd, _ = _norm_mlp_op(*(t.detach() if isinstance(t, torch.Tensor) else t for t in args))
    ds, dy = torch.randn_like(s), torch.randn_like(s)
    for needs in ([True] * 7, [False, True, False, False, True, True, False]):
        torch.library.opcheck(_norm_mlp_bwd, (ds, dy, s, nw.detach(), rstd, w1.detach(), b1.detach(), w2.detach(),
                                              b2.detach(), w3.detach(), 1e-5, 1.0, "gelu_tanh", True, needs),
                              test_utils=("test_schema", "test_faketensor"))
    grads = _norm_mlp_bwd(ds, dy, s, nw, rstd, w1, b1, w2, b2, w3, 1e-5, 1.0, "gelu_tanh", True,
                          [False, True, False, False, True, True, False])
    assert [tuple(g.shape) for g in grads] == [tuple(s.shape), (0,), (I, C), (0,), (0,), (I,), (C, I), (0,)]
