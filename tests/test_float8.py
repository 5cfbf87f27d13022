"""kernels.float8: lit-liger's tensorwise float8 casts, fused into the norm and GLU arithmetic, against torchao's
cast of the 16-bit tensor that lit-liger's own kernels write (bit for bit: the same values, scale and rounding); and the
tensorwise Linear paths of lit_liger.swap.fp8 against torchao's Float8Linear.

On CPU the kernels run under TRITON_INTERPRET=1; a GPU runs them natively (the same assertions)."""

import pytest
import torch
from conftest import DEVICE

from lit_liger.kernels import float8 as F8
from lit_liger.kernels._launch import use_triton
from lit_liger.kernels.rms_norm import _rms_norm_fwd_impl
from lit_liger.kernels.swiglu import _glu_bwd_amax_impl, _glu_bwd_impl, _glu_fwd_impl

torchao_float8 = pytest.importorskip("torchao.float8")
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic  # noqa: E402
from torchao.float8.float8_training_tensor import LinearMMConfig  # noqa: E402

pytestmark = pytest.mark.skipif(not use_triton(torch.empty(0, device=DEVICE)), reason="needs the Triton path")


def _bits(t):
    return t.contiguous().view(torch.uint8)


def _torchao_cast(t, dtype):
    """torchao's own tensorwise cast (the tensorwise recipe's input / weight / gradient cast)."""
    f = hp_tensor_to_float8_dynamic(t, dtype, LinearMMConfig())
    return f._data, f._scale


@pytest.mark.parametrize("dtype", [F8.E4M3, F8.E5M2])
def test_amax_scale_equals_torchao_amax_to_scale(dtype):
    """The one-launch scale (a maximum over partial maxima, then fp8_max / max(amax, 1e-12) in float64, rounded to
    float32) equals torchao's ``amax_to_scale`` of the maximum, bit for bit: ordinary, tiny (below the 1e-12
    floor), huge and zero maxima, none at all, and more partials than one block of the kernel holds."""
    from torchao.float8.float8_utils import amax_to_scale

    torch.manual_seed(7)
    cases = [torch.rand(5) * 3, torch.rand(3000) * 1e-3, torch.tensor([3e-13, 1e-14]), torch.tensor([6e4, 1.0]),
             torch.zeros(4), torch.zeros(0), torch.rand(1) * 1e-30, torch.tensor([0.1, 2.5e-7, 7.0])]
    for partial in cases:
        partial = partial.to(DEVICE)
        got = F8.amax_scale(partial, dtype)
        amax = partial.max() if partial.numel() else partial.new_zeros(())
        want = amax_to_scale(amax, dtype)
        assert got.dtype == torch.float32 and got.shape == ()
        assert torch.equal(got, want), (partial[:4], got, want)


@pytest.mark.parametrize("dtype", [F8.E4M3, F8.E5M2])
@pytest.mark.parametrize("shape", [(37, 48), (64, 96), (1, 16)])
def test_cast_equals_torchao_row_major_and_transposed(dtype, shape):
    torch.manual_seed(0)
    x = (torch.randn(shape, device=DEVICE) * 40).bfloat16()  # values past e4m3's 448: saturated
    x[0, 0] = 1e-4  # and a float8 subnormal
    ref, ref_scale = _torchao_cast(x, dtype)
    t8, t8_t, scale = F8.fp8_cast(x, dtype, write=True, write_t=True, t_pad=5)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(_bits(t8), _bits(ref))
    assert t8_t.shape == (shape[1], shape[0] + 5)
    assert torch.equal(_bits(t8_t[:, : shape[0]]), _bits(ref.t()))
    assert not t8_t[:, shape[0]:].float().any()  # the pad: zeros
    # a given scale (backward's recast) writes the same bits
    again = F8.fp8_cast(x, dtype, write=False, write_t=True, scale=scale)
    assert again[0] is None and torch.equal(_bits(again[1]), _bits(t8_t[:, : shape[0]]))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_norm_fp8_equals_torchao_cast_of_the_norm_output(residual, offset):
    torch.manual_seed(1)
    x = (torch.randn(45, 64, device=DEVICE) * 3).bfloat16()
    r = torch.randn(45, 64, device=DEVICE).bfloat16() if residual else None
    w = torch.randn(64, device=DEVICE).bfloat16()
    y, s_ref, rstd_ref = _rms_norm_fwd_impl(x, r, w, 1e-5, offset)  # lit-liger's 16-bit norm
    ref, ref_scale = _torchao_cast(y, F8.E4M3)
    s, rstd, y8, scale = F8.norm_fp8(x, r, w, 1e-5, offset)
    assert torch.equal(scale, ref_scale) and torch.equal(_bits(y8), _bits(ref))
    assert torch.equal(rstd, rstd_ref) and (torch.equal(s, s_ref) if residual else s is None)
    y8_t = F8.norm_fp8_t(s if residual else x, rstd, w, offset, scale, t_pad=3)
    assert torch.equal(_bits(y8_t[:, :45]), _bits(ref.t())) and not y8_t[:, 45:].float().any()


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu"])
def test_glu_fp8_equals_torchao_cast_of_the_product(activation):
    torch.manual_seed(2)
    a = (torch.randn(33, 80, device=DEVICE) * 2).bfloat16()
    b = (torch.randn(33, 80, device=DEVICE) * 2).bfloat16()
    ref, ref_scale = _torchao_cast(_glu_fwd_impl(a, b, activation), F8.E4M3)
    h8, h8_t, scale = F8.glu_fp8(a, b, activation, write_t=True)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(_bits(h8), _bits(ref)) and torch.equal(_bits(h8_t), _bits(ref.t()))


