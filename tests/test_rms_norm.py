import pytest
import torch
from helpers import TOL, rel_err, saved_bytes
from litgpt.model import RMSNorm

from lit_liger.kernels import rms_norm, rms_norm_linear, rms_norm_residual
from lit_liger.kernels.rms_norm import rms_norm_reference


def _litgpt_norm(H, offset, eps, device, dtype):
    m = RMSNorm(H, eps=eps, add_unit_offset=bool(offset)).to(device=device, dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(torch.randn(H) * 0.5 + (0.0 if offset else 1.0))
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7, 96), (1, 1, 40), (5, 130)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_litgpt(shape, dtype, offset, device):
    torch.manual_seed(0)
    H = shape[-1]
    m = _litgpt_norm(H, offset, 1e-5, device, dtype)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    w = m.weight.detach().clone().requires_grad_(True)
    ref = m(x)
    out = rms_norm(x, w, 1e-5, offset)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref) <= TOL[dtype]
    dy = torch.randn_like(ref)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, m.weight), dy)
    gx, gw = torch.autograd.grad(out, (x, w), dy)
    assert gw.dtype == w.dtype
    assert rel_err(gx, gx_ref) <= TOL[dtype]
    # the weight gradient sums over rows; compare with an fp64 reference to keep bf16 rounding of the
    # reference itself out of the check
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = rms_norm_reference(x64, w64, 1e-5, offset)
    gw64 = torch.autograd.grad(y64, w64, dy.double())[0]
    assert rel_err(gw, gw64) <= max(TOL[dtype], 1e-5)
    assert rel_err(gw_ref, gw64) <= max(TOL[dtype], 1e-5)


def test_rms_norm_non_contiguous(device):
    torch.manual_seed(1)
    base = torch.randn(4, 6, 2 * 72, device=device)
    x = base[..., ::2].requires_grad_(False)  # last-dim stride 2
    x = x.clone().requires_grad_(True)[:, ::2]  # row-strided view
    w = torch.randn(72, device=device, requires_grad=True)
    ref = rms_norm_reference(x, w, 1e-6)
    out = rms_norm(x, w, 1e-6)
    assert rel_err(out, ref) <= 1e-5
    xt = base.transpose(0, 1)[..., :72]
    assert rel_err(rms_norm(xt, w, 1e-6), rms_norm_reference(xt, w, 1e-6)) <= 1e-5
    dy = torch.randn_like(out)
    g = torch.autograd.grad(out, (x, w), dy)
    g_ref = torch.autograd.grad(ref, (x, w), dy)
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_residual(dtype, device):
    torch.manual_seed(2)
    H = 80
    m = _litgpt_norm(H, 0.0, 1e-6, device, dtype)
    x = torch.randn(2, 9, H, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn(2, 9, H, device=device, dtype=dtype, requires_grad=True)
    w = m.weight.detach().clone().requires_grad_(True)
    s_ref = x + r
    y_ref = m(s_ref)
    s, y = rms_norm_residual(x, r, w, 1e-6)
    # fp32: bit-exact; 16-bit: Triton's interpreter rounds fp32->bf16 by truncation, the GPU to nearest
    assert rel_err(s, s_ref) == 0.0 if dtype == torch.float32 else rel_err(s, s_ref) <= TOL[dtype]
    assert rel_err(y, y_ref) <= TOL[dtype]
    ds, dy = torch.randn_like(s), torch.randn_like(y)
    g_ref = torch.autograd.grad((s_ref, y_ref), (x, r, m.weight), (ds, dy))
    g = torch.autograd.grad((s, y), (x, r, w), (ds, dy))
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) <= TOL[dtype]
    # only the normalized output used downstream
    g_ref = torch.autograd.grad(m(x + r), (x,), dy)[0]
    s2, y2 = rms_norm_residual(x, r, w, 1e-6)
    assert rel_err(torch.autograd.grad(y2, (x,), dy)[0], g_ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_linear_matches_litgpt_and_keeps_no_normalized_tensor(dtype, residual, device):
    torch.manual_seed(3)
    H, n_out = 72, (40, 24)
    m = _litgpt_norm(H, 1.0, 1e-5, device, dtype)
    lins = [torch.nn.Linear(H, o, bias=i == 0, device=device, dtype=dtype) for i, o in enumerate(n_out)]
    x = torch.randn(2, 9, H, device=device, dtype=dtype, requires_grad=True)
    r = torch.randn(2, 9, H, device=device, dtype=dtype, requires_grad=True) if residual else None
    leaves = [t for t in (x, r, m.weight, lins[0].weight, lins[0].bias, lins[1].weight) if t is not None]
    # LitGPT's composition: (x + residual), RMSNorm, the Linears
    s_ref = x + r if residual else x
    n_ref = m(s_ref)
    outs_ref, ref_bytes = saved_bytes(lambda: [lin(n_ref) for lin in lins])
    (s, outs), bytes_ = saved_bytes(lambda: rms_norm_linear(
        x, m.weight, [(lin.weight, lin.bias) for lin in lins], 1e-5, 1.0, residual=r))
    assert (s is None) == (not residual)
    for o, o_ref in zip(outs, outs_ref):
        assert rel_err(o, o_ref) <= TOL[dtype]
    dys = [torch.randn_like(o) for o in outs]
    ds = torch.randn_like(s_ref) if residual else None
    tensors = ([s] if residual else []) + outs
    tensors_ref = ([s_ref] if residual else []) + outs_ref
    grads = ([ds] if residual else []) + dys
    g = torch.autograd.grad(tensors, leaves, grads)
    g_ref = torch.autograd.grad(tensors_ref, leaves, grads)
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) <= TOL[dtype]
    # kept for backward: the norm's input (the residual sum), rstd and the weights; the Linears'
    # composition keeps the (2, 9, H) normalized tensor for their weight gradients instead
    weights = sum(t.numel() * t.element_size() for t in (m.weight, lins[0].weight, lins[0].bias, lins[1].weight))
    kept_input = x.numel() * x.element_size()
    assert bytes_ <= kept_input + weights + 4 * 18 + 64  # + fp32 rstd (+ allocator rounding)
    lin_weights = sum(lin.weight.numel() * lin.weight.element_size() for lin in lins)
    assert ref_bytes >= n_ref.numel() * n_ref.element_size() + lin_weights  # the hook sees what composition keeps


