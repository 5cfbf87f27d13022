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
    from litgpt import Config
    from litgpt.model import GPT

    from lit_liger import apply_liger, chunked_cross_entropy

    cfg = Config.from_name("gemma-2-2b", n_layer=1, n_embd=32, n_head=2, n_query_groups=1, head_size=16,
                           intermediate_size=64, padded_vocab_size=128, vocab_size=128)
    torch.manual_seed(0)
    stock = GPT(cfg).to(device)
    ours = GPT(cfg).to(device)
    ours.load_state_dict(stock.state_dict())
    report = apply_liger(ours)
    assert any(kernel.startswith("embedding") for _, _, kernel in report.swapped), report
    x = torch.randint(0, 128, (2, 16), device=device)
    y = torch.randint(0, 128, (2, 16), device=device)
    from litgpt.utils import chunked_cross_entropy as stock_ce

    ref = stock_ce(stock(x), y)
    ref.backward()
    import lit_liger.adapter as adapter

    eager_calls = []
    real = adapter.embedding
    adapter.embedding = lambda *a: eager_calls.append(1) or real(*a)
    try:
        chunked_cross_entropy(ours(x), y)  # eager mode: nn.Embedding's own forward
    finally:
        adapter.embedding = real
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