def test_glu_backward_reduces_the_gradients_maxima():
    torch.manual_seed(3)
    a, b, dy = (torch.randn(29, 72, device=DEVICE).bfloat16() for _ in range(3))
    da, db, amax = _glu_bwd_amax_impl(dy, a, b, "silu")
    da_ref, db_ref = _glu_bwd_impl(dy, a, b, "silu", True, True)
    assert torch.equal(da, da_ref) and torch.equal(db, db_ref)
    assert torch.equal(amax, torch.stack([da.abs().max(), db.abs().max()]).float())


def test_fp8_cast_rejects_bad_input():
    with pytest.raises(ValueError, match="float8 dtype"):
        F8.fp8_cast(torch.zeros(4, 16, device=DEVICE, dtype=torch.bfloat16), torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous last dim"):
        F8.fp8_cast(torch.zeros(16, 4, device=DEVICE, dtype=torch.bfloat16).t(), F8.E4M3)
    with pytest.raises(TypeError, match="floating-point"):
        F8.fp8_cast(torch.zeros(4, 16, device=DEVICE, dtype=torch.int32), F8.E4M3)
    with pytest.raises(ValueError, match="same shape"):
        F8.glu_fp8(torch.zeros(4, 16, device=DEVICE), torch.zeros(4, 32, device=DEVICE), "silu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_tensorwise_linear_equals_torchao_float8_linear(bias, dtype):
    """A Float8Linear converted by LigerConfig.fp8 (LigerFloat8Linear, lit-liger's casts) against torchao's own module:
    the same output and gradients, bit for bit (tokens a multiple of 16: torchao's weight-gradient GEMM needs it)."""
    from torchao.float8.float8_linear import Float8Linear

    from lit_liger.swap.fp8 import _LinearTW

    torch.manual_seed(4)
    lin = torch.nn.Linear(64, 48, bias=bias, device=DEVICE, dtype=dtype)
    ref = Float8Linear.from_float(torch.nn.Linear(64, 48, bias=bias, device=DEVICE, dtype=dtype),
                                  config=torchao_float8.Float8LinearConfig())
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(2, 16, 64, device=DEVICE).to(dtype)
    g = torch.randn(2, 16, 48, device=DEVICE).to(dtype)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = _LinearTW.apply(x1, lin.weight, lin.bias)
    out.backward(g)
    out_ref = ref(x2)
    out_ref.backward(g)
    assert torch.equal(out, out_ref) and torch.equal(x1.grad, x2.grad)
    assert torch.equal(lin.weight.grad, ref.weight.grad)
    if bias:
        assert torch.allclose(lin.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("n_tokens", [32, 21])
def test_tensorwise_linear_keeps_x_under_compile(monkeypatch, n_tokens):
    """Under torch.compile (``fp8._keep_x``) the Linear keeps its 16-bit input and casts it transposed in backward,
    so that the partitioner can rebuild it from what it keeps anyway: the same output and gradients, bit for bit, as
    keeping the float8 copy, and the input (not a float8 tensor) among what backward keeps."""
    from lit_liger.swap import fp8

    torch.manual_seed(6)
    w = torch.nn.Parameter(torch.randn(48, 64, device=DEVICE).bfloat16())
    x = torch.randn(n_tokens, 64, device=DEVICE).bfloat16()
    g = torch.randn(n_tokens, 48, device=DEVICE).bfloat16()
    results = []
    for keep in (False, True):
        monkeypatch.setattr(fp8, "_keep_x", lambda keep=keep: keep)
        x1 = x.clone().requires_grad_(True)
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            out = fp8._LinearTW.apply(x1, w, None)
        out.backward(g)
        results.append((out, x1.grad, w.grad))
        w.grad = None
        assert any(t.dtype == fp8._f8.E4M3 for t in kept) != keep
        assert any(t.data_ptr() == x1.data_ptr() and t.shape == x.shape for t in kept) == keep
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_tensorwise_linear_pads_odd_token_counts():
    """Tokens not a multiple of 16: the weight gradient's transposed operands get zero columns; the same weight
    gradient as with zero tokens appended (which change no scale)."""
    from lit_liger.swap.fp8 import _LinearTW

    torch.manual_seed(5)
    w = torch.nn.Parameter(torch.randn(32, 64, device=DEVICE).bfloat16())
    x = torch.randn(21, 64, device=DEVICE).bfloat16()
    g = torch.randn(21, 32, device=DEVICE).bfloat16()
    _LinearTW.apply(x, w, None).backward(g)
    dw_odd, w.grad = w.grad, None
    _LinearTW.apply(torch.cat([x, x.new_zeros(11, 64)]), w, None).backward(torch.cat([g, g.new_zeros(11, 32)]))
    assert torch.equal(dw_odd, w.grad)