def test_rms_norm_linear_partly_frozen_and_bad_inputs(device):
    torch.manual_seed(4)
    x = torch.randn(5, 32, device=device, requires_grad=True)
    w = (torch.rand(32, device=device) + 0.5).requires_grad_()
    W1, W2 = torch.randn(16, 32, device=device), torch.randn(8, 32, device=device, requires_grad=True)

    def ref(x, w, W1, W2):
        n = rms_norm_reference(x, w, 1e-6)
        return torch.nn.functional.linear(n, W1), torch.nn.functional.linear(n, W2)

    dys = (torch.randn(5, 16, device=device), torch.randn(5, 8, device=device))
    cases = {  # which leaves need a gradient: a frozen Linear, a frozen norm input, everything frozen
        "W1 frozen": (x, w, W2), "x and norm weight frozen": (W2,), "all frozen but x": (x,)}
    for what, leaves in cases.items():
        for t in (x, w, W2):
            t.requires_grad_(any(t is leaf for leaf in leaves))
        _, outs = rms_norm_linear(x, w, [(W1, None), (W2, None)])
        refs = ref(x, w, W1, W2)
        live = [i for i, o in enumerate(refs) if o.requires_grad]  # W1 frozen and n frozen: not output 0
        g = torch.autograd.grad([outs[i] for i in live], leaves, [dys[i] for i in live])
        g_ref = torch.autograd.grad([refs[i] for i in live], leaves, [dys[i] for i in live])
        for a, b in zip(g, g_ref):
            assert rel_err(a, b) <= 1e-5, what
    with pytest.raises(ValueError, match="at least one"):
        rms_norm_linear(x, w, [])
    with pytest.raises(ValueError, match=r"\(out, 32\)"):
        rms_norm_linear(x, w, [(torch.randn(16, 8, device=device), None)])
    with pytest.raises(ValueError, match="bias shape"):
        rms_norm_linear(x, w, [(W1, torch.randn(3, device=device))])
    with pytest.raises(TypeError, match="float"):
        rms_norm_linear(x, w, [(W1.long(), None)])


def test_rms_norm_frozen_weight(device):
    x = torch.randn(3, 50, device=device, requires_grad=True)
    w = torch.randn(50, device=device)
    out = rms_norm(x, w)
    (gx,) = torch.autograd.grad(out.sum(), (x,))
    ref = rms_norm_reference(x, w, 1e-6)
    assert rel_err(gx, torch.autograd.grad(ref.sum(), (x,))[0]) <= 1e-5


def test_rms_norm_bad_inputs(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="last dimension"):
        rms_norm(x, torch.ones(8, device=device))
    with pytest.raises(TypeError, match="float"):
        rms_norm(x.long(), torch.ones(16, device=device))
    with pytest.raises(ValueError, match="2-D|1-D"):
        rms_norm(x, torch.ones(2, 8, device=device))
    with pytest.raises(ValueError, match="shape"):
        rms_norm_residual(x, torch.randn(2, 16, device=device), torch.ones(16, device=device))
    with pytest.raises(TypeError, match="dtype"):
        rms_norm_residual(x, x.half(), torch.ones(16, device=device))
    if device == "cpu":
        meta = torch.ones(16, device="meta")
        with pytest.raises(ValueError, match="device"):
            rms_norm(x, meta)


def test_rms_norm_meta_device():
    x = torch.randn(2, 5, 32, device="meta")
    w = torch.ones(32, device="meta")
    assert rms_norm(x, w).shape == x.shape
    y, _, rstd = torch.ops.lit_liger.rms_norm_fwd(x, None, w, 1e-6, 0.0)
    assert y.shape == x.shape and rstd.shape == (10,)


