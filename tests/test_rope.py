import pytest
import torch
from helpers import TOL, rel_err, saved_bytes
from litgpt.model import RMSNorm, apply_rope, apply_rope_interleave, batched_index_select, build_rope_cache

from lit_liger.kernels.rope import rope, rope_qkv, rope_reference


SHAPES = [  # (q heads, kv heads, head size, rotated elements)
    pytest.param(6, 2, 24, 24, id="gqa-full"),
    pytest.param(3, 3, 24, 8, id="mha-partial"),
    pytest.param(5, 1, 40, 10, id="mqa-pythia-quarter"),  # rope_n_elem = 0.25 * hs, n/2 = 5
]


def _litgpt_views(qkv, nh, ng, hs):
    """q, k, v exactly as LitGPT's CausalSelfAttention.forward makes them: qkv.split + view + transpose."""
    B, T, _ = qkv.shape
    q, k, v = qkv.split((nh * hs, ng * hs, ng * hs), dim=-1)
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs), non-contiguous
    k = k.view(B, T, ng, hs).transpose(1, 2)  # (B, ng, T, hs), non-contiguous
    return q, k, v.view(B, T, ng, hs).transpose(1, 2)


def _litgpt_qk(B, T, nh, ng, hs, device, dtype):
    """A random qkv and LitGPT's q, k views of it."""
    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device=device, dtype=dtype, requires_grad=True)
    q, k, _ = _litgpt_views(qkv, nh, ng, hs)
    return qkv, q, k


def _litgpt_rope(q, k, cos, sin, interleave):
    """What CausalSelfAttention.forward does: apply_rope on the first n elements, cat the tail."""
    n = cos.size(-1)
    f = apply_rope_interleave if interleave else apply_rope
    q_roped, k_roped = f(q[..., :n], cos, sin), f(k[..., :n], cos, sin)
    return torch.cat((q_roped, q[..., n:]), dim=-1), torch.cat((k_roped, k[..., n:]), dim=-1)


def _cache(T, n, device, dtype=torch.float32):
    cos, sin = build_rope_cache(T, n, device=device)
    return cos[:T].unsqueeze(0).to(dtype), sin[:T].unsqueeze(0).to(dtype)  # (1, T, n), as GPT.forward


def _compare(q, k, cos, sin, interleave, tol, leaves=()):
    """Forward and dq/dk of rope vs LitGPT, with non-contiguous output gradients; also the gradients
    of ``leaves`` (e.g. the qkv tensor q and k are views of)."""
    q_ref, k_ref = _litgpt_rope(q, k, cos, sin, interleave)
    q_out, k_out = rope(q, k, cos, sin, interleave)
    for out, ref, x in ((q_out, q_ref, q), (k_out, k_ref, k)):
        assert out.shape == x.shape and out.dtype == x.dtype and out.stride(-1) == 1
        assert rel_err(out, ref) <= tol
    B, nh, T, hs = q.shape
    dq = torch.randn(B, T, nh, hs, device=q.device, dtype=q.dtype).transpose(1, 2)  # non-contiguous
    dk = torch.randn_like(k_ref)
    inputs = (q, k, *leaves)
    g_ref = torch.autograd.grad((q_ref, k_ref), inputs, (dq, dk))
    g = torch.autograd.grad((q_out, k_out), inputs, (dq, dk))
    for a, b, x in zip(g, g_ref, inputs):
        assert a.shape == x.shape and a.dtype == x.dtype
        assert rel_err(a, b) <= tol


