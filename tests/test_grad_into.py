"""Weight gradients added by their GEMM into a named tensor (``kernels._grad_into``, used by lit_liger.runtime.graphs' captured
backward) against PyTorch's own gradients of the same math; and the fused optimizer switch (``lit_liger.runtime.optim``)."""

import pytest
import torch
import torch.nn.functional as F

from lit_liger.kernels import _grad_into
from lit_liger.kernels.rms_norm import rms_norm_linear
from lit_liger.kernels.swiglu import glu_linear
from lit_liger.runtime.optim import fuse_optimizer


def _ref_rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _leaf(*shape, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=device, dtype=dtype) * scale).requires_grad_()


def _check_into(device, build, weights, ref_grads):
    """``build()`` run inside grads_into for ``weights``: each target ends as its start plus PyTorch's gradient; autograd
    got none for those weights; the other leaves' gradients equal PyTorch's."""
    starts = [torch.randn_like(w) for w in weights]
    targets = [s.clone() for s in starts]
    with _grad_into.grads_into(zip(weights, targets)) as written:
        out = build()
        out.backward(torch.ones_like(out) / out.numel() ** 0.5)
    assert all(_grad_into.target_for(w) is None for w in weights)  # the block is over
    assert written == {id(t) for t in targets}
    for w, s, t in zip(weights, starts, targets):
        assert w.grad is None
        ref = ref_grads[id(w)]
        torch.testing.assert_close(t - s, ref, rtol=1e-4, atol=1e-5)
        assert (t - s).abs().max() > 0.1 * ref.abs().max()  # not a zero gradient passing a loose check


def test_rms_norm_linear_adds_weight_grads_into_targets(device):
    torch.manual_seed(0)
    x = _leaf(2, 24, 32, device=device)
    nw = _leaf(32, device=device)
    w0, w1 = _leaf(48, 32, device=device, scale=0.2), _leaf(16, 32, device=device, scale=0.2)
    b0 = _leaf(48, device=device)
    g = torch.ones(2, 24, 64, device=device) / (2 * 24 * 64) ** 0.5
    n = _ref_rms(x, nw)
    ref_out = torch.cat([F.linear(n, w0, b0), F.linear(n, w1)], -1)
    refs = torch.autograd.grad(ref_out, (w0, w1, x, nw, b0), g)
    ref_grads = {id(w0): refs[0], id(w1): refs[1]}

    def build():
        _, (o0, o1) = rms_norm_linear(x, nw, [(w0, b0), (w1, None)], 1e-6)
        return torch.cat([o0, o1], -1)

    _check_into(device, build, [w0, w1], ref_grads)
    for leaf, ref in zip((x, nw, b0), refs[2:]):  # the others as before
        torch.testing.assert_close(leaf.grad, ref, rtol=1e-4, atol=1e-5)


def test_glu_linear_adds_weight_grad_into_target(device):
    torch.manual_seed(1)
    a, b = _leaf(3, 20, 64, device=device), _leaf(3, 20, 64, device=device)
    w = _leaf(32, 64, device=device, scale=0.2)
    g = torch.ones(3, 20, 32, device=device) / (3 * 20 * 32) ** 0.5
    ref = torch.autograd.grad(F.linear(F.silu(a) * b, w), (w, a, b), g)
    _check_into(device, lambda: glu_linear(a, b, w), [w], {id(w): ref[0]})
    torch.testing.assert_close(a.grad, ref[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.grad, ref[2], rtol=1e-4, atol=1e-5)


def test_linear_adds_weight_grad_into_target(device):
    torch.manual_seed(2)
    x = _leaf(4, 9, 32, device=device).transpose(0, 1)  # a strided input, as the attention's output view
    w, bias = _leaf(24, 32, device=device, scale=0.2), _leaf(24, device=device)
    g = torch.ones(9, 4, 24, device=device) / (9 * 4 * 24) ** 0.5
    ref = torch.autograd.grad(F.linear(x, w, bias), (w, x, bias), g)
    _check_into(device, lambda: _grad_into.linear(x, w, bias), [w], {id(w): ref[0]})
    torch.testing.assert_close(bias.grad, ref[2], rtol=1e-4, atol=1e-5)


def test_outside_the_block_gradients_go_to_autograd(device):
    w = _leaf(8, 4, device=device)
    x = torch.randn(3, 4, device=device)
    assert _grad_into.target_for(w) is None
    _grad_into.linear(x, w).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(3, 8, device=device).t() @ x)
    with _grad_into.grads_into([]):  # a weight not named: its own gradient
        assert _grad_into.target_for(w) is None
    with pytest.raises(ValueError, match="grads_into"):
        with _grad_into.grads_into([(w, torch.zeros(4, 8, device=device))]):
            pass
    with pytest.raises(ValueError, match="grads_into"):
        with _grad_into.grads_into([(w, torch.zeros(8, 4, device=device, dtype=torch.float64))]):
            pass


