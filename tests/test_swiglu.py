import os
import pytest
import torch
import torch.nn.functional as F
from helpers import TOL, rel_err
from litgpt import Config
from litgpt.model import GemmaMLP, LLaMAMLP

from lit_liger.kernels.swiglu import geglu, glu_reference, swiglu

# LitGPT's math (LLaMAMLP / GemmaMLP), taken in fp64 as the reference
_REF = {
    "silu": lambda a, b: F.silu(a) * b,
    "tanh": lambda a, b: F.gelu(a, approximate="tanh") * b,
    "none": lambda a, b: F.gelu(a, approximate="none") * b,
}


def _op(kind):
    return swiglu if kind == "silu" else (lambda a, b: geglu(a, b, approximate=kind))


def _check_fwd_bwd(kind, a, b, dy, tol):
    """Output and the gradients of a and b against fp64 PyTorch."""
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = _REF[kind](a64, b64)
    out = _op(kind)(a, b)
    assert out.dtype == a.dtype and out.shape == a.shape
    assert rel_err(out, ref) <= tol
    g = torch.autograd.grad(out, (a, b), dy)
    g_ref = torch.autograd.grad(ref, (a64, b64), dy.double())
    for x, x_ref, name in zip(g, g_ref, "ab"):
        assert x.dtype == a.dtype and x.shape == a.shape, name
        assert rel_err(x, x_ref) <= tol, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["silu", "tanh", "none"])
@pytest.mark.parametrize("shape", [(3, 5, 77), (2, 1030), (1,)])
def test_glu_matches_fp64(kind, shape, dtype, device):
    torch.manual_seed(0)
    a = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()
    b = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(shape, device=device, dtype=dtype)
    _check_fwd_bwd(kind, a, b, dy, TOL[dtype])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy exp -> inf, as on GPU
def test_glu_extreme_inputs(device):
    # saturated sigmoid / erf (|a| up to 60) stays finite and exact in both directions
    a = torch.linspace(-60, 60, 241, device=device).requires_grad_()
    b = torch.randn(241, device=device, requires_grad=True)
    dy = torch.randn(241, device=device)
    for kind in _REF:
        _check_fwd_bwd(kind, a, b, dy, 1e-5)