@pytest.mark.parametrize("interleave", [False, True], ids=["halves", "interleave"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh, ng, hs, n", SHAPES)
def test_rope_matches_litgpt(nh, ng, hs, n, dtype, interleave, device):
    torch.manual_seed(0)
    B, T = 2, 3
    qkv, q, k = _litgpt_qk(B, T, nh, ng, hs, device, dtype)
    cos, sin = _cache(T, n, device)  # fp32 buffers, as LitGPT keeps them
    # the gradient also reaches qkv through LitGPT's views: q and k parts rotated back, v part zero
    _compare(q, k, cos, sin, interleave, TOL[dtype], leaves=(qkv,))


@pytest.mark.parametrize("T", [1, 3])
def test_rope_batched_positions(T, device):
    # KV-cache path: cos/sin (B, T, n) from batched_index_select with per-sequence positions; T=1 is decode
    torch.manual_seed(1)
    B, nh, ng, hs, n = 3, 4, 2, 20, 12
    cos_cache, sin_cache = build_rope_cache(32, n, device=device)
    input_pos = torch.randint(0, 32, (B, T), device=device)
    cos, sin = batched_index_select(cos_cache, 0, input_pos), batched_index_select(sin_cache, 0, input_pos)
    assert cos.shape == (B, T, n)
    for interleave in (False, True):
        _, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
        _compare(q, k, cos, sin, interleave, TOL[torch.float32])
    # batch dim B given as a stride-0 broadcast of a (1, T, n) cache
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
    c1, s1 = _cache(T, n, device)
    _compare(q, k, c1.expand(B, T, n), s1.expand(B, T, n), False, TOL[torch.float32])


def test_rope_arbitrary_cos_sin(device):
    # LitGPT's formula holds for any cos/sin, not only a cache whose two halves repeat (c1 != c2 here)
    torch.manual_seed(9)
    B, T, nh, ng, hs, n = 2, 2, 3, 1, 14, 10
    cos, sin = torch.randn(2, B, T, n, device=device).unbind(0)
    for interleave in (False, True):
        _, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
        _compare(q, k, cos, sin, interleave, TOL[torch.float32])


def test_rope_fp16_cache_in_model_dtype(device):
    # a model cast to fp16 carries fp16 cos/sin: LitGPT then computes in fp16, the kernel in fp32
    torch.manual_seed(2)
    B, T, nh, ng, hs, n = 2, 7, 4, 4, 16, 16
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float16)
    cos_cache, sin_cache = build_rope_cache(16, n, device=device)
    pos = torch.randperm(16, device=device)[: B * T].view(B, T)
    cos = batched_index_select(cos_cache, 0, pos).half()
    sin = batched_index_select(sin_cache, 0, pos).half()
    _compare(q, k, cos, sin, False, TOL[torch.float16])


def test_rope_layouts_and_inputs_untouched(device):
    torch.manual_seed(3)
    B, T, nh, ng, hs, n = 2, 6, 3, 1, 12, 8
    q = torch.randn(B, nh, T, hs, device=device, requires_grad=True)  # contiguous (B, nh, T, hs)
    k = torch.randn(B, T, ng + 1, hs, device=device).transpose(1, 2)[:, 1:]  # heads inner, offset view
    k.requires_grad_(True)
    cos, sin = _cache(T, n, device)
    # non-contiguous cos/sin (stride 2 on the last dim), like a slice of a stacked local/global cache
    cos = torch.stack((cos, cos * 0.5), dim=-1)[..., 0]
    sin = torch.stack((sin, sin * 0.5), dim=-1)[..., 0]
    assert cos.stride(-1) == 2
    before = [t.detach().clone() for t in (q, k, cos, sin)]
    q_out, k_out = rope(q, k, cos, sin)
    for t, b in zip((q, k, cos, sin), before):
        assert torch.equal(t, b)
    q_ref, k_ref = _litgpt_rope(q, k, cos, sin, False)
    assert rel_err(q_out, q_ref) <= 1e-5 and rel_err(k_out, k_ref) <= 1e-5
    dq, dk = torch.randn_like(q_out), torch.randn_like(k_out)
    gq, gk = torch.autograd.grad((q_out, k_out), (q, k), (dq, dk))
    gq_ref, gk_ref = torch.autograd.grad((q_ref, k_ref), (q, k), (dq, dk))
    assert rel_err(gq, gq_ref) <= 1e-5 and rel_err(gk, gk_ref) <= 1e-5
    assert q_out.data_ptr() != q.data_ptr() and k_out.data_ptr() != k.data_ptr()


def test_rope_kernel_output_layout(device):
    # Triton path: outputs and input gradients keep the input's dim order (documented in kernels/rope.py)
    torch.manual_seed(4)
    B, T, nh, ng, hs = 2, 3, 2, 1, 8
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
    cos, sin = _cache(T, hs, device)
    q_out, k_out = torch.ops.lit_liger.rope_fwd(q, k, cos, sin, False)
    assert q_out.transpose(1, 2).is_contiguous() and k_out.transpose(1, 2).is_contiguous()
    gq, gk = torch.autograd.grad((q_out, k_out), (q, k), (torch.randn_like(q_out), torch.randn_like(k_out)))
    assert gq.transpose(1, 2).is_contiguous() and gk.transpose(1, 2).is_contiguous()
    qc = torch.randn(B, nh, T, hs, device=device)
    q_out, _ = torch.ops.lit_liger.rope_fwd(qc, k.detach(), cos, sin, False)
    assert q_out.is_contiguous()


def test_rope_grad_of_q_only(device):
    torch.manual_seed(5)
    B, T, nh, ng, hs, n = 1, 4, 2, 2, 10, 6
    q = torch.randn(B, nh, T, hs, device=device, requires_grad=True)
    k = torch.randn(B, ng, T, hs, device=device)  # frozen
    cos, sin = _cache(T, n, device)
    q_out, k_out = rope(q, k, cos, sin)
    (gq,) = torch.autograd.grad(q_out.square().sum(), (q,))
    q_ref, _ = _litgpt_rope(q, k, cos, sin, False)
    (gq_ref,) = torch.autograd.grad(q_ref.square().sum(), (q,))
    assert rel_err(gq, gq_ref) <= 1e-5


def test_rope_eager_path_equals_custom_op(device):
    # eager rope() runs the autograd.Function fast path; torch.compile traces the custom op: same kernels
    torch.manual_seed(9)
    B, T, nh, ng, hs, n = 2, 3, 3, 1, 12, 8
    qkv, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
    cos, sin = _cache(T, n, device)
    for interleave in (False, True):
        outs = rope(q, k, cos, sin, interleave)
        assert "RopeFn" in type(outs[0].grad_fn).__name__
        outs_op = torch.ops.lit_liger.rope_fwd(q, k, cos, sin, interleave)
        dys = (torch.randn_like(outs[0]), torch.randn_like(outs[1]))
        g = torch.autograd.grad(outs, (q, k, qkv), dys)
        g_op = torch.autograd.grad(outs_op, (q, k, qkv), dys)
        for a, b in zip((*outs, *g), (*outs_op, *g_op)):
            assert a.stride() == b.stride() and torch.equal(a, b)


def test_rope_meta_device():
    B, T, nh, ng, hs, n = 2, 5, 6, 2, 16, 8
    q, k, _ = _litgpt_views(torch.empty(B, T, (nh + 2 * ng) * hs, device="meta"), nh, ng, hs)
    cos = sin = torch.empty(1, T, n, device="meta")
    q_out, k_out = rope(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.device.type == "meta"
    q_out, k_out = torch.ops.lit_liger.rope_fwd(q, k, cos, sin, True)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert q_out.transpose(1, 2).is_contiguous()
    dq, dk = torch.ops.lit_liger.rope_bwd(q_out, k_out, cos, sin, True, True, False)
    assert dq.shape == q.shape and dk.shape == k.shape and dk.is_contiguous()


def test_rope_bad_inputs(device):
    B, T, nh, ng, hs, n = 2, 3, 4, 2, 8, 4
    q = torch.randn(B, nh, T, hs, device=device)
    k = torch.randn(B, ng, T, hs, device=device)
    cos, sin = _cache(T, n, device)
    with pytest.raises(ValueError, match="4-D"):
        rope(q[0], k, cos, sin)
    with pytest.raises(ValueError, match="head size"):
        rope(q, k[..., :6], cos, sin)
    with pytest.raises(ValueError, match="sequence length"):
        rope(q, k[:, :, :2], cos, sin)
    with pytest.raises(TypeError, match="dtype"):
        rope(q, k.half(), cos, sin)
    with pytest.raises(TypeError, match="float"):
        rope(q.long(), k, cos, sin)
    with pytest.raises(TypeError, match="float"):
        rope(q, k, cos.double(), sin)
    with pytest.raises(ValueError, match="3-D"):
        rope(q, k, cos[0], sin[0])
    with pytest.raises(ValueError, match="same shape"):
        rope(q, k, cos, sin[..., :2])
    with pytest.raises(ValueError, match="sequence length"):
        rope(q, k, cos[:, :2], sin[:, :2])
    with pytest.raises(ValueError, match="batch"):
        rope(q, k, cos.expand(3, T, n), sin.expand(3, T, n))
    with pytest.raises(ValueError, match="even"):
        rope(q, k, cos[..., :3], sin[..., :3])
    c10, s10 = _cache(T, 10, device)
    with pytest.raises(ValueError, match="<= head size"):
        rope(q, k, c10, s10)
    with pytest.raises(ValueError, match="require grad"):
        rope(q, k, cos.clone().requires_grad_(), sin)
    if device == "cpu":
        with pytest.raises(ValueError, match="device"):
            rope(q, k, torch.empty(1, T, n, device="meta"), sin)


def test_rope_reference_path_without_interpreter(monkeypatch):
    # CPU tensors without the interpreter take the reference math (still LitGPT's result)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(6)
    _, q, k = _litgpt_qk(2, 3, 4, 2, 12, "cpu", torch.float32)
    cos, sin = _cache(3, 8, "cpu")
    for interleave in (False, True):
        _compare(q, k, cos, sin, interleave, 1e-6)
        # the reference itself equals LitGPT bit for bit
        for a, b in zip(rope_reference(q, k, cos, sin, interleave), _litgpt_rope(q, k, cos, sin, interleave)):
            assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------
# qk-norm fused (LitGPT's norm_qk_type="default": RMSNorm of every q / k head before RoPE)
# ----------------------------------------------------------------------------------------------
def _qk_norms(hs, offset, device, dtype, seed=0):
    """LitGPT's norm_q / norm_k modules (Gemma: add_unit_offset) with random weights, in the model dtype."""
    g = torch.Generator().manual_seed(seed)
    norms = []
    for _ in range(2):
        m = RMSNorm(hs, eps=1e-6, add_unit_offset=offset == 1.0)
        with torch.no_grad():
            m.weight.copy_((0.0 if offset else 1.0) + 0.3 * torch.randn(hs, generator=g))
        norms.append(m.to(device=device, dtype=dtype))
    return norms


def _fp64_norm_rope(q, k, cos, sin, wq, wk, interleave, offset, eps=1e-6):
    """The same math in fp64 (no rounding in between): the truth for the weight gradients."""
    def norm(x, w):
        x = x.double()
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * (w.double() + offset)

    return _litgpt_rope(norm(q, wq), norm(k, wk), cos.double(), sin.double(), interleave)


def _compare_norm(q, k, cos, sin, nq, nk, interleave, offset, tol, leaves=()):
    """rope(..., q_weight, k_weight) vs LitGPT's norm_q/norm_k followed by apply_rope (+ tail):
    outputs, gradients of q, k, ``leaves`` and both weights; weight gradients also vs fp64."""
    q_ref, k_ref = _litgpt_rope(nq(q), nk(k), cos, sin, interleave)
    q_out, k_out = rope(q, k, cos, sin, interleave, q_weight=nq.weight, k_weight=nk.weight, eps=nq.eps, offset=offset)
    for out, ref, x in ((q_out, q_ref, q), (k_out, k_ref, k)):
        assert out.shape == x.shape and out.dtype == x.dtype and out.stride(-1) == 1
        assert rel_err(out, ref) <= tol
    B, nh, T, hs = q.shape
    dq = torch.randn(B, T, nh, hs, device=q.device, dtype=q.dtype).transpose(1, 2)  # non-contiguous
    dk = torch.randn_like(k_ref)
    inputs = (q, k, *leaves, nq.weight, nk.weight)
    g_ref = torch.autograd.grad((q_ref, k_ref), inputs, (dq, dk))
    g = torch.autograd.grad((q_out, k_out), inputs, (dq, dk))
    for a, b, x in zip(g, g_ref, inputs):
        assert a.shape == x.shape and a.dtype == x.dtype
        assert rel_err(a, b) <= tol
    q64, k64 = _fp64_norm_rope(q, k, cos, sin, nq.weight, nk.weight, interleave, offset)
    assert rel_err(q_out, q64) <= tol and rel_err(k_out, k64) <= tol
    g64 = torch.autograd.grad((q64, k64), (nq.weight, nk.weight), (dq.double(), dk.double()))
    for a, b in zip(g[-2:], g64):
        assert rel_err(a, b) <= tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "nh, ng, hs, n, interleave, offset",
    [
        pytest.param(6, 2, 24, 24, False, 0.0, id="qwen3-gqa-full"),
        pytest.param(3, 1, 20, 12, False, 1.0, id="gemma3-gqa-partial-offset"),
        pytest.param(5, 5, 40, 10, True, 0.0, id="mha-partial-interleave"),
    ],
)
def test_rope_qk_norm_matches_litgpt(nh, ng, hs, n, interleave, offset, dtype, device):
    torch.manual_seed(10)
    B, T = 2, 3
    qkv, q, k = _litgpt_qk(B, T, nh, ng, hs, device, dtype)
    cos, sin = _cache(T, n, device)
    nq, nk = _qk_norms(hs, offset, device, dtype)  # weights in the model dtype, as in a bf16-true model
    _compare_norm(q, k, cos, sin, nq, nk, interleave, offset, TOL[dtype], leaves=(qkv,))


def test_rope_qk_norm_mixed_and_layouts(device):
    # fp32 weights with fp16 activations (autocast-style), contiguous q, offset k view, batched cos/sin
    torch.manual_seed(11)
    B, T, nh, ng, hs, n = 3, 2, 4, 2, 14, 10
    q = torch.randn(B, nh, T, hs, device=device, dtype=torch.float16, requires_grad=True)
    k = torch.randn(B, T, ng + 1, hs, device=device, dtype=torch.float16).transpose(1, 2)[:, 1:]
    k.requires_grad_(True)
    cos_cache, sin_cache = build_rope_cache(16, n, device=device)
    pos = torch.randint(0, 16, (B, T), device=device)
    cos, sin = batched_index_select(cos_cache, 0, pos), batched_index_select(sin_cache, 0, pos)
    nq, nk = _qk_norms(hs, 1.0, device, torch.float32, seed=1)
    before = [t.detach().clone() for t in (q, k, nq.weight, nk.weight)]
    _compare_norm(q, k, cos, sin, nq, nk, False, 1.0, TOL[torch.float16])
    for t, b in zip((q, k, nq.weight, nk.weight), before):
        assert torch.equal(t, b)


def test_rope_qk_norm_partial_grads(device):
    # frozen weights (no dW work), then frozen q and k with trainable weights; only one output used
    torch.manual_seed(12)
    B, T, nh, ng, hs, n = 1, 4, 2, 1, 12, 8
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
    cos, sin = _cache(T, n, device)
    nq, nk = _qk_norms(hs, 0.0, device, torch.float32, seed=2)
    for p in (nq.weight, nk.weight):
        p.requires_grad_(False)
    q_out, _ = rope(q, k, cos, sin, q_weight=nq.weight, k_weight=nk.weight)
    q_ref, _ = _litgpt_rope(nq(q), nk(k), cos, sin, False)
    g = torch.autograd.grad(q_out.square().sum(), (q, k), allow_unused=True)
    g_ref = torch.autograd.grad(q_ref.square().sum(), (q, k), allow_unused=True)
    assert rel_err(g[0], g_ref[0]) <= 1e-5 and (g[1] is None or g[1].abs().max() == 0)
    nq.weight.requires_grad_(True)
    nk.weight.requires_grad_(True)
    qd, kd = q.detach(), k.detach()
    _, k_out = rope(qd, kd, cos, sin, q_weight=nq.weight, k_weight=nk.weight)
    _, k_ref = _litgpt_rope(nq(qd), nk(kd), cos, sin, False)
    dk = torch.randn_like(k_ref)
    g = torch.autograd.grad(k_out, (nq.weight, nk.weight), dk, allow_unused=True)
    g_ref = torch.autograd.grad(k_ref, (nq.weight, nk.weight), dk, allow_unused=True)
    assert g_ref[0] is None and (g[0] is None or g[0].abs().max() == 0)
    assert rel_err(g[1], g_ref[1]) <= 1e-5


def test_rope_qk_norm_eager_path_equals_custom_op(device):
    torch.manual_seed(13)
    B, T, nh, ng, hs, n = 2, 3, 3, 1, 12, 8
    qkv, q, k = _litgpt_qk(B, T, nh, ng, hs, device, torch.float32)
    cos, sin = _cache(T, n, device)
    nq, nk = _qk_norms(hs, 1.0, device, torch.float32, seed=3)
    wq, wk = nq.weight, nk.weight
    outs = rope(q, k, cos, sin, True, q_weight=wq, k_weight=wk, eps=1e-5, offset=1.0)
    assert "RopeQKNormFn" in type(outs[0].grad_fn).__name__
    outs_op = torch.ops.lit_liger.rope_qk_norm_fwd(q, k, cos, sin, wq, wk, True, 1e-5, 1.0)
    dys = (torch.randn_like(outs[0]), torch.randn_like(outs[1]))
    g = torch.autograd.grad(outs, (q, k, qkv, wq, wk), dys)
    g_op = torch.autograd.grad(outs_op, (q, k, qkv, wq, wk), dys)
    for a, b in zip((*outs, *g), (*outs_op, *g_op)):
        assert a.stride() == b.stride() and torch.equal(a, b)


def test_rope_qk_norm_meta_device():
    B, T, nh, ng, hs, n = 2, 5, 6, 2, 16, 8
    q, k, _ = _litgpt_views(torch.empty(B, T, (nh + 2 * ng) * hs, device="meta"), nh, ng, hs)
    cos = sin = torch.empty(1, T, n, device="meta")
    wq = wk = torch.empty(hs, device="meta")
    q_out, k_out = rope(q, k, cos, sin, q_weight=wq, k_weight=wk)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.device.type == "meta"
    q_out, k_out = torch.ops.lit_liger.rope_qk_norm_fwd(q, k, cos, sin, wq, wk, False, 1e-6, 0.0)
    assert q_out.shape == q.shape and q_out.transpose(1, 2).is_contiguous()
    dq, dk, dwq, dwk = torch.ops.lit_liger.rope_qk_norm_bwd(q_out, k_out, q, k, cos, sin, wq, wk, False, 1e-6, 0.0, True)
    assert dq.shape == q.shape and dk.shape == k.shape and dwq.shape == dwk.shape == (hs,)


def test_rope_qk_norm_bad_weights(device):
    B, T, nh, ng, hs, n = 2, 3, 4, 2, 8, 4
    q = torch.randn(B, nh, T, hs, device=device)
    k = torch.randn(B, ng, T, hs, device=device)
    cos, sin = _cache(T, n, device)
    w = torch.ones(hs, device=device)
    with pytest.raises(ValueError, match="both q_weight and k_weight"):
        rope(q, k, cos, sin, q_weight=w)
    with pytest.raises(ValueError, match="both q_weight and k_weight"):
        rope(q, k, cos, sin, k_weight=w)
    with pytest.raises(ValueError, match=r"q_weight must be 1-D of the head size \(8,\)"):
        rope(q, k, cos, sin, q_weight=torch.ones(hs + 1, device=device), k_weight=w)
    with pytest.raises(ValueError, match="k_weight must be 1-D"):
        rope(q, k, cos, sin, q_weight=w, k_weight=torch.ones(2, hs, device=device))
    with pytest.raises(TypeError, match="float"):
        rope(q, k, cos, sin, q_weight=w, k_weight=w.long())
    if device == "cpu":
        with pytest.raises(ValueError, match="device"):
            rope(q, k, cos, sin, q_weight=w, k_weight=torch.ones(hs, device="meta"))


def test_rope_qk_norm_reference_path_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    torch.manual_seed(14)
    for dtype, offset in ((torch.float32, 0.0), (torch.bfloat16, 1.0)):
        _, q, k = _litgpt_qk(2, 3, 4, 2, 12, "cpu", dtype)
        cos, sin = _cache(3, 8, "cpu")
        nq, nk = _qk_norms(12, offset, "cpu", dtype, seed=4)
        # the CPU path is LitGPT's math bit for bit, bf16 weights with the unit offset included
        for interleave in (False, True):
            out = rope(q, k, cos, sin, interleave, q_weight=nq.weight, k_weight=nk.weight, offset=offset)
            ref = _litgpt_rope(nq(q), nk(k), cos, sin, interleave)
            assert all(torch.equal(a, b) for a, b in zip(out, ref))
        _compare_norm(q, k, cos, sin, nq, nk, False, offset, 1e-6 if dtype == torch.float32 else 1e-2)


# ----------------------------------------------------------------------------------------------
# GPU: real sizes and torch.compile
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(
    "hs, n, interleave", [(128, 128, False), (64, 64, True), (128, 32, False)], ids=["llama", "interleave", "partial"]
)
def test_rope_gpu_real_size(hs, n, interleave):
    torch.manual_seed(7)
    B, T, nh, ng = 4, 4096, 32, 8  # 16384 tokens, 32 q / 8 kv heads
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, "cuda", torch.bfloat16)
    cos, sin = _cache(T, n, "cuda")
    _compare(q, k, cos, sin, interleave, TOL[torch.bfloat16])


