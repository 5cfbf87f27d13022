"""lit-liger's Triton causal / softcap attention (``kernels/attention.py``) against fp64 math and LitGPT's."""

import dataclasses
import math

import pytest
import torch
from helpers import TOL, rel_err
from litgpt import model as lm

from lit_liger.kernels import _launch as L
from lit_liger.kernels.attention import reference, softcap_attention


def _qkv(B, nh, ng, T, hs, dtype, device, layout="bthd", seed=0):
    """q (B, nh, T, hs) and k, v (B, ng, T, hs), as views of (B, T, heads, hs) (what lit-liger's RoPE returns) or
    contiguous (B, heads, T, hs) tensors."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def make(h):
        if layout == "bthd":
            t = torch.randn(B, T, h, hs, generator=g).transpose(1, 2)
        else:
            t = torch.randn(B, h, T, hs, generator=g)
        return t.to(device, dtype).requires_grad_()

    return make(nh), make(ng), make(ng)


def _litgpt_math(q, k, v, scale, softcap):
    """LitGPT's CausalSelfAttention.scaled_dot_product_attention path for a softcap layer (its own functions)."""
    nh, ng = q.shape[1], k.shape[1]
    if ng != nh:
        k = k.repeat_interleave(nh // ng, dim=1)
        v = v.repeat_interleave(nh // ng, dim=1)
    scores = q @ k.mT * scale
    if softcap is not None:
        scores = lm.do_softcapping(scores, softcap)
    T = q.shape[2]
    mask = torch.ones(T, T, dtype=q.dtype, device=q.device).triu(diagonal=1)
    mask.masked_fill_(mask.bool(), float("-inf"))
    scores = scores + mask
    return torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float).to(dtype=q.dtype) @ v


# (B, nh, ng, T, hs, softcap): MHA / GQA / MQA, T not a multiple of the blocks, one row, no softcap
CASES = [
    (2, 4, 2, 37, 32, 5.0),
    (1, 4, 4, 16, 16, None),
    (1, 4, 1, 50, 64, 2.0),
    (2, 2, 1, 1, 16, 30.0),
    (1, 6, 3, 33, 16, 50.0),
]


@pytest.mark.parametrize("B, nh, ng, T, hs, softcap", CASES)
@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
@pytest.mark.parametrize("kv_hs_major", [False, True], ids=["dkdv-keys-hs", "dkdv-hs-keys"])
def test_matches_fp64(B, nh, ng, T, hs, softcap, layout, kv_hs_major, device, monkeypatch):
    """Both layouts of the key-block backward (``AttentionPlan.kv_hs_major``), whichever the device's plan has."""
    q, k, v = _qkv(B, nh, ng, T, hs, torch.float32, device, layout)
    plan = dataclasses.replace(L.attention_plan(hs, q.dtype, q.device), kv_hs_major=kv_hs_major)
    monkeypatch.setattr(L, "ATTENTION_PLAN_OVERRIDE", [plan])
    scale = 1.7 / math.sqrt(hs)  # large enough that the softcap bends the scores
    out = softcap_attention(q, k, v, scale, softcap)
    assert out.shape == q.shape and out.dtype == q.dtype
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _litgpt_math(q64, k64, v64, scale, softcap)
    assert rel_err(out, ref) <= 1e-5
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dy)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dy.double())
    for name, g_, r in zip("qkv", grads, ref_grads):
        assert g_.shape == r.shape and g_.dtype == torch.float32, name
        if T == 1 and name in "qk":  # one key: the softmax is constant, dq and dk are exactly 0 (ours: rounding)
            assert g_.abs().max().item() <= 1e-5  # inputs and dy are O(1)
        else:
            assert rel_err(g_, r) <= 1e-5, name