def test_a_backward_after_the_block_still_adds_into_the_target(device):
    """The target is recorded at the op's forward (what a captured forward then backward relies on)."""
    w = _leaf(8, 4, device=device)
    x = torch.randn(3, 4, device=device)
    target = torch.zeros_like(w)
    with _grad_into.grads_into([(w, target)]):
        out = _grad_into.linear(x, w)
    out.sum().backward()
    assert w.grad is None
    torch.testing.assert_close(target, torch.ones(3, 8, device=device).t() @ x)


def test_nested_blocks_restore_the_outer_targets(device):
    w, v = _leaf(8, 4, device=device), _leaf(8, 4, device=device)
    tw, tv = torch.zeros_like(w), torch.zeros_like(v)
    with _grad_into.grads_into([(w, tw)]):
        with _grad_into.grads_into([(v, tv)]):
            assert _grad_into.target_for(w) is tw and _grad_into.target_for(v) is tv
        assert _grad_into.target_for(w) is tw and _grad_into.target_for(v) is None
    assert _grad_into.target_for(w) is None


# -- lit_liger.runtime.optim.fuse_optimizer ---------------------------------------------------------------------------------
def _params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(8))]


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_fuse_optimizer_steps_like_the_foreach_default(cls):
    """Switched in place (CPU parameters allowed here; lit-liger passes only CUDA ones): the same steps as the default
    implementation within fp32 rounding, the same state_dict keys, the step count a float32 tensor."""
    ref_p, fused_p = _params(), _params()
    ref, fused = cls(ref_p, lr=1e-2, weight_decay=0.1), cls(fused_p, lr=1e-2, weight_decay=0.1)
    assert fuse_optimizer(fused, devices=("cuda",)) == "a parameter is on cpu"
    assert fused.param_groups[0]["fused"] is None  # (nothing changed)
    assert fuse_optimizer(fused, devices=("cpu",)) is None
    assert fused.param_groups[0]["fused"] is True and fused.defaults["fused"] is True
    for i in range(3):
        for ps in (ref_p, fused_p):
            torch.manual_seed(10 + i)
            for p in ps:
                p.grad = torch.randn_like(p)
        ref.step()
        fused.step()
    for a, b, start in zip(ref_p, fused_p, _params()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert (a - start).abs().max() > 1e-3  # they moved
    sr, sf = ref.state_dict(), fused.state_dict()
    assert sr["state"].keys() == sf["state"].keys()
    for k in sr["state"]:
        assert sr["state"][k].keys() == sf["state"][k].keys()
        assert float(sf["state"][k]["step"]) == 3.0 and sf["state"][k]["step"].dtype == torch.float32


def test_fuse_optimizer_moves_a_resumed_step_count_and_leaves_user_choices():
    ps = _params()
    opt = torch.optim.AdamW(ps, lr=1e-3)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
    opt.state[ps[0]]["step"] = torch.tensor(7.0)  # as a foreach checkpoint holds it
    assert fuse_optimizer(opt, devices=("cpu",)) is None
    assert float(opt.state[ps[0]]["step"]) == 7.0 and opt.state[ps[0]]["step"].dtype == torch.float32
    opt.step()  # the fused kernel takes it
    assert float(opt.state[ps[0]]["step"]) == 8.0
    assert fuse_optimizer(opt, devices=("cpu",)) == "the optimizer is fused already"
    assert "foreach=True" in fuse_optimizer(torch.optim.AdamW(_params(), foreach=True), devices=("cpu",))
    assert "not torch.optim.Adam" in fuse_optimizer(torch.optim.SGD(_params(), lr=0.1), devices=("cpu",))
    assert "differentiable" in fuse_optimizer(torch.optim.Adam(_params(), differentiable=True), devices=("cpu",))
    half = [torch.nn.Parameter(torch.zeros(3, dtype=torch.long), requires_grad=False)]
    assert "floating tensors" in fuse_optimizer(torch.optim.Adam(half), devices=("cpu",))


def test_fused_state_dict_hands_out_host_step_counts_without_touching_the_state():
    """The checkpoint keeps stock's layout (a float32 step on the host); the live state is not the one handed out."""
    ps = _params()
    opt = torch.optim.AdamW(ps, lr=1e-3)
    assert fuse_optimizer(opt, devices=("cpu",)) is None
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
    sd = opt.state_dict()
    for i, p in enumerate(ps):
        assert sd["state"][i]["step"].device.type == "cpu" and sd["state"][i]["step"].dtype == torch.float32
        assert sd["state"][i]["exp_avg"] is opt.state[p]["exp_avg"]  # (the rest as state_dict() gives it)
    fuse_optimizer(opt, devices=("cpu",))  # (already fused: no second hook)
    assert len(opt._optimizer_state_dict_post_hooks) == 1
    stock = torch.optim.AdamW(_params(), lr=1e-3)
    stock.load_state_dict(sd)  # a foreach optimizer resumes from it
    assert float(stock.state[stock.param_groups[0]["params"][0]]["step"]) == 1.0
