import pytest
import torch
from helpers import TOL, rel_err

from lit_liger.kernels.layer_norm import layer_norm, layer_norm_dual, layer_norm_reference, layer_norm_residual


def _torch_norm(H, affine, bias, device, dtype):
    """``torch.nn.LayerNorm`` as LitGPT builds it (``elementwise_affine=False`` for OLMo-1)."""
    m = torch.nn.LayerNorm(H, eps=1e-5, elementwise_affine=affine, bias=bias).to(device=device, dtype=dtype)
    with torch.no_grad():
        if m.weight is not None:
            m.weight.copy_(torch.randn(H) * 0.5 + 1.0)
        if m.bias is not None:
            m.bias.copy_(torch.randn(H) * 0.5)
    return m


def _fp64_grads(x, w, b, dy, eps=1e-5):
    """Gradients of F.layer_norm in fp64 w.r.t. x and whichever of w, b exist."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = torch.nn.functional.layer_norm(leaves[0], (x.shape[-1],), leaves[1], leaves[2], eps)
    present = [t for t in leaves if t is not None]
    return torch.autograd.grad(y, present, dy.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 96), (1, 1, 40), (5, 130)])
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_layer_norm_matches_torch(shape, dtype, affine, bias, device):
    torch.manual_seed(0)
    H = shape[-1]
    m = _torch_norm(H, affine, bias, device, dtype)
    x = (torch.randn(shape, device=device) * 2 + 0.7).to(dtype).requires_grad_()
    w = m.weight.detach().clone().requires_grad_() if m.weight is not None else None
    b = m.bias.detach().clone().requires_grad_() if m.bias is not None else None
    ref = m(x)
    out = layer_norm(x, w, b, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref) <= TOL[dtype]
    dy = torch.randn_like(ref)
    params = [p for p in (w, b) if p is not None]
    g = torch.autograd.grad(out, [x, *params], dy)
    g_mod = torch.autograd.grad(ref, [x, *[p for p in (m.weight, m.bias) if p is not None]], dy)
    assert rel_err(g[0], g_mod[0]) <= TOL[dtype]
    # dW / dB sum over rows: compare with fp64 so the rounding of torch's own 16-bit result stays out
    g64 = _fp64_grads(x, w, b, dy)
    for p, gp, gp64 in zip(params, g[1:], g64[1:]):
        assert gp.dtype == p.dtype and gp.shape == p.shape
        assert rel_err(gp, gp64) <= max(TOL[dtype], 1e-5)


def test_layer_norm_bias_only(device):
    # F.layer_norm accepts a bias without a weight; so does the op
    torch.manual_seed(1)
    x = torch.randn(6, 33, device=device, requires_grad=True)
    b = torch.randn(33, device=device, requires_grad=True)
    out = layer_norm(x, None, b)
    assert rel_err(out, torch.nn.functional.layer_norm(x.double(), (33,), None, b.double())) <= 1e-5
    dy = torch.randn_like(out)
    for g, g64 in zip(torch.autograd.grad(out, (x, b), dy), _fp64_grads(x, None, b, dy)):
        assert rel_err(g, g64) <= 1e-5


def test_layer_norm_non_contiguous(device):
    torch.manual_seed(2)
    base = torch.randn(4, 6, 2 * 72, device=device) + 1.5
    x = base[..., ::2].clone().requires_grad_()[:, ::2]  # row-strided view of a leaf
    w = torch.randn(72, device=device, requires_grad=True)
    b = torch.randn(72, device=device, requires_grad=True)
    out = layer_norm(x, w, b)
    ref = torch.nn.functional.layer_norm(x.double(), (72,), w.double(), b.double())
    assert rel_err(out, ref) <= 1e-5
    xt = base.transpose(0, 1)[..., :72]  # last-dim contiguous, not viewable as rows
    xt_ref = torch.nn.functional.layer_norm(xt.double(), (72,), w.double(), b.double())
    assert rel_err(layer_norm(xt, w, b), xt_ref) <= 1e-5
    dy = torch.randn_like(out)
    g = torch.autograd.grad(out, (x, w, b), dy)
    for a, a64 in zip(g, _fp64_grads(x, w, b, dy)):
        assert rel_err(a, a64) <= 1e-5
    # an expanded (stride-0) grad_output, as from .sum()
    g = torch.autograd.grad(layer_norm(x, w, b).sum(), (x, w, b))
    for a, a64 in zip(g, _fp64_grads(x, w, b, torch.ones_like(out))):
        assert rel_err(a, a64) <= 1e-5


def test_layer_norm_frozen_params(device):
    torch.manual_seed(3)
    x = torch.randn(3, 50, device=device, requires_grad=True)
    w = torch.randn(50, device=device)
    b = torch.randn(50, device=device, requires_grad=True)
    dy = torch.randn(3, 50, device=device)
    out = layer_norm(x, w, b)
    gx, gb = torch.autograd.grad(out, (x, b), dy)
    g64 = _fp64_grads(x, w, b, dy)
    assert rel_err(gx, g64[0]) <= 1e-5 and rel_err(gb, g64[2]) <= 1e-5
    # only the weight trains (frozen input and bias)
    w.requires_grad_()
    (gw,) = torch.autograd.grad(layer_norm(x.detach(), w, b.detach()), (w,), dy)
    assert rel_err(gw, g64[1]) <= 1e-5
    # nothing requires grad
    assert not layer_norm(x.detach(), w.detach(), b.detach()).requires_grad


def test_layer_norm_mixed_param_dtype(device):
    # bf16 activations with fp32 parameters (mixed precision): output in x.dtype, grads in each param's dtype
    torch.manual_seed(4)
    x = torch.randn(5, 48, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(48, device=device, requires_grad=True)
    b = torch.randn(48, device=device, requires_grad=True)
    out = layer_norm(x, w, b)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, torch.nn.functional.layer_norm(x.double(), (48,), w.double(), b.double())) <= 1e-2
    gx, gw, gb = torch.autograd.grad(out, (x, w, b), torch.ones_like(out))
    assert (gx.dtype, gw.dtype, gb.dtype) == (torch.bfloat16, torch.float32, torch.float32)


def test_layer_norm_bad_inputs(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="last dimension"):
        layer_norm(x, torch.ones(8, device=device))
    with pytest.raises(ValueError, match="last dimension"):
        layer_norm(x, None, torch.ones(8, device=device))
    with pytest.raises(TypeError, match="float"):
        layer_norm(x.long(), torch.ones(16, device=device))
    with pytest.raises(TypeError, match="float"):
        layer_norm(x, torch.ones(16, device=device, dtype=torch.int32))
    with pytest.raises(ValueError, match="1-D"):
        layer_norm(x, torch.ones(2, 8, device=device))
    with pytest.raises(ValueError, match="1-D"):
        layer_norm(x, None, torch.ones(1, 16, device=device))
    with pytest.raises(TypeError, match="Tensor"):
        layer_norm(x, 1.0)
    if device == "cpu":
        with pytest.raises(ValueError, match="device"):
            layer_norm(x, torch.ones(16, device="meta"))
        with pytest.raises(ValueError, match="device"):
            layer_norm(x, torch.ones(16), torch.zeros(16, device="meta"))


@pytest.mark.parametrize("form", ["plain", "residual", "dual"])
def test_layer_norm_eager_path_equals_custom_op(form, device):
    # eager layer_norm runs the autograd.Function fast path; torch.compile traces the custom op
    from lit_liger.kernels.layer_norm import _fwd

    torch.manual_seed(9)
    m = _torch_norm(40, True, True, device, torch.float32)
    x = torch.randn(3, 5, 40, device=device, requires_grad=True)
    r = torch.randn(3, 5, 40, device=device, requires_grad=True) if form == "residual" else None
    w2, b2 = ((torch.randn(40, device=device, requires_grad=True), None) if form == "dual" else (None, None))
    args = (x, r, m.weight, m.bias, w2, b2, 1e-5, form == "dual")
    outs = _fwd(*args)
    assert "LayerNormFn" in type(outs[0].grad_fn).__name__
    assert not outs[3].requires_grad and not outs[4].requires_grad  # mean, rstd
    outs_op = torch.ops.lit_liger.layer_norm_fwd(*args)
    leaves = [t for t in (x, r, m.weight, m.bias, w2) if t is not None]
    used = [0] + ([1] if form == "residual" else []) + ([2] if form == "dual" else [])
    dys = [torch.randn(3, 5, 40, device=device) for _ in used]
    g = torch.autograd.grad([outs[i] for i in used], leaves, dys)
    g_op = torch.autograd.grad([outs_op[i] for i in used], leaves, dys)
    for a, b in zip((*outs, *g), (*outs_op, *g_op)):
        assert torch.equal(a, b)
    assert torch.equal(layer_norm(x, m.weight, m.bias), outs_op[0]) or form == "residual"


def test_layer_norm_meta_device():
    x = torch.randn(2, 5, 32, device="meta")
    w, b = torch.ones(32, device="meta"), torch.zeros(32, device="meta")
    assert layer_norm(x, w, b).shape == x.shape and layer_norm(x).device.type == "meta"
    y, s, y2, mean, rstd = torch.ops.lit_liger.layer_norm_fwd(x, x, w, None, w, b, 1e-5, True)
    assert y.shape == s.shape == y2.shape == x.shape and mean.shape == rstd.shape == (10,)
    assert rstd.dtype == torch.float32
    dx, dw, db, dw2, db2 = torch.ops.lit_liger.layer_norm_bwd(y, y2, s, x, w, w, mean, rstd, [True, False, True, True])
    assert dx.shape == x.shape and dw.shape == dw2.shape == db2.shape == (32,) and db.numel() == 0
    s, n = layer_norm_residual(x, x, w, b)
    n1, n2 = layer_norm_dual(x, w, b, None, None)
    assert s.shape == n.shape == n1.shape == n2.shape == x.shape


def test_layer_norm_reference_path_without_interpreter(monkeypatch):
    # CPU tensors without the interpreter take the reference math (still correct)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(5)
    m = _torch_norm(24, True, True, "cpu", torch.float32)
    x = torch.randn(3, 24, requires_grad=True)
    out = layer_norm(x, m.weight, m.bias)
    assert "lit_liger" not in type(out.grad_fn).__name__
    assert rel_err(out, m(x)) <= 1e-6
    assert rel_err(layer_norm(x), layer_norm_reference(x)) == 0.0


def _params(H, affine, bias, device, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(H, generator=g) * 0.5 + 1.0).to(device, dtype).requires_grad_() if affine else None
    b = (torch.randn(H, generator=g) * 0.5).to(device, dtype).requires_grad_() if bias else None
    return w, b


def _grads_close(outs, refs, leaves, ref_leaves, dtype):
    """Forward outputs, then the gradients of every leaf for random output gradients; parameter gradients (sums
    over rows) against fp64."""
    for o, r in zip(outs, refs):
        assert o.dtype == dtype and o.shape == r.shape
        assert rel_err(o, r) <= TOL[dtype]
    dys = [torch.randn_like(r) for r in refs]
    g = torch.autograd.grad(outs, leaves, dys)
    g_ref = torch.autograd.grad(refs, ref_leaves, [d.to(r.dtype) for d, r in zip(dys, refs)])
    for name_i, (a, b) in enumerate(zip(g, g_ref)):
        assert a.dtype == leaves[name_i].dtype and a.shape == leaves[name_i].shape
        assert rel_err(a, b) <= max(TOL[dtype], 1e-5), name_i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 96), (1, 1, 40), (5, 130)])
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_layer_norm_residual_matches_torch(shape, dtype, affine, bias, device):
    """``(s, norm(s))`` with ``s = x + residual``: both outputs used downstream (the sum is the Block's next
    residual), gradients of x, residual, weight and bias against fp64 PyTorch."""
    torch.manual_seed(2)
    H = shape[-1]
    x = (torch.randn(shape, device=device) * 2 + 0.7).to(dtype).requires_grad_()
    r = torch.randn(shape, device=device).to(dtype).requires_grad_()
    w, b = _params(H, affine, bias, device, dtype, 3)
    leaves = [t for t in (x, r, w, b) if t is not None]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    rl = dict(zip([n for n, t in zip("xrwb", (x, r, w, b)) if t is not None], ref_leaves))
    s_ref = rl["x"] + rl["r"]
    n_ref = torch.nn.functional.layer_norm(s_ref, (H,), rl.get("w"), rl.get("b"), 1e-5)
    s, n = layer_norm_residual(x, r, w, b, 1e-5)
    # the sum rounded to x's dtype, as LitGPT's add (bit for bit in fp32; the interpreter's bf16 rounding may differ)
    assert rel_err(s, x + r) == 0.0 if dtype == torch.float32 else rel_err(s, x + r) <= TOL[dtype]
    _grads_close([s, n], [s_ref, n_ref], leaves, ref_leaves, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 96), (1, 1, 40), (5, 130)])
@pytest.mark.parametrize("affine", [(True, True, True, True), (True, False, False, True), (False, False, False, False)])
def test_layer_norm_dual_matches_torch(shape, dtype, affine, device):
    """Two LayerNorms of one x (a parallel-residual Block's norm_1 and norm_2), each with its own weight / bias or
    none: outputs and the gradients of x and every parameter against fp64 PyTorch."""
    torch.manual_seed(4)
    H = shape[-1]
    x = (torch.randn(shape, device=device) * 2 - 0.3).to(dtype).requires_grad_()
    w1, b1 = _params(H, affine[0], affine[1], device, dtype, 5)
    w2, b2 = _params(H, affine[2], affine[3], device, dtype, 6)
    leaves = [t for t in (x, w1, b1, w2, b2) if t is not None]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    x64, w1_, b1_, w2_, b2_ = (next(it) if t is not None else None for t in (x, w1, b1, w2, b2))
    F = torch.nn.functional
    refs = [F.layer_norm(x64, (H,), w1_, b1_, 1e-5), F.layer_norm(x64, (H,), w2_, b2_, 1e-5)]
    outs = layer_norm_dual(x, w1, b1, w2, b2, 1e-5)
    _grads_close(list(outs), refs, leaves, ref_leaves, dtype)


def test_layer_norm_residual_and_dual_non_contiguous_and_partly_used(device):
    """Row-strided and transposed views; only one output used (the other gets no gradient); frozen parameters."""
    torch.manual_seed(8)
    base = torch.randn(4, 6, 2 * 72, device=device) + 0.5
    x = base[..., ::2].clone().requires_grad_()
    xv = x[:, ::2]  # row-strided view of a leaf
    r_leaf = torch.randn(3, 4, 100, device=device, requires_grad=True)
    r = r_leaf.transpose(0, 1)[..., :72]  # (4, 3, 72): last dim contiguous, not viewable as rows
    w, b = torch.randn(72, device=device), torch.randn(72, device=device, requires_grad=True)
    s, n = layer_norm_residual(xv, r, w, b)
    s_ref = xv + r
    n_ref = torch.nn.functional.layer_norm(s_ref, (72,), w, b)
    assert rel_err(n, n_ref) <= 1e-5
    dy = torch.randn_like(n)
    g = torch.autograd.grad(n, (x, r_leaf, b), dy)  # the sum unused downstream
    g_ref = torch.autograd.grad(n_ref, (x, r_leaf, b), dy)
    for a, c in zip(g, g_ref):
        assert rel_err(a, c) <= 1e-5
    xt = base.transpose(0, 1)[..., :72].detach().requires_grad_()  # last-dim contiguous, not viewable as rows
    w2 = torch.randn(72, device=device, requires_grad=True)
    y1, y2 = layer_norm_dual(xt, None, b, w2, None)
    ref2 = torch.nn.functional.layer_norm(xt, (72,), w2, None)
    assert rel_err(y1, torch.nn.functional.layer_norm(xt, (72,), None, b)) <= 1e-5
    dy = torch.randn_like(y2)
    g = torch.autograd.grad(y2, (xt, w2), dy)  # only the second output used
    g_ref = torch.autograd.grad(ref2, (xt, w2), dy)
    for a, c in zip(g, g_ref):
        assert rel_err(a, c) <= 1e-5


def test_layer_norm_residual_and_dual_bad_inputs(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="residual shape"):
        layer_norm_residual(x, torch.randn(4, 8, device=device))
    with pytest.raises(TypeError, match="residual"):
        layer_norm_residual(x, x.double())
    with pytest.raises(ValueError, match="weight2"):
        layer_norm_dual(x, None, None, torch.ones(8, device=device), None)


def test_layer_norm_residual_and_dual_reference_path_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(5)
    x, r, w, b = torch.randn(3, 24), torch.randn(3, 24), torch.randn(24), torch.randn(24)
    s, n = layer_norm_residual(x, r, w, b)
    assert torch.equal(s, x + r) and rel_err(n, torch.nn.functional.layer_norm(x + r, (24,), w, b)) <= 1e-6
    y1, y2 = layer_norm_dual(x, w, b, None, b)
    assert rel_err(y2, torch.nn.functional.layer_norm(x, (24,), None, b)) <= 1e-6


# ----------------------------------------------------------------------------------------------
# GPU: real sizes and torch.compile
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("H", [2048, 2560, 4544])
def test_layer_norm_gpu_real_size(H):
    torch.manual_seed(6)
    m = _torch_norm(H, True, True, "cuda", torch.bfloat16)
    x = torch.randn(4, 2047, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = m.weight.detach().clone().requires_grad_()
    b = m.bias.detach().clone().requires_grad_()
    ref, out = m(x), layer_norm(x, w, b)
    assert rel_err(out, ref) <= TOL[torch.bfloat16]
    dy = torch.randn_like(ref)
    g = torch.autograd.grad(out, (x, w, b), dy)
    assert rel_err(g[0], torch.autograd.grad(ref, x, dy, retain_graph=True)[0]) <= TOL[torch.bfloat16]
    for a, a64 in zip(g[1:], _fp64_grads(x, w, b, dy)[1:]):
        assert rel_err(a, a64) <= TOL[torch.bfloat16]


@pytest.mark.gpu
def test_layer_norm_gpu_compile_fullgraph():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(x, w, b):
        return layer_norm(x, w, b).float().square().mean() + layer_norm(x).float().mean()

    x = torch.randn(8, 33, 320, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(320, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(320, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = f(x, w, b)
    g_eager = torch.autograd.grad(eager, (x, w, b))
    compiled = torch.compile(f, fullgraph=True)(x, w, b)
    g_comp = torch.autograd.grad(compiled, (x, w, b))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert rel_err(compiled, eager) <= 1e-2
    for g, h in zip(g_comp, g_eager):
        assert rel_err(g, h) <= 1e-2