@pytest.mark.gpu
def test_rope_gpu_torch_compile_fullgraph():
    torch.manual_seed(8)
    torch._dynamo.reset()
    B, T, nh, ng, hs, n = 2, 257, 12, 4, 96, 48
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, "cuda", torch.bfloat16)
    cos, sin = _cache(T, n, "cuda")

    def f(q, k, cos, sin):
        q_rot, k_rot = rope(q, k, cos, sin)
        return q_rot * 2.0, k_rot + 1.0

    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(q, k, cos, sin)
    out_e = f(q, k, cos, sin)
    dq, dk = torch.randn_like(out_e[0]), torch.randn_like(out_e[1])
    g_c = torch.autograd.grad(out_c, (q, k), (dq, dk))
    g_e = torch.autograd.grad(out_e, (q, k), (dq, dk))
    for a, b in zip(out_c + g_c, out_e + g_e):
        assert rel_err(a, b) <= 1e-3
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["qwen3", "gemma3"])
def test_rope_qk_norm_gpu_real_size(offset):
    torch.manual_seed(15)
    B, T, nh, ng, hs = 4, 4096, 32, 8, 128
    qkv, q, k = _litgpt_qk(B, T, nh, ng, hs, "cuda", torch.bfloat16)
    cos, sin = _cache(T, hs, "cuda")
    nq, nk = _qk_norms(hs, offset, "cuda", torch.bfloat16)
    _compare_norm(q, k, cos, sin, nq, nk, False, offset, TOL[torch.bfloat16], leaves=(qkv,))