@pytest.mark.parametrize("kind", ["silu", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glu_inside_litgpt_mlp(kind, dtype, device):
    # the MLP's own forward vs fc_1 / fc_2 -> our op -> proj, with the same parameters
    torch.manual_seed(1)
    cls = LLaMAMLP if kind == "silu" else GemmaMLP
    config = Config(n_embd=24, n_head=4, intermediate_size=70, bias=False, gelu_approximate=kind)
    mlp = cls(config).to(device=device, dtype=dtype)
    x = torch.randn(2, 3, 24, device=device, dtype=dtype, requires_grad=True)
    ref = mlp(x)
    out = mlp.proj(_op(kind)(mlp.fc_1(x), mlp.fc_2(x)))
    assert rel_err(out, ref) <= TOL[dtype]
    dy = torch.randn_like(ref)
    params = (x, mlp.fc_1.weight, mlp.fc_2.weight, mlp.proj.weight)
    for g, g_ref in zip(torch.autograd.grad(out, params, dy), torch.autograd.grad(ref, params, dy)):
        assert rel_err(g, g_ref) <= (1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("kind,I", [("silu", 45), ("none", 45), ("tanh", 1030)])
def test_glu_non_contiguous(kind, I, device):
    torch.manual_seed(2)
    # the two halves of one fused fc output: last dim contiguous, row stride 2 * I (no copy needed);
    # I = 1030 spans two column tiles per row with a ragged tail
    fc = torch.randn(3, 4 if I < 100 else 1, 2 * I, device=device, requires_grad=True)
    a, b = fc.chunk(2, dim=-1)
    assert not a.is_contiguous() and a.stride(-1) == 1
    dy = torch.randn(a.shape, device=device)
    _check_fwd_bwd(kind, a, b, dy, 1e-5)
    # the gradient flows back into the fused tensor
    fc64 = fc.detach().double().requires_grad_()
    (g_ref,) = torch.autograd.grad(_REF[kind](*fc64.chunk(2, dim=-1)), fc64, dy.double())
    (g,) = torch.autograd.grad(_op(kind)(a, b), fc, dy)
    assert rel_err(g, g_ref) <= 1e-5
    # transposed views (not viewable as rows: copied) and a mix of layouts, with an expanded dy
    at = torch.randn(7, 5, 33, device=device).transpose(0, 1).requires_grad_()
    bt = torch.randn(5, 7, 66, device=device)[..., ::2].requires_grad_()
    _check_fwd_bwd(kind, at, bt, torch.randn(5, 7, 33, device=device), 1e-5)
    out = _op(kind)(at, bt)
    g = torch.autograd.grad(out.sum(), (at, bt))
    at64, bt64 = at.detach().double().requires_grad_(), bt.detach().double().requires_grad_()
    g_ref = torch.autograd.grad(_REF[kind](at64, bt64).sum(), (at64, bt64))
    for x, x_ref in zip(g, g_ref):
        assert rel_err(x, x_ref) <= 1e-5


def test_glu_grad_of_one_input(device):
    torch.manual_seed(3)
    a = torch.randn(4, 21, device=device, requires_grad=True)
    b = torch.randn(4, 21, device=device)
    dy = torch.randn(4, 21, device=device)
    (ga,) = torch.autograd.grad(swiglu(a, b), (a,), dy)
    a64 = a.detach().double().requires_grad_()
    assert rel_err(ga, torch.autograd.grad(_REF["silu"](a64, b.double()), (a64,), dy.double())[0]) <= 1e-5
    a2, b2 = a.detach(), b.clone().requires_grad_()
    (gb,) = torch.autograd.grad(geglu(a2, b2), (b2,), dy)
    assert rel_err(gb, F.gelu(a2.double(), approximate="tanh") * dy.double()) <= 1e-5
    # no grad required at all: plain forward
    assert not swiglu(a.detach(), b).requires_grad


def test_glu_empty(device):
    a = torch.randn(0, 16, device=device, requires_grad=True)
    out = swiglu(a, torch.randn(0, 16, device=device))
    assert out.shape == (0, 16)
    assert torch.autograd.grad(out.sum(), a)[0].shape == (0, 16)


def test_glu_bad_inputs(device):
    a = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="shape"):
        swiglu(a, torch.randn(4, 15, device=device))
    with pytest.raises(TypeError, match="dtype"):
        geglu(a, a.half())
    with pytest.raises(TypeError, match="float"):
        swiglu(a.long(), a.long())
    with pytest.raises(TypeError, match="Tensor"):
        swiglu(a, 2.0)
    with pytest.raises(ValueError, match="dimension"):
        swiglu(torch.tensor(1.0, device=device), torch.tensor(2.0, device=device))
    for bad in ("exact", "Tanh", None, True):
        with pytest.raises(ValueError, match="approximate"):
            geglu(a, a, approximate=bad)
    if device == "cpu":
        with pytest.raises(ValueError, match="device"):
            swiglu(a, torch.randn(4, 16, device="meta"))


def test_glu_eager_path_equals_custom_op(device):
    # eager swiglu/geglu run the autograd.Function fast path; torch.compile traces the custom op
    torch.manual_seed(9)
    a = torch.randn(3, 37, device=device, requires_grad=True)
    b = torch.randn(3, 37, device=device, requires_grad=True)
    dy = torch.randn(3, 37, device=device)
    for fn, activation in ((swiglu, "silu"), (lambda x, y: geglu(x, y, "tanh"), "gelu_tanh")):
        y = fn(a, b)
        assert "GLUFn" in type(y.grad_fn).__name__
        y_op = torch.ops.lit_liger.glu_fwd(a, b, activation)
        g = torch.autograd.grad(y, (a, b), dy)
        g_op = torch.autograd.grad(y_op, (a, b), dy)
        for u, v in zip((y, *g), (y_op, *g_op)):
            assert torch.equal(u, v)


def test_glu_meta_device():
    a = torch.randn(2, 5, 40, device="meta")
    b = torch.randn(2, 5, 40, device="meta")
    assert swiglu(a, b).shape == a.shape and geglu(a, b, "none").device.type == "meta"
    y = torch.ops.lit_liger.glu_fwd(a, b, "gelu_tanh")
    assert y.shape == a.shape and y.is_contiguous()
    da, db = torch.ops.lit_liger.glu_bwd(y, a, b, "silu", True, False)
    assert da.shape == a.shape and db.numel() == 0


def test_glu_reference_path_without_interpreter(monkeypatch):
    # CPU tensors without the interpreter take the reference math (still correct, autograd by PyTorch)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(4)
    a = torch.randn(3, 24, requires_grad=True)
    b = torch.randn(3, 24, requires_grad=True)
    for kind in _REF:
        out = _op(kind)(a, b)
        assert out.grad_fn is not None and "lit_liger" not in type(out.grad_fn).__name__
        assert rel_err(out, _REF[kind](a.double(), b.double())) <= 1e-6
    assert rel_err(swiglu(a.bfloat16(), b.bfloat16()), glu_reference(a, b).bfloat16()) <= 1e-2
    with pytest.raises(ValueError, match="activation"):
        glu_reference(a, b, "relu")


# ----------------------------------------------------------------------------------------------
# GPU: real sizes and torch.compile
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["silu", "tanh", "none"])
def test_glu_gpu_real_size(kind):
    torch.manual_seed(5)
    fc = torch.randn(2048, 2 * 14336, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    a, b = fc.chunk(2, dim=-1)  # row-strided, no copy
    dy = torch.randn(2048, 14336, device="cuda", dtype=torch.bfloat16)
    _check_fwd_bwd(kind, a, b, dy, TOL[torch.bfloat16])
    c = torch.randn(4, 1000, 11008, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    d = torch.randn_like(c, requires_grad=True)
    _check_fwd_bwd(kind, c, d, torch.randn_like(c), TOL[torch.bfloat16])


@pytest.mark.gpu
def test_glu_gpu_compile_fullgraph():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(x, fc1, fc2):
        return swiglu(x @ fc1, x @ fc2).sum() + geglu(x @ fc1, x @ fc2, "tanh").float().mean()

    x = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    fc1 = torch.randn(96, 250, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fc2 = torch.randn(96, 250, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = f(x, fc1, fc2)
    g_eager = torch.autograd.grad(eager, (fc1, fc2))
    compiled = torch.compile(f, fullgraph=True)(x, fc1, fc2)
    g_comp = torch.autograd.grad(compiled, (fc1, fc2))
    assert not torch._dynamo.utils.counters["graph_break"]
    assert rel_err(compiled, eager) <= 1e-2
    for g, h in zip(g_comp, g_eager):
        assert rel_err(g, h) <= 1e-2


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_glu_linear_matches_composition_and_saves_less(activation, with_bias, device):
    from lit_liger.kernels.swiglu import glu_linear

    torch.manual_seed(5)
    a = torch.randn(3, 7, 40, device=device, requires_grad=True)
    b = torch.randn(3, 7, 40, device=device, requires_grad=True)
    w = torch.randn(24, 40, device=device, requires_grad=True)
    bias = torch.randn(24, device=device, requires_grad=True) if with_bias else None
    act = torch.nn.functional.silu if activation == "silu" else (lambda t: torch.nn.functional.gelu(t, approximate="tanh"))
    a64, b64, w64 = (t.detach().double().requires_grad_() for t in (a, b, w))
    bias64 = bias.detach().double().requires_grad_() if with_bias else None
    ref = torch.nn.functional.linear(act(a64) * b64, w64, bias64)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        out = glu_linear(a, b, w, bias, activation)
    assert rel_err(out, ref) <= 1e-5
    if device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        assert (3, 7, 40) in saved and saved.count((3, 7, 40)) == 2  # a and b only, not the product
    dy = torch.randn_like(out)
    inputs = [a, b, w] + ([bias] if with_bias else [])
    inputs64 = [a64, b64, w64] + ([bias64] if with_bias else [])
    grads = torch.autograd.grad(out, inputs, dy)
    grads64 = torch.autograd.grad(ref, inputs64, dy.double())
    for g, g64 in zip(grads, grads64):
        assert rel_err(g, g64) <= 1e-5


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("need", ["a,b,w", "a,w", "b,w", "w"])
def test_glu_linear_weight_gradient_from_the_fused_backward(reuse, need, device):
    """With the weight trained and an input gradient asked for, the GLU backward kernel writes the product over
    ``d h`` for the weight gradient (no recompute pass): every gradient against fp64, and the same bits with
    ``reuse_inputs`` as without. Only the weight: the recompute path."""
    from lit_liger.kernels.swiglu import glu_linear

    torch.manual_seed(13)
    a0 = torch.randn(3, 7, 40, device=device, requires_grad="a" in need.split(","))
    b0 = torch.randn(3, 7, 40, device=device, requires_grad="b" in need.split(","))
    w = torch.randn(24, 40, device=device, requires_grad=True)
    bias = torch.randn(24, device=device, requires_grad=True)
    dy = torch.randn(3, 7, 24, device=device)
    a64, b64, w64, bias64 = (t.detach().double().requires_grad_() for t in (a0, b0, w, bias))
    ref = torch.nn.functional.linear(torch.nn.functional.silu(a64) * b64, w64, bias64)
    refs = dict(zip("abwc", torch.autograd.grad(ref, (a64, b64, w64, bias64), dy.double())))
    inputs = [t for t in (a0, b0) if t.requires_grad] + [w, bias]
    names = [n for n, t in zip("ab", (a0, b0)) if t.requires_grad] + ["w", "c"]

    def run(reuse_inputs):
        a, b = a0 * 1, b0 * 1  # fresh tensors, as fc_1(x), fc_2(x) are
        out = glu_linear(a, b, w, bias, "silu", reuse_inputs=reuse_inputs)
        return out, torch.autograd.grad(out, inputs, dy)

    out, grads = run(reuse)
    assert rel_err(out, ref) <= 1e-5
    for n, g in zip(names, grads):
        assert rel_err(g, refs[n]) <= 1e-5, n
    if reuse:
        for g, g0 in zip(grads, run(False)[1]):
            assert torch.equal(g, g0)


@pytest.mark.parametrize("need", ["a,b,w", "a,w", "w", "a,b"])
def test_glu_linear_compiled_backward_is_the_eager_one(need, device):
    """Under torch.compile (the custom op ``lit_liger::glu_linear``) the backward takes the eager path's kernels:
    with the weight's gradient and an input's, the one GLU backward kernel that also writes the product over
    ``d h`` (``lit_liger::glu_bwd_h``, a declared mutation), no recompute pass; the product is recomputed only
    for the weight alone. Gradients against fp64; the traced ops read from the compiled backward graph."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from lit_liger.kernels._launch import use_triton
    from lit_liger.kernels.swiglu import glu_linear

    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton, no custom op)")
    torch.manual_seed(21)
    wants = need.split(",")
    a = torch.randn(2, 5, 40, device=device, requires_grad="a" in wants)
    b = torch.randn(2, 5, 40, device=device, requires_grad="b" in wants)
    w = torch.randn(24, 40, device=device, requires_grad="w" in wants)
    dy = torch.randn(2, 5, 24, device=device)
    bw_ops = []

    def bw_compiler(gm, _inputs):
        bw_ops.extend(str(n.args[0] if "auto_functionalized" in str(n.target) else n.target)
                      for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=bw_compiler)
    torch._dynamo.reset()
    out = torch.compile(lambda a, b, w: glu_linear(a * 1, b * 1, w, None, "gelu_tanh"), fullgraph=True,
                        backend=backend)(a, b, w)
    inputs = [t for t in (a, b, w) if t.requires_grad]
    grads = torch.autograd.grad(out, inputs, dy)
    torch._dynamo.reset()
    a64, b64, w64 = (t.detach().double().requires_grad_(t.requires_grad) for t in (a, b, w))
    ref = F.linear(F.gelu(a64, approximate="tanh") * b64, w64)
    refs = torch.autograd.grad(ref, [t for t in (a64, b64, w64) if t.requires_grad], dy.double())
    assert rel_err(out, ref) <= 1e-5
    for g, r in zip(grads, refs):
        assert rel_err(g, r) <= 1e-5
    fused = sum("lit_liger.glu_bwd_h" in o for o in bw_ops)
    recomputed = sum("lit_liger.glu_fwd" in o for o in bw_ops)
    plain = sum(o.startswith("lit_liger.glu_bwd.") for o in bw_ops)
    if "w" in wants and len(wants) > 1:
        assert (fused, recomputed, plain) == (1, 0, 0), bw_ops
    elif "w" in wants:
        assert (fused, recomputed, plain) == (0, 1, 0), bw_ops
    else:
        assert (fused, recomputed, plain) == (0, 0, 1), bw_ops


def test_glu_bwd_h_custom_op_registration(device):
    """``torch.library.opcheck`` of the backward op that writes the product over ``d h``: schema (the declared
    mutation), fake implementation."""
    from lit_liger.kernels._launch import use_triton
    from lit_liger.kernels.swiglu import _glu_bwd_h

    if not use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    a, b, dh = (torch.randn(3, 7, 40, device=device) for _ in range(3))
    torch.library.opcheck(_glu_bwd_h, (dh, a, b, "silu", True, True), test_utils=("test_schema", "test_faketensor"))
    dh2 = dh.clone()
    da, db = _glu_bwd_h(dh2, a, b, "silu", True, False)
    assert torch.allclose(dh2, F.silu(a) * b, rtol=1e-5, atol=1e-6)  # the product, over dh
    assert torch.allclose(da, dh * torch.sigmoid(a) * (1 + a * (1 - torch.sigmoid(a))) * b, rtol=1e-4, atol=1e-5)
    assert db.numel() == 0


def test_glu_linear_bad_inputs(device):
    from lit_liger.kernels.swiglu import glu_linear

    a = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="weight shape"):
        glu_linear(a, a, torch.randn(3, 5, device=device))
    with pytest.raises(ValueError, match="activation"):
        glu_linear(a, a, torch.randn(3, 8, device=device), activation="relu")


def _reuse_cases():
    from lit_liger.kernels.swiglu import glu_linear

    w = torch.randn(24, 40, generator=torch.Generator().manual_seed(1))
    return {
        "swiglu": lambda a, b, **kw: swiglu(a, b, **kw),
        "geglu": lambda a, b, **kw: geglu(a, b, "tanh", **kw),
        "glu_linear": lambda a, b, **kw: glu_linear(a, b, w.to(a.device), None, "silu", **kw),
    }


@pytest.mark.parametrize("case", ["swiglu", "geglu", "glu_linear"])
def test_glu_reuse_inputs_writes_the_gradients_over_them(case, device):
    fn = _reuse_cases()[case]
    torch.manual_seed(11)
    a0 = torch.randn(3, 7, 40, device=device, requires_grad=True)
    b0 = torch.randn(3, 7, 40, device=device, requires_grad=True)
    dy = torch.randn(3, 7, 40 if case != "glu_linear" else 24, device=device)

    def run(reuse):
        a, b = a0 * 1, b0 * 1  # fresh non-leaf tensors, as fc_1(x), fc_2(x) are
        out = fn(a, b, reuse_inputs=reuse)
        return a, b, out, torch.autograd.grad(out, (a0, b0), dy, retain_graph=True)

    a, b, out, ref = run(False)
    assert torch.equal(a, a0) and torch.equal(b, b0)  # without reuse the inputs are untouched
    a, b, out, got = run(True)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)  # the same kernel and math: bit for bit
    if use_triton_here(a0):
        # the backward wrote d a, d b into a and b (no new (..., I) tensors) and said so to autograd
        assert torch.equal(a, ref[0]) and torch.equal(b, ref[1])
        with pytest.raises(RuntimeError, match="inplace"):
            torch.autograd.grad(out, (a0, b0), dy)  # a second backward through the overwritten inputs
    else:
        assert torch.equal(a, a0) and torch.equal(b, b0)  # reference path: nothing is reused


@pytest.mark.parametrize("case", ["swiglu", "glu_linear"])
def test_glu_reuse_inputs_leaves_views_and_shared_storage_alone(case, device):
    fn = _reuse_cases()[case]
    torch.manual_seed(12)
    ab = torch.randn(3, 7, 80, device=device, requires_grad=True)
    dy = torch.randn(3, 7, 40 if case != "glu_linear" else 24, device=device)
    fused = ab * 1  # one (B, T, 2I) output split in two: a and b do not own their storage
    a, b = fused[..., :40], fused[..., 40:]
    before = fused.detach().clone()
    out = fn(a, b, reuse_inputs=True)
    (g,) = torch.autograd.grad(out, (ab,), dy)
    assert torch.equal(fused, before)
    (g_ref,) = torch.autograd.grad(fn(*(ab * 1).split(40, -1)), (ab,), dy)
    assert torch.equal(g, g_ref)


def use_triton_here(t):
    from lit_liger.kernels._launch import use_triton

    return use_triton(t)


# ------------------------------------------------------------------------------------------------
# glu_mlp: a frozen MLP in chunks of rows, recomputed in its backward
# ------------------------------------------------------------------------------------------------
def _mlp_weights(C, I, with_bias, dtype, device, seed=21):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(I, C, generator=g) / C**0.5, torch.randn(I, C, generator=g) / C**0.5,
          torch.randn(C, I, generator=g) / I**0.5]
    bs = [torch.randn(I, generator=g), torch.randn(I, generator=g), torch.randn(C, generator=g)] if with_bias \
        else [None] * 3
    ws = [w.to(device, dtype) for w in ws]
    bs = [b.to(device, dtype) if b is not None else None for b in bs]
    return ws[0], bs[0], ws[1], bs[1], ws[2], bs[2]


_ACT = {"silu": torch.nn.functional.silu, "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        "gelu": torch.nn.functional.gelu}


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("min_rows", [1, 128])  # several uneven chunks (4, 4, 4, 3 rows of 15), or one
def test_glu_mlp_matches_fp64_and_keeps_only_x(activation, with_bias, min_rows, device, monkeypatch):
    from lit_liger.kernels import _launch
    from lit_liger.kernels.swiglu import glu_mlp

    monkeypatch.setattr(_launch, "MLP_MIN_ROWS", min_rows)
    torch.manual_seed(7)
    x = torch.randn(3, 5, 32, device=device, requires_grad=True)
    w1, b1, w2, b2, w3, b3 = weights = _mlp_weights(32, 48, with_bias, torch.float32, device)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = glu_mlp(x, *weights, activation=activation)
    x64 = x.detach().double().requires_grad_()
    F64 = [t.double() if t is not None else None for t in weights]
    lin = torch.nn.functional.linear
    ref = lin(_ACT[activation](lin(x64, F64[0], F64[1])) * lin(x64, F64[2], F64[3]), F64[4], F64[5])
    assert out.shape == (3, 5, 32) and out.dtype == x.dtype
    assert rel_err(out, ref) <= 1e-5
    if use_triton_here(x):  # the Function keeps x and the weights, no (N, I) tensor
        params = {t.data_ptr() for t in weights if t is not None}
        acts = [t for t in saved if t.data_ptr() not in params]
        assert len(acts) == 1 and acts[0].data_ptr() == x.data_ptr() and acts[0].shape == x.shape
    dy = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, (x,), dy)
    (dx64,) = torch.autograd.grad(ref, (x64,), dy.double())
    assert rel_err(dx, dx64) <= 1e-5


def test_glu_mlp_bf16_as_accurate_as_litgpt_math(device, monkeypatch):
    """bf16: the chunked MLP's output and input gradient are no further from fp64 than LitGPT's own bf16 math's
    (within 1.5x, plus a floor); a wrong chunk (rows dropped or duplicated) is off by O(1)."""
    from lit_liger.kernels import _launch
    from lit_liger.kernels.swiglu import glu_mlp

    monkeypatch.setattr(_launch, "MLP_MIN_ROWS", 1)
    torch.manual_seed(8)
    x = torch.randn(2, 9, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    weights = _mlp_weights(64, 96, False, torch.bfloat16, device)
    w1, _, w2, _, w3, _ = weights
    lin = torch.nn.functional.linear
    out = glu_mlp(x, *weights)
    stock = lin(torch.nn.functional.silu(lin(x, w1)) * lin(x, w2), w3)
    x64 = x.detach().double().requires_grad_()
    ref = lin(torch.nn.functional.silu(lin(x64, w1.double())) * lin(x64, w2.double()), w3.double())
    dy = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, (x,), dy)
    (dx_stock,) = torch.autograd.grad(stock, (x,), dy)
    (dx64,) = torch.autograd.grad(ref, (x64,), dy.double())
    assert rel_err(out, ref) <= 1.5 * rel_err(stock, ref) + 2e-3
    assert rel_err(dx, dx64) <= 1.5 * rel_err(dx_stock, dx64) + 2e-3
    assert rel_err(dx, dx64) <= 1e-2


def test_glu_mlp_bad_inputs(device):
    from lit_liger.kernels.swiglu import glu_mlp

    x = torch.randn(2, 3, 8, device=device)
    w1, b1, w2, b2, w3, b3 = _mlp_weights(8, 12, True, torch.float32, device)
    with pytest.raises(ValueError, match="frozen weights"):
        glu_mlp(x, w1.clone().requires_grad_(), b1, w2, b2, w3, b3)
    with pytest.raises(ValueError, match="w2 has shape"):
        glu_mlp(x, w1, b1, w2[:5], b2, w3, b3)
    with pytest.raises(ValueError, match="b3 has shape"):
        glu_mlp(x, w1, b1, w2, b2, w3, b1)
    with pytest.raises(TypeError, match="dtype"):
        glu_mlp(x, w1.double(), b1, w2, b2, w3, b3)
    with pytest.raises(ValueError, match="activation"):
        glu_mlp(x, w1, b1, w2, b2, w3, b3, activation="relu")
    with torch.no_grad():  # a trainable weight is fine where no gradient is taken
        glu_mlp(x, w1.clone().requires_grad_(), b1, w2, b2, w3, b3)


@pytest.mark.gpu
def test_glu_mlp_gpu_real_size_and_memory():
    """Llama-3.2-1B's MLP at 1 x 512 rows, bf16: equal to LitGPT's math within bf16's error, and the forward +
    backward's peak above its inputs is a fraction of the unchunked MLP's three (N, I) tensors."""
    from lit_liger.kernels.swiglu import glu_mlp

    torch.manual_seed(9)
    C, I, N = 2048, 8192, 512
    weights = _mlp_weights(C, I, False, torch.bfloat16, "cuda")
    w1, _, w2, _, w3, _ = weights
    x = torch.randn(1, N, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(1, N, C, device="cuda", dtype=torch.bfloat16)
    lin = torch.nn.functional.linear

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        (dx,) = torch.autograd.grad(out, (x,), dy)
        torch.cuda.synchronize()
        return out, dx, torch.cuda.max_memory_allocated() - base

    # warm-up, forward and backward: the kernels compiled, and the cuBLAS workspace of the thread that runs the backward
    # (autograd's device thread: a handle of its own) made, which the first backward would count in its peak
    torch.autograd.grad(glu_mlp(x, *weights), (x,), dy)
    out, dx, p_chunked = peak(lambda: glu_mlp(x, *weights))
    stock, dx_stock, p_stock = peak(lambda: lin(torch.nn.functional.silu(lin(x, w1)) * lin(x, w2), w3))
    x64 = x.detach().double().requires_grad_()
    ref = lin(torch.nn.functional.silu(lin(x64, w1.double())) * lin(x64, w2.double()), w3.double())
    (dx64,) = torch.autograd.grad(ref, (x64,), dy.double())
    assert rel_err(out, ref) <= 1.5 * rel_err(stock, ref) + 1e-3
    assert rel_err(dx, dx64) <= 1.5 * rel_err(dx_stock, dx64) + 1e-3
    nI, nC = N * I * 2, N * C * 2  # one (N, I) bf16 tensor: 8 MiB; one (N, C): 2 MiB
    # unchunked: fc_1's and fc_2's outputs and the product, or their gradients, beside the output. Chunked: a
    # quarter of those three (one chunk of rows), the output and dx
    assert p_stock >= 3 * nI and p_chunked <= 3 * nI // 4 + 2 * nC + (1 << 20), (p_chunked, p_stock)