def test_softcap_changes_the_result(device):
    """The softcap is applied (a kernel that ignored it would pass a no-softcap comparison only)."""
    q, k, v = _qkv(1, 2, 2, 24, 16, torch.float32, device)
    with torch.no_grad():
        capped = softcap_attention(q, k, v, 1.0, 2.0)
        plain = softcap_attention(q, k, v, 1.0, None)
        assert rel_err(capped, plain) > 1e-2
        assert rel_err(capped, _litgpt_math(q, k, v, 1.0, 2.0)) <= 1e-5


def test_output_is_a_view_of_b_t_heads(device):
    """The output is a (B, nh, T, hs) view of (B, T, nh, hs): the module's transpose + reshape is then free."""
    if not L.use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    q, k, v = _qkv(2, 4, 2, 20, 16, torch.float32, device)
    out = softcap_attention(q, k, v, 0.25, 10.0)
    assert out.transpose(1, 2).is_contiguous()
    assert out.transpose(1, 2).reshape(2, 20, 64).data_ptr() == out.data_ptr()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_no_worse_than_litgpt(dtype, device):
    """bf16 / fp16: error against fp64 within the project's half-precision tolerance and at most twice LitGPT's own
    math in that dtype (which rounds the scores to it; both round the softmax's gradient to it before the GEMMs)."""
    q, k, v = _qkv(2, 4, 2, 45, 32, dtype, device, seed=3)
    scale, cap = 1.5 / math.sqrt(32), 8.0
    out = softcap_attention(q, k, v, scale, cap)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _litgpt_math(q64, k64, v64, scale, cap)
    ql, kl, vl = (t.detach().clone().requires_grad_() for t in (q, k, v))
    litgpt = _litgpt_math(ql, kl, vl, scale, cap)
    assert rel_err(out, ref) <= min(TOL[dtype], 2 * max(rel_err(litgpt, ref), 1e-3))
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dy)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dy.double())
    lit_grads = torch.autograd.grad(litgpt, (ql, kl, vl), dy)
    for name, g_, r, lg in zip("qkv", grads, ref_grads, lit_grads):
        assert g_.dtype == dtype
        assert rel_err(g_, r) <= min(TOL[dtype], 2 * max(rel_err(lg, r), 1e-3)), name