@pytest.mark.gpu
def test_rope_qk_norm_gpu_torch_compile_fullgraph():
    torch.manual_seed(16)
    torch._dynamo.reset()
    B, T, nh, ng, hs, n = 2, 257, 12, 4, 96, 48
    _, q, k = _litgpt_qk(B, T, nh, ng, hs, "cuda", torch.bfloat16)
    cos, sin = _cache(T, n, "cuda")
    nq, nk = _qk_norms(hs, 1.0, "cuda", torch.float32)
    wq, wk = nq.weight, nk.weight

    def f(q, k, cos, sin, wq, wk):
        q_rot, k_rot = rope(q, k, cos, sin, q_weight=wq, k_weight=wk, eps=1e-6, offset=1.0)
        return q_rot * 2.0, k_rot + 1.0

    compiled = torch.compile(f, fullgraph=True)
    out_c = compiled(q, k, cos, sin, wq, wk)
    out_e = f(q, k, cos, sin, wq, wk)
    dq, dk = torch.randn_like(out_e[0]), torch.randn_like(out_e[1])
    g_c = torch.autograd.grad(out_c, (q, k, wq, wk), (dq, dk))
    g_e = torch.autograd.grad(out_e, (q, k, wq, wk), (dq, dk))
    for a, b in zip(out_c + g_c, out_e + g_e):
        assert rel_err(a, b) <= 1e-3
    assert not torch._dynamo.utils.counters["graph_break"]