def test_rms_norm_reference_path_without_interpreter(monkeypatch):
    # CPU tensors without the interpreter take the reference math (still correct)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(3, 24, requires_grad=True)
    w = torch.randn(24)
    m = RMSNorm(24)
    with torch.no_grad():
        m.weight.copy_(w)
    assert rel_err(rms_norm(x, w), m(x)) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("next_norm", [True, False])
@pytest.mark.parametrize("used", ["both", "sum", "norm"])
def test_rms_norm_add_equals_the_two_kernels_and_litgpt(dtype, next_norm, used, device):
    """``rms_norm_add`` (a Block's post-norm, the residual add and the next norm in one kernel each way) against the
    same steps as separate kernels (bit for bit: the same operations and roundings) and LitGPT's modules; the
    gradients of both weights and both inputs, with the sum and / or the next norm's output read downstream."""
    if used == "norm" and not next_norm:
        pytest.skip("without a next norm the sum is the only output")
    from lit_liger.kernels.rms_norm import rms_norm_add

    torch.manual_seed(3)
    H = 72
    post, n2 = _litgpt_norm(H, 1.0, 1e-6, device, dtype), _litgpt_norm(H, 1.0, 1e-5, device, dtype)
    a0 = torch.randn(2, 5, H, device=device, dtype=dtype) * 3
    x0 = torch.randn(2, 5, H, device=device, dtype=dtype)
    ds, dy = torch.randn_like(x0), torch.randn_like(x0)

    def run(fn):
        a, x = a0.clone().requires_grad_(True), x0.clone().requires_grad_(True)
        wa, w = post.weight.detach().clone().requires_grad_(True), n2.weight.detach().clone().requires_grad_(True)
        s, y = fn(a, x, wa, w)
        outs = [(s, ds)] if used in ("both", "sum") or not next_norm else []
        if next_norm and used in ("both", "norm"):
            outs.append((y, dy))
        grads = torch.autograd.grad([o for o, _ in outs], (a, x, wa, w) if next_norm else (a, x, wa),
                                    [g for _, g in outs], allow_unused=True)
        return s, y, grads

    def fused(a, x, wa, w):
        return rms_norm_add(a, x, wa, 1e-6, 1.0, (w, 1e-5, 1.0) if next_norm else None)

    def separate(a, x, wa, w):
        p = rms_norm(a, wa, 1e-6, 1.0)
        # (the sum alone: rms_norm_residual's, whose kernel rounds as the fused one does; PyTorch's bf16 add rounds
        # to nearest, as Triton does on a GPU but not under its interpreter, which truncates)
        s, y = rms_norm_residual(p, x, w, 1e-5, 1.0)
        return (s, y) if next_norm else (s, None)

    def litgpt(a, x, wa, w):
        p = post.__class__.forward(_Weighted(post, wa), a)
        s = p + x
        return s, (n2.__class__.forward(_Weighted(n2, w), s) if next_norm else None)

    s, y, g = run(fused)
    s_sep, y_sep, g_sep = run(separate)
    s_ref, y_ref, g_ref = run(litgpt)
    assert s.dtype == dtype and s.shape == x0.shape
    assert torch.equal(s, s_sep) and rel_err(s, s_ref) <= TOL[dtype]
    if next_norm:
        assert torch.equal(y, y_sep) and rel_err(y, y_ref) <= TOL[dtype]
    else:
        assert y is None and y_sep is None
    for i, (got, sep, ref) in enumerate(zip(g, g_sep, g_ref)):
        if ref is None:
            assert got is None or not got.any()
            continue
        if i < 2:  # the inputs' gradients: the same kernels' operations
            assert torch.equal(got, sep), i
        assert rel_err(got, sep) <= 1e-6 and rel_err(got, ref) <= max(TOL[dtype], 1e-5), i


class _Weighted(torch.nn.Module):
    """A LitGPT RMSNorm's settings with another weight tensor (for autograd through LitGPT's own forward)."""

    def __init__(self, norm, weight):
        super().__init__()
        self.eps, self.dim, self.add_unit_offset, self.weight = norm.eps, norm.dim, norm.add_unit_offset, weight


def test_rms_norm_add_bad_inputs(device):
    from lit_liger.kernels.rms_norm import rms_norm_add

    a, x, w = torch.randn(3, 8, device=device), torch.randn(3, 8, device=device), torch.randn(8, device=device)
    with pytest.raises(ValueError, match=r"x shape \(2, 8\) must equal a shape \(3, 8\)"):
        rms_norm_add(a, x[:2], w)
    with pytest.raises(ValueError, match=r"a has shape \(3, 8\); its last dimension must be 7 .*weight.shape\[0\]"):
        rms_norm_add(a, x, torch.randn(7, device=device))
    with pytest.raises(ValueError, match=r"x has shape \(3, 8\); its last dimension must be 9 .*next_norm's weight"):
        rms_norm_add(a, x, w, next_norm=(torch.randn(9, device=device), 1e-6, 0.0))
    with pytest.raises(TypeError, match="x has dtype torch.bfloat16 but a has torch.float32"):
        rms_norm_add(a, x.to(torch.bfloat16), w)