def test_cpu_without_interpreter_takes_the_reference_path(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = _qkv(1, 2, 1, 9, 16, torch.float32, "cpu")
    out = softcap_attention(q, k, v, 0.5, 3.0)
    assert rel_err(out, reference(q, k, v, 0.5, 3.0)) == 0.0
    assert rel_err(out, _litgpt_math(q, k, v, 0.5, 3.0)) <= 1e-6


def test_bad_inputs_are_refused(device):
    q, k, v = _qkv(1, 4, 2, 8, 16, torch.float32, device)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        softcap_attention(q.double(), k, v, 0.5)
    with pytest.raises(TypeError, match="dtype"):
        softcap_attention(q, k.half(), v, 0.5)
    with pytest.raises(ValueError, match=r"\(B, heads, T, head_size\)"):
        softcap_attention(q[0], k, v, 0.5)
    with pytest.raises(ValueError, match="nh % ng"):
        softcap_attention(q, k[:, :1].expand(1, 3, 8, 16), v[:, :1].expand(1, 3, 8, 16), 0.5)  # 4 heads, 3 groups
    with pytest.raises(ValueError, match="nh % ng"):
        softcap_attention(q, k[:, :, :5], v[:, :, :5], 0.5)  # another T
    with pytest.raises(ValueError, match="head_size"):
        softcap_attention(q[..., :12], k[..., :12], v[..., :12], 0.5)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale"):
            softcap_attention(q, k, v, bad)
        with pytest.raises(ValueError, match="softcap"):
            softcap_attention(q, k, v, 0.5, bad)
    if device == "cuda":
        with pytest.raises(ValueError, match="device"):
            softcap_attention(q, k.cpu(), v, 0.5)


def test_custom_ops_fake_and_autograd_registration(device):
    """``torch.library.opcheck``: the custom ops' fake implementations, schemas and autograd agree with the kernels
    (what torch.compile traces)."""
    if not L.use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    from lit_liger.kernels.attention import _attn_bwd, _attn_fwd

    q, k, v = _qkv(1, 2, 1, 20, 16, torch.float32, device)
    torch.library.opcheck(_attn_fwd, (q, k, v, 0.5, 4.0), test_utils=("test_schema", "test_faketensor",
                                                                      "test_autograd_registration"))
    o, lse = _attn_fwd(q, k, v, 0.5, 4.0)
    do = torch.randn_like(o)
    torch.library.opcheck(_attn_bwd, (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, 0.5, 4.0),
                          test_utils=("test_schema", "test_faketensor"))


# ------------------------------------------------------------------------------------------------
# GPU: real sizes
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 8, 4, 1024, 256, 50.0), (1, 16, 8, 700, 128, 30.0), (2, 4, 1, 300, 64, None)])
def test_gpu_real_size_bf16_against_fp32(shape):
    """bf16 at gemma-2's head size and others: error against fp32 math no larger than FlexAttention's (both fp32
    inside) plus a small margin, and far below LitGPT's bf16 math."""
    from lit_liger.swap import attend as A

    B, nh, ng, T, hs, cap = shape
    q, k, v = _qkv(B, nh, ng, T, hs, torch.bfloat16, "cuda")
    scale = hs ** -0.5
    out = softcap_attention(q, k, v, scale, cap)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = _litgpt_math(qf, kf, vf, scale, cap)
    qx, kx, vx = (t.detach().clone().requires_grad_() for t in (q, k, v))
    flex = A.flex_attend(qx, kx, vx, scale=scale, softcap=cap)
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dy)
    ref_grads = torch.autograd.grad(ref, (qf, kf, vf), dy.float())
    flex_grads = torch.autograd.grad(flex, (qx, kx, vx), dy)
    assert rel_err(out, ref) <= 1.05 * rel_err(flex, ref) + 1e-4
    for name, g_, r, fg in zip("qkv", grads, ref_grads, flex_grads):
        assert rel_err(g_, r) <= 1.05 * rel_err(fg, r) + 1e-4, name
        assert rel_err(g_, r) <= 1e-2, name


@pytest.mark.gpu
@pytest.mark.parametrize("hs", [256, 128])
def test_gpu_fp32_fits_and_matches_fp64(hs):
    """fp32 through the public API at large head sizes: the plan fits the GPU's shared memory (the bf16 plan does not
    at 256), full-precision dots (1e-5 against fp64)."""
    q, k, v = _qkv(1, 4, 2, 300, hs, torch.float32, "cuda")
    out = softcap_attention(q, k, v, hs ** -0.5, 20.0)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _litgpt_math(q64, k64, v64, hs ** -0.5, 20.0)
    assert rel_err(out, ref) <= 1e-5
    dy = torch.randn_like(out)
    for name, g_, r in zip("qkv", torch.autograd.grad(out, (q, k, v), dy),
                           torch.autograd.grad(ref, (q64, k64, v64), dy.double())):
        assert rel_err(g_, r) <= 1e-5, name


@pytest.mark.gpu
def test_gpu_compile_fullgraph_traces_the_custom_op():
    q, k, v = _qkv(2, 8, 4, 256, 256, torch.bfloat16, "cuda")

    def f(q, k, v):
        return softcap_attention(q, k, v, 0.0625, 50.0).transpose(1, 2).sum(dim=-1)

    eager = f(q, k, v)
    g_eager = torch.autograd.grad(eager.float().square().sum(), (q, k, v))
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    g_comp = torch.autograd.grad(compiled.float().square().sum(), (q, k, v))
    assert torch.equal(eager, compiled)
    for a, b in zip(g_eager, g_comp):
        assert torch.equal(a, b)
