"""``gelu`` and ``gelu_linear`` (GptNeoxMLP's GELU and GELU + proj) against fp64 PyTorch and LitGPT's MLP."""

import pytest
import torch
import torch.nn.functional as F
from helpers import TOL, rel_err, saved_bytes
from litgpt import Config
from litgpt.model import GptNeoxMLP

from lit_liger.kernels.gelu import gelu, gelu_linear, gelu_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 5, 77), (2, 1030), (1,), (1, 1, 96)])
def test_gelu_matches_fp64(approximate, shape, dtype, device):
    torch.manual_seed(0)
    a = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()
    a64 = a.detach().double().requires_grad_()
    ref = F.gelu(a64, approximate=approximate)
    out = gelu(a, approximate)
    assert out.dtype == dtype and out.shape == a.shape
    assert rel_err(out, ref) <= TOL[dtype]
    dy = torch.randn(shape, device=device).to(dtype)
    (g,) = torch.autograd.grad(out, a, dy)
    (g_ref,) = torch.autograd.grad(ref, a64, dy.double())
    assert g.dtype == dtype and rel_err(g, g_ref) <= TOL[dtype]


def test_gelu_extreme_inputs(device):
    a = torch.tensor([-1e4, -40.0, -8.0, -1e-6, 0.0, 1e-6, 8.0, 40.0, 1e4], device=device, requires_grad=True)
    for approximate in ("none", "tanh"):
        out = gelu(a, approximate)
        (g,) = torch.autograd.grad(out.sum(), a)
        a64 = a.detach().double().requires_grad_()
        ref = F.gelu(a64, approximate=approximate)
        (g_ref,) = torch.autograd.grad(ref.sum(), a64)
        assert torch.isfinite(out).all() and torch.isfinite(g).all()
        assert torch.allclose(out.double(), ref, atol=1e-5, rtol=1e-5)
        assert torch.allclose(g.double(), g_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("I", [80, 131])
def test_gelu_non_contiguous(I, device):
    torch.manual_seed(1)
    leaf = torch.randn(4, 6, 2 * I, device=device, requires_grad=True)
    for a in (leaf[:, ::2, :I], leaf.transpose(0, 1)[..., 1:I + 1], leaf[..., ::2]):  # row-strided, transposed, strided
        out = gelu(a)
        ref = F.gelu(a.double())
        assert out.is_contiguous() and rel_err(out, ref) <= 1e-5
        dy = torch.randn_like(out)
        (g,) = torch.autograd.grad(out, leaf, dy)
        (g_ref,) = torch.autograd.grad(F.gelu(a), leaf, dy)
        assert rel_err(g, g_ref) <= 1e-5


def test_gelu_empty_bad_inputs_and_meta(device):
    assert gelu(torch.empty(0, 5, device=device)).shape == (0, 5)
    with pytest.raises(ValueError, match="approximate"):
        gelu(torch.randn(3, device=device), "erf")
    with pytest.raises(TypeError):
        gelu(torch.randn(3, device=device).long())
    with pytest.raises(ValueError, match="weight shape"):
        gelu_linear(torch.randn(2, 8, device=device), torch.randn(4, 7, device=device))
    with pytest.raises(ValueError, match="bias shape"):
        gelu_linear(torch.randn(2, 8, device=device), torch.randn(4, 8, device=device), torch.randn(5, device=device))
    a = torch.randn(2, 3, 8, device="meta")
    assert gelu(a).device.type == "meta" and gelu_linear(a, torch.randn(4, 8, device="meta")).shape == (2, 3, 4)
    assert torch.ops.lit_liger.gelu_bwd(a, a, "gelu").shape == a.shape


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_linear_matches_fp64_and_saves_less(approximate, with_bias, dtype, device):
    """``proj(gelu(a))``: output and the gradients of a, weight and bias against fp64; only ``a`` (and the weight)
    kept for backward, not ``gelu(a)``."""
    torch.manual_seed(2)
    N, I, C = 13, 96, 40
    a = (torch.randn(N, I, device=device) * 2).to(dtype).requires_grad_()
    w = (torch.randn(C, I, device=device) * I**-0.5).to(dtype).requires_grad_()
    b = (torch.randn(C, device=device) * 0.1).to(dtype).requires_grad_() if with_bias else None
    leaves = [t for t in (a, w, b) if t is not None]
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = F.linear(F.gelu(l64[0], approximate=approximate), l64[1], l64[2] if with_bias else None)
    out, kept = saved_bytes(lambda: gelu_linear(a, w, b, approximate), exclude=[w])
    _, kept_plain = saved_bytes(lambda: F.linear(F.gelu(a, approximate=approximate), w, b), exclude=[w])
    assert kept == a.numel() * a.element_size() and kept_plain == 2 * kept
    assert rel_err(out, ref) <= TOL[dtype]
    dy = torch.randn(N, C, device=device).to(dtype)
    g = torch.autograd.grad(out, leaves, dy)
    g_ref = torch.autograd.grad(ref, l64, dy.double())
    for x, y, t in zip(g, g_ref, leaves):
        assert x.dtype == t.dtype and x.shape == t.shape
        assert rel_err(x, y) <= TOL[dtype]


@pytest.mark.parametrize("need", ["a", "w", "aw"])
def test_gelu_linear_each_gradient_alone_and_custom_op_equals_eager(need, device):
    torch.manual_seed(3)
    a = torch.randn(2, 5, 33, device=device, requires_grad="a" in need)
    w = torch.randn(7, 33, device=device, requires_grad="w" in need)
    b = torch.randn(7, device=device)
    dy = torch.randn(2, 5, 7, device=device)
    leaves = [t for t in (a, w) if t.requires_grad]
    out = gelu_linear(a, w, b, "tanh")
    g = torch.autograd.grad(out, leaves, dy)
    out_op = torch.ops.lit_liger.gelu_linear(a, w, b, "gelu_tanh")
    g_op = torch.autograd.grad(out_op, leaves, dy)
    ref = F.linear(F.gelu(a, approximate="tanh"), w, b)
    g_ref = torch.autograd.grad(ref, leaves, dy)
    assert torch.equal(out, out_op) and rel_err(out, ref) <= 1e-5
    for x, y, z in zip(g, g_op, g_ref):
        assert torch.equal(x, y) and rel_err(x, z) <= 1e-5
    out = gelu(a, "none")  # the plain op through the dispatcher, too
    assert torch.equal(out, torch.ops.lit_liger.gelu_fwd(a, "gelu"))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_inside_litgpt_mlp(approximate, device):
    """LitGPT's GptNeoxMLP with the GELU replaced by the op equals LitGPT's."""
    torch.manual_seed(4)
    cfg = Config(n_embd=48, n_head=4, intermediate_size=80, gelu_approximate=approximate, bias=True)
    mlp = GptNeoxMLP(cfg).to(device)
    x = torch.randn(2, 3, 48, device=device, requires_grad=True)
    ref = mlp(x)
    out = gelu_linear(mlp.fc(x), mlp.proj.weight, mlp.proj.bias, approximate)
    assert rel_err(out, ref) <= 1e-5
    dy = torch.randn_like(ref)
    params = [x, *mlp.parameters()]
    for g, g_ref in zip(torch.autograd.grad(out, params, dy), torch.autograd.grad(ref, params, dy)):
        assert rel_err(g, g_ref) <= 1e-5


def test_gelu_reference_path_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    a, w = torch.randn(3, 24, requires_grad=True), torch.randn(5, 24)
    out = gelu(a, "tanh")
    assert "lit_liger" not in type(out.grad_fn).__name__
    assert torch.equal(out, gelu_reference(a, "tanh"))
    assert rel_err(gelu_linear(a, w), F.linear(F.gelu(a), w)) <= 1e-6


@pytest.mark.gpu
def test_gelu_gpu_real_size_and_compile():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    a = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(2048, 8192, device="cuda") * 8192**-0.5).to(torch.bfloat16).requires_grad_()

    def f(a, w):
        return gelu_linear(a, w, None, "none").float().square().mean() + gelu(a, "tanh").float().mean()

    eager = f(a, w)
    g_eager = torch.autograd.grad(eager, (a, w))
    compiled = torch.compile(f, fullgraph=True)(a, w)
    g_comp = torch.autograd.grad(compiled, (a, w))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert rel_err(compiled, eager) <= 1e-2
    for g, h in zip(g_comp, g_eager):
        assert rel_err(g, h) <= 1e-2
