"""Shared test helpers: relative error per DESIGN.md and the tolerances."""

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN/inf anywhere gives inf (never passes)."""
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    denom = ref.norm().item()
    return (out - ref).norm().item() / max(denom, 1e-30)


TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def assert_same_grads(ref: torch.nn.Module, ours: torch.nn.Module, tol: float) -> None:
    """Every parameter of ``ours`` has a gradient exactly where the same-named parameter of ``ref`` has one, each within
    ``tol`` (``rel_err``) of it; at least one gradient is compared."""
    ref_params = dict(ref.named_parameters())
    n = 0
    for name, p in ours.named_parameters():
        g_ref = ref_params[name].grad
        assert (p.grad is None) == (g_ref is None), name
        if g_ref is not None:
            assert rel_err(p.grad, g_ref) <= tol, (name, rel_err(p.grad, g_ref))
            n += 1
    assert n > 0


def saved_bytes(fn, exclude=()):
    """``(fn(), bytes)``: the bytes of the distinct storages autograd keeps for backward while ``fn()``
    runs its forward (what a model holds as activations, parameters included unless they are in ``exclude``:
    tensors whose storages are not counted)."""
    storages = {}
    skip = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


def exercise_kernels(H: int, dtype: torch.dtype = torch.float32, variants: bool = False) -> None:
    """Forward and backward of every op at hidden size ``H`` (tiny row counts), so that every Triton
    kernel is launched. ``variants`` adds the other constexpr paths: norm offset, layer norm without
    affine, the two GELUs and ``glu_linear``, partial rotary / interleave / fused qk-norm / ``rope_qkv``,
    and the loss's softcap, bias, smoothing, z-loss, ``reduction="none"``, frozen weight and lean mode."""
    from lit_liger.kernels import (
        fused_linear_cross_entropy,
        geglu,
        glu_linear,
        layer_norm,
        rms_norm,
        rms_norm_residual,
        rope,
        rope_qkv,
        swiglu,
    )

    def leaf(*shape):
        return torch.randn(*shape, dtype=dtype).requires_grad_()

    x, w = leaf(3, H), leaf(H)
    rms_norm(x, w).sum().backward()
    layer_norm(x, w, leaf(H), 1e-5).sum().backward()
    a, b = leaf(2, H), leaf(2, H)
    swiglu(a, b).sum().backward()
    geglu(a, b, approximate="tanh").sum().backward()
    hs = min(256, H)
    q, k = leaf(1, 4, 2, hs), leaf(1, 2, 2, hs)
    cos, sin = torch.randn(1, 2, hs, dtype=dtype), torch.randn(1, 2, hs, dtype=dtype)
    qr, kr = rope(q, k, cos, sin)
    (qr.sum() + kr.sum()).backward()
    W = leaf(97, H)
    fused_linear_cross_entropy(x, W, torch.tensor([1, 5, -100])).backward()
    if not variants:
        return
    s, n = rms_norm_residual(x, leaf(3, H), w, 1e-5, offset=1.0)
    (s.sum() + n.sum()).backward()
    from lit_liger.kernels.rms_norm import rms_norm_add

    for next_norm, used in ((True, "both"), (True, "norm"), (False, "sum")):  # (both kernels' constexpr paths)
        s, n = rms_norm_add(x, leaf(3, H), w, 1e-5, 1.0, (leaf(H), 1e-6, 1.0) if next_norm else None)
        ((s.sum() if used != "norm" else 0) + (n.sum() if n is not None else 0)).backward()
    layer_norm(x, None, None, 1e-5).sum().backward()
    geglu(a, b, approximate="none").sum().backward()
    glu_linear(a, b, leaf(5, H)).sum().backward()
    for rot, inter in ((hs // 2, False), (hs, True)):  # partial rotary; interleaved pairs
        qr, kr = rope(q, k, cos[..., :rot], sin[..., :rot], inter)
        (qr.sum() + kr.sum()).backward()
    qr, kr = rope(q, k, cos, sin, q_weight=leaf(hs), k_weight=leaf(hs), offset=1.0)
    (qr.sum() + kr.sum()).backward()
    qkv = leaf(1, 2, (4 + 2 * 2) * hs)
    qr, kr, v = rope_qkv(qkv, cos, sin, 4, 2)
    (qr.sum() + kr.sum() + v.sum()).backward()
    bias, t = leaf(97), torch.tensor([1, 5, -100])
    for mode in ("fast", "lean"):
        fused_linear_cross_entropy(x, W, t, bias, softcap=30.0, label_smoothing=0.1, z_loss=1e-4,
                                   mode=mode).backward()
        fused_linear_cross_entropy(x, W.detach(), t, reduction="none", mode=mode).sum().backward()