# ----------------------------------------------------------------------------------------------
# rope_qkv: the same rotation on LitGPT's fused qkv, the backward writing the qkv gradient
# ----------------------------------------------------------------------------------------------
def _compare_qkv(qkv, nh, ng, hs, cos, sin, interleave, tol, unused_v=False):
    """rope_qkv vs LitGPT's split + view + transpose + apply_rope: q, k, v and the gradient of qkv
    (through every output, or with v unused: its part of the gradient must be exactly zero)."""
    B, T, _ = qkv.shape
    q, k, v = _litgpt_views(qkv, nh, ng, hs)
    q_ref, k_ref = _litgpt_rope(q, k, cos, sin, interleave)
    q_out, k_out, v_out = rope_qkv(qkv, cos, sin, nh, ng, interleave)
    for out, ref in ((q_out, q_ref), (k_out, k_ref), (v_out, v)):
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert rel_err(out, ref) <= tol
    dq = torch.randn(B, T, nh, hs, device=qkv.device, dtype=qkv.dtype).transpose(1, 2)  # non-contiguous
    dk, dv = torch.randn_like(k_ref), torch.randn_like(v)
    outs, refs, grads = (q_out, k_out, v_out), (q_ref, k_ref, v), (dq, dk, dv)
    if unused_v:
        outs, refs, grads = outs[:2], refs[:2], grads[:2]
    (g,) = torch.autograd.grad(outs, (qkv,), grads)
    (g_ref,) = torch.autograd.grad(refs, (qkv,), grads)
    assert g.shape == qkv.shape and g.dtype == qkv.dtype and g.is_contiguous()
    assert rel_err(g, g_ref) <= tol
    if unused_v:
        assert not g[..., (nh + ng) * hs :].any()


