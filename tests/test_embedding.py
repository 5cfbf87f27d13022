import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from lit_liger.kernels.embedding import _embedding_bwd, embedding


def _capturing_backend(bw_ops):
    """An aot_autograd backend that runs the graphs as traced and appends the backward graph's call targets."""

    def bw_compiler(gm, _inputs):
        bw_ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=bw_compiler)


def _inputs(device, dtype, V=50, C=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, C, generator=g).to(device=device, dtype=dtype).requires_grad_()
    idx = torch.randint(0, V // 5, (3, 17), generator=g).to(device)  # many repeated ids
    dy = torch.randn(3, 17, C, generator=g).to(device=device, dtype=dtype)
    return w, idx, dy


def _stock_and_swapped(name, device):
    """A one-layer LitGPT ``GPT`` of ``name``'s family (vocabulary 128), stock and a copy with lit-liger applied (its
    report); the same weights."""
    from litgpt import Config
    from litgpt.model import GPT

    from lit_liger import apply_liger

    cfg = Config.from_name(name, n_layer=1, n_embd=32, n_head=2, n_query_groups=1, head_size=16,
                           intermediate_size=64, padded_vocab_size=128, vocab_size=128)
    torch.manual_seed(0)
    stock = GPT(cfg).to(device)
    ours = GPT(cfg).to(device)
    ours.load_state_dict(stock.state_dict())
    return stock, ours, apply_liger(ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_as_f_embedding(dtype, device):
    w, idx, dy = _inputs(device, dtype)
    out = embedding(w, idx)
    (gw,) = torch.autograd.grad(out, w, dy)
    ref = F.embedding(idx, w)
    (rw,) = torch.autograd.grad(ref, w, dy)
    assert torch.equal(out, ref)
    assert torch.equal(gw, rw)  # the same ATen kernel
    # and against fp64: repeated ids summed
    w64 = w.detach().double().requires_grad_()
    (r64,) = torch.autograd.grad(F.embedding(idx, w64), w64, dy.double())
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(gw.double(), r64, rtol=tol, atol=tol)


def test_compiled_backward_calls_the_op(device):
    """Under torch.compile (fullgraph) the weight's gradient comes from ``lit_liger::embedding_bwd``, read from the
    compiled backward graph, and equals eager mode's."""
    w, idx, dy = _inputs(device, torch.float32)
    bw_ops = []
    backend = _capturing_backend(bw_ops)
    torch._dynamo.reset()
    out = torch.compile(lambda w, i: embedding(w, i) * 2.0, fullgraph=True, backend=backend)(w, idx)
    (gw,) = torch.autograd.grad(out, w, dy)
    torch._dynamo.reset()
    (rw,) = torch.autograd.grad(F.embedding(idx, w) * 2.0, w, dy)
    assert torch.equal(gw, rw)
    assert sum("lit_liger.embedding_bwd" in o for o in bw_ops) == 1, bw_ops
    assert not any("embedding_dense_backward" in o for o in bw_ops), bw_ops


def test_embedding_bwd_custom_op_registration(device):
    w, idx, dy = _inputs(device, torch.float32)
    torch.library.opcheck(_embedding_bwd, (dy, idx, w.shape[0]), test_utils=("test_schema", "test_faketensor"))


def test_bad_inputs(device):
    w, idx, _ = _inputs(device, torch.float32)
    with pytest.raises(ValueError, match="2-D"):
        embedding(w[0], idx)
    with pytest.raises(TypeError, match="int32/int64"):
        embedding(w, idx.float())


def test_adapter_uses_it_only_under_compile(device):
    """A swapped GPT's ``transformer.wte`` runs ``nn.Embedding`` in eager mode and the op while torch.compile traces
    a training forward; loss and gradients match stock LitGPT either way (aot_eager: the same ATen kernels)."""
    from lit_liger import chunked_cross_entropy

    stock, ours, report = _stock_and_swapped("gemma-2-2b", device)
    assert any(kernel.startswith("embedding") for _, _, kernel in report.swapped), report
    x = torch.randint(0, 128, (2, 16), device=device)
    y = torch.randint(0, 128, (2, 16), device=device)
    from litgpt.utils import chunked_cross_entropy as stock_ce

    ref = stock_ce(stock(x), y)
    ref.backward()
    import lit_liger.swap.gpt as swap_gpt  # (the swapped embedding's forward: lit_liger/swap/gpt.py)

    eager_calls = []
    real = swap_gpt.embedding
    swap_gpt.embedding = lambda *a: eager_calls.append(1) or real(*a)
    try:
        chunked_cross_entropy(ours(x), y)  # eager mode: nn.Embedding's own forward
    finally:
        swap_gpt.embedding = real
    assert not eager_calls
    bw_ops = []
    backend = _capturing_backend(bw_ops)
    torch._dynamo.reset()
    loss = chunked_cross_entropy(torch.compile(ours, backend=backend)(x), y)
    loss.backward()
    torch._dynamo.reset()
    assert sum("lit_liger.embedding_bwd" in o for o in bw_ops) == 1, bw_ops
    assert torch.allclose(loss, ref, rtol=1e-4, atol=1e-5)
    g, r = ours.transformer.wte.weight.grad, stock.transformer.wte.weight.grad
    assert torch.allclose(g, r, rtol=1e-3, atol=1e-5), (g - r).abs().max()


# -- the weight's gradient added into a named tensor (kernels._grad_into, lit-liger's captured steps) ----------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_grad_into_adds_each_touched_row_once(dtype, idx_dtype, device):
    """``embedding_grad_into_`` adds the gradient into ``target`` (the rows a micro-batch touches, repeated ids
    summed, the other rows bit for bit unchanged) as fp64 math says; the gradient may be a non-contiguous view."""
    from lit_liger.kernels.embedding import embedding_grad_into_

    w, idx, dy = _inputs(device, dtype, V=50, C=40)
    idx = idx.to(idx_dtype)
    dy = dy.transpose(0, 1).contiguous().transpose(0, 1)  # (3, 17, C) with strides of (17, 3, C)
    assert not dy.is_contiguous()
    target = torch.randn(50, 40, generator=torch.Generator().manual_seed(3)).to(device=device, dtype=dtype)
    before = target.clone()
    embedding_grad_into_(target, idx, dy)
    want = before.double().index_add_(0, idx.reshape(-1).long(), dy.reshape(-1, 40).double())
    touched = torch.zeros(50, dtype=torch.bool, device=device)
    touched[idx.reshape(-1).long()] = True
    assert touched.sum() < 50  # (some rows untouched)
    assert torch.equal(target[~touched], before[~touched])
    err = ((target.double() - want)[touched].norm() / want[touched].norm()).item()
    assert err < (1e-6 if dtype == torch.float32 else 1e-2), err
    assert not torch.equal(target[touched], before[touched])


def test_grad_into_matches_the_reference_path(device):
    """The Triton kernel (CUDA, the interpreter) and the PyTorch path give the same sums."""
    from lit_liger.kernels.embedding import embedding_grad_into_, embedding_grad_into_reference

    w, idx, dy = _inputs(device, torch.float32, V=30, C=70)
    a = torch.randn(30, 70, device=device)
    b = a.clone()
    embedding_grad_into_(a, idx, dy)
    embedding_grad_into_reference(b, idx, dy)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="pair up"):
        embedding_grad_into_(a, idx, dy[..., :5])


def test_inside_grads_into_the_gradient_goes_into_the_target(device):
    """Inside ``grads_into`` the op hands autograd no weight gradient and adds it into the target (recorded as
    written); the output and the input gradients are F.embedding's. Outside, the weight's gradient as before."""
    from lit_liger.kernels._grad_into import grads_into

    w, idx, dy = _inputs(device, torch.float32)
    target = torch.zeros_like(w)
    with grads_into([(w, target)]) as written:
        out = embedding(w, idx)
        out.backward(dy)
        assert id(target) in written
    assert w.grad is None
    ref = F.embedding(idx, w)
    (rw,) = torch.autograd.grad(ref, w, dy)
    assert torch.equal(out, ref)
    torch.testing.assert_close(target, rw, rtol=1e-6, atol=1e-6)
    out = embedding(w, idx)  # (outside: autograd's gradient)
    out.backward(dy)
    assert torch.equal(w.grad, rw)


def test_swapped_wte_adds_into_grad(device):
    """Inside a capture's ``grads_into`` a swapped GPT's ``transformer.wte`` adds its gradient into the named tensor
    (always: the retired ``EMBEDDING_GRAD_INTO`` switch's winner); the loss and the other gradients are stock's."""
    from lit_liger import chunked_cross_entropy
    from lit_liger.kernels._grad_into import grads_into

    stock, ours, _ = _stock_and_swapped("Llama-3.2-1B", device)
    x = torch.randint(0, 128, (2, 16), device=device)
    from litgpt.utils import chunked_cross_entropy as stock_ce

    stock_ce(stock(x), x).backward()
    wte = ours.transformer.wte.weight
    target = torch.zeros_like(wte)
    with grads_into([(wte, target)]) as written:
        chunked_cross_entropy(ours(x), x).backward()
    ref = stock.transformer.wte.weight.grad
    assert id(target) in written and wte.grad is None
    torch.testing.assert_close(target, ref, rtol=1e-4, atol=1e-6)
    g, r = ours.lm_head.weight.grad, stock.lm_head.weight.grad
    torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-5)


def test_capture_warm_up_launches_the_kernel_on_a_zero_gradient(device, monkeypatch):
    """``graphs._warm_grads_into``: the capture's warm-up launches the embedding's kernel once into the embedding's
    gradient buffer (so that it is compiled and loaded outside the capture), leaving the buffer's values as they
    were."""
    import importlib

    import lit_liger.runtime.graphs as graphs

    emb_mod = importlib.import_module("lit_liger.kernels.embedding")  # (the package exports the function's name)
    _, gpt, _ = _stock_and_swapped("Llama-3.2-1B", device)
    params = [p for p in gpt.parameters() if p.requires_grad]
    bufs = [torch.randn_like(p) for p in params]
    before = [b.clone() for b in bufs]
    calls = []
    real = emb_mod.embedding_grad_into_
    monkeypatch.setattr(emb_mod, "embedding_grad_into_", lambda t, i, g: calls.append(t) or real(t, i, g))
    graphs._warm_grads_into(gpt, params, bufs, torch.int64)
    wte_buf = bufs[[id(p) for p in params].index(id(gpt.transformer.wte.weight))]
    assert [id(t) for t in calls] == [id(wte_buf)]
    assert all(torch.equal(a, b) for a, b in zip(bufs, before))