@pytest.mark.parametrize("interleave", [False, True], ids=["halves", "interleave"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nh, ng, hs, n", SHAPES)
def test_rope_qkv_matches_litgpt(nh, ng, hs, n, dtype, interleave, device):
    torch.manual_seed(0)
    B, T = 2, 3
    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device=device, dtype=dtype, requires_grad=True)
    cos, sin = _cache(T, n, device)
    _compare_qkv(qkv, nh, ng, hs, cos, sin, interleave, TOL[dtype])


def test_rope_qkv_unused_v_and_no_grad(device):
    torch.manual_seed(1)
    nh, ng, hs, T = 4, 2, 16, 5
    qkv = torch.randn(2, T, (nh + 2 * ng) * hs, device=device, requires_grad=True)
    cos, sin = _cache(T, hs, device)
    _compare_qkv(qkv, nh, ng, hs, cos, sin, False, TOL[torch.float32], unused_v=True)
    with torch.no_grad():  # inference: plain views + rope, nothing saved
        q, k, v = rope_qkv(qkv, cos, sin, nh, ng)
    assert q.grad_fn is None and v.data_ptr() == qkv.data_ptr() + (nh + ng) * hs * qkv.element_size()


def test_rope_qkv_keeps_nothing_of_qkv_alive(device):
    # attention keeps q, k and v for backward: in training v must not be a view of qkv (it would keep
    # the whole projection alive), and rope_qkv itself keeps only cos/sin
    nh, ng, hs, T = 4, 2, 16, 5
    qkv = torch.randn(2, T, (nh + 2 * ng) * hs, device=device, requires_grad=True)
    cos, sin = _cache(T, hs, device)
    (q, k, v), kept = saved_bytes(lambda: rope_qkv(qkv, cos, sin, nh, ng))
    assert kept == cos.untyped_storage().nbytes() + sin.untyped_storage().nbytes()
    for t in (q, k, v):
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()  # its own buffer
        assert t.stride(-1) == 1 and t.stride(2) == t.shape[1] * t.shape[3]  # (B, T, heads, hs) layout


def test_rope_qkv_bad_inputs(device):
    qkv = torch.randn(2, 3, 8 * 16, device=device)
    cos, sin = _cache(3, 16, device)
    with pytest.raises(ValueError, match="qkv must be"):
        rope_qkv(qkv[0], cos, sin, 4, 2)
    with pytest.raises(ValueError, match="head size"):
        rope_qkv(qkv, cos, sin, 5, 2)  # 128 is not a multiple of 9
    with pytest.raises(ValueError):
        rope_qkv(qkv, cos[:, :2], sin[:, :2], 4, 2)  # cos/sin for 2 positions, qkv has 3


@pytest.mark.gpu
@pytest.mark.parametrize("hs, n, interleave", [(128, 128, False), (64, 64, True), (128, 32, False)],
                         ids=["llama", "interleave", "partial"])
def test_rope_qkv_gpu_real_size(hs, n, interleave):
    torch.manual_seed(9)
    B, T, nh, ng = 4, 4096, 32, 8
    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = _cache(T, n, "cuda")
    _compare_qkv(qkv, nh, ng, hs, cos, sin, interleave, TOL[torch.bfloat16])


@pytest.mark.gpu
def test_rope_qkv_gpu_torch_compile_fullgraph():
    torch.manual_seed(10)
    torch._dynamo.reset()
    B, T, nh, ng, hs, n = 2, 257, 12, 4, 96, 48
    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = _cache(T, n, "cuda")

    def f(qkv, cos, sin):
        q, k, v = rope_qkv(qkv, cos, sin, nh, ng)
        return q * 2.0, k + 1.0, v * 3.0

    out_c = torch.compile(f, fullgraph=True)(qkv, cos, sin)
    out_e = f(qkv, cos, sin)
    gs = [torch.randn_like(o) for o in out_e]
    (g_c,) = torch.autograd.grad(out_c, (qkv,), gs)
    (g_e,) = torch.autograd.grad(out_e, (qkv,), gs)
    for a, b in zip((*out_c, g_c), (*out_e, g_e)):
        assert rel_err(a, b) <= 1e-3
    assert not torch._dynamo.utils.counters["graph_break"]
