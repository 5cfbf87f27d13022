"""lit-liger's Adam / AdamW step (``lit_liger.kernels.adam``) and the optimizer switch onto it (``lit_liger.optim``).

References: ``torch.optim.Adam`` / ``AdamW``'s single-tensor implementation (``foreach=False``) in fp32, and fp64 math
for bf16 tensors. On CPU the kernel runs in Triton's interpreter (which rounds fp32 to bf16 by truncation: one bf16
ulp, hence the bf16 tolerance).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings

import pytest
import torch

from lit_liger import optim
from lit_liger.kernels.adam import adam_reference_, adam_step_

sys.path.insert(0, os.path.dirname(__file__))
from conftest import DEVICE  # noqa: E402

SHAPES = [(7, 5), (64,), (33, 16), (3,), (1,), (16, 17)]


def _tensors(dtype, device, seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device, dtype) for s in shapes]


@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("maximize", [False, True])
def test_kernel_steps_as_torch_adam_in_fp32(device, decoupled, maximize):
    """Three steps over tensors of odd sizes (and a non-contiguous gradient, which takes the reference path) equal
    torch's single-tensor Adam / AdamW within fp32 rounding."""
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    hyper = dict(lr=3e-2, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1, maximize=maximize)
    ref = [torch.nn.Parameter(t) for t in _tensors(torch.float32, device)]
    ours = [t.detach().clone() for t in ref]
    start = [t.detach().clone() for t in ref]
    opt = cls(ref, foreach=False, **hyper)
    m = [torch.zeros_like(t) for t in ours]
    v = [torch.zeros_like(t) for t in ours]
    steps = [torch.zeros(1, device=device) for _ in ours]
    for i in range(3):
        grads = _tensors(torch.float32, device, seed=10 + i)
        grads[2] = grads[2].t().contiguous().t()  # (33, 16) with strides (1, 33): the reference path
        assert not grads[2].is_contiguous()
        for p, gr in zip(ref, grads):
            p.grad = gr.clone()
        opt.step()
        for s in steps:
            s += 1
        adam_step_(ours, grads, m, v, steps, lr=3e-2, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1,
                   decoupled=decoupled, maximize=maximize)
    for p, o, s0 in zip(ref, ours, start):
        torch.testing.assert_close(o, p.detach(), rtol=2e-6, atol=2e-7)
        assert (o - s0).abs().max() > 1e-2  # they moved
    for p, mo, vo in zip(ref, m, v):
        torch.testing.assert_close(mo, opt.state[p]["exp_avg"], rtol=2e-6, atol=1e-7)
        torch.testing.assert_close(vo, opt.state[p]["exp_avg_sq"], rtol=2e-6, atol=1e-9)


def _fp64_step(p, g, m, v, t, lr, b1, b2, eps, wd):
    p, g, m, v = (x.double() for x in (p, g, m, v))
    p = p - lr * wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr / (1 - b1 ** t) * m / (v.sqrt() / (1 - b2 ** t) ** 0.5 + eps)
    return p, m, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_in_16_bits_against_fp64_math(device, dtype):
    """16-bit parameters, gradients and moments (bf16-true training): one step, each tensor within 16-bit rounding
    of fp64 math from the same inputs; every tensor of a group (sizes not multiples of 16 included) written."""
    shapes = SHAPES + [(4096,), (40, 100)]
    ps, gs = _tensors(dtype, device, 1, shapes), _tensors(dtype, device, 2, shapes)
    ms = [t * 0.1 for t in _tensors(dtype, device, 3, shapes)]
    vs = [t.abs() * 0.01 for t in _tensors(dtype, device, 4, shapes)]
    before = [[t.clone() for t in ts] for ts in (ps, gs, ms, vs)]
    steps = [torch.full((1,), 5.0, device=device) for _ in shapes]
    adam_step_(ps, gs, ms, vs, steps, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    for i in range(len(shapes)):
        p, m, v = _fp64_step(*(b[i] for b in before), 5.0, 1e-2, 0.9, 0.999, 1e-8, 0.01)
        for got, want in ((ps[i], p), (ms[i], m), (vs[i], v)):
            err = (got.double() - want).norm() / want.norm()
            assert err < 1e-2, (shapes[i], err)
        assert not torch.equal(ms[i], before[2][i])  # (written)


def test_reference_matches_the_kernel(device):
    """The PyTorch path (CPU without the interpreter, non-contiguous tensors) and the kernel give the same step."""
    ps = _tensors(torch.float32, device, 5)
    gs = _tensors(torch.float32, device, 6)
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    rp, rm, rv = [p.clone() for p in ps], [m.clone() for m in ms], [v.clone() for v in vs]
    steps = [torch.ones(1, device=device) for _ in ps]
    hyper = dict(lr=1e-3, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.0)
    adam_step_(ps, gs, ms, vs, steps, **hyper, decoupled=False)
    for p, g, m, v, s in zip(rp, gs, rm, rv, steps):
        adam_reference_(p, g, m, v, s, **hyper, decoupled=False)
    for a, b in zip(ps + ms + vs, rp + rm + rv):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_kernel_refuses_bad_input(device):
    p = torch.randn(8, device=device)
    ok = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
    one = torch.ones(1, device=device)
    with pytest.raises(ValueError, match="pair up"):
        adam_step_([p], [p.clone()], [p.clone()], [], [one], **ok)
    with pytest.raises(TypeError, match="lr must be a Python number"):
        adam_step_([p], [p.clone()], [p.clone()], [p.clone()], [one], **{**ok, "lr": torch.tensor(1e-3)})
    with pytest.raises(ValueError, match="betas"):
        adam_step_([p], [p.clone()], [p.clone()], [p.clone()], [one], **{**ok, "beta1": 1.0})
    with pytest.raises(ValueError, match="shape"):
        adam_step_([p], [torch.randn(9, device=device)], [p.clone()], [p.clone()], [one], **ok)
    with pytest.raises(ValueError, match="step count"):
        adam_step_([p], [p.clone()], [p.clone()], [p.clone()], [torch.ones(1, dtype=torch.int64, device=device)],
                   **ok)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        adam_step_([p.long()], [p.long()], [p.long()], [p.long()], [one], **ok)


# -- lit_liger.optim: the switch ------------------------------------------------------------------------------------
def _model_params(seed=0, device=DEVICE):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(16, 8, device=device)), torch.nn.Parameter(torch.randn(8, device=device)),
            torch.nn.Parameter(torch.randn(3, device=device))]


def _grads(ps, i):
    torch.manual_seed(100 + i)
    for p in ps[:2]:  # (the third parameter gets no gradient: not stepped, no state)
        p.grad = torch.randn_like(p)


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_switched_optimizer_keeps_its_class_name_state_and_steps(cls, device):
    ref_p, ours_p = _model_params(), _model_params()
    ref = cls(ref_p, lr=1e-2, weight_decay=0.1, foreach=False)
    ours = cls(ours_p, lr=1e-2, weight_decay=0.1)
    assert optim.fuse_optimizer(ours, devices=(torch.device(device).type,)) is None
    assert type(ours) is optim._OWN[cls] and isinstance(ours, cls) and type(ours).__name__ == cls.__name__
    assert ours.param_groups[0]["fused"] is True  # (a fallback step is torch's fused one)
    calls = []
    ours.register_step_pre_hook(lambda *a: calls.append("pre"))
    ours.register_step_post_hook(lambda *a: calls.append("post"))
    for i in range(3):
        _grads(ref_p, i)
        _grads(ours_p, i)
        ref.step()
        ours.step()
    assert calls == ["pre", "post"] * 3  # each hook once per step
    for a, b in zip(ref_p, ours_p):
        torch.testing.assert_close(b, a, rtol=2e-6, atol=2e-7)
    assert ours_p[2] not in ours.state  # (no gradient: no state, as torch)
    sr, so = ref.state_dict(), ours.state_dict()
    assert sr["state"].keys() == so["state"].keys() and sr["param_groups"][0].keys() == so["param_groups"][0].keys()
    for k in sr["state"]:
        assert sr["state"][k].keys() == so["state"][k].keys()
        step = so["state"][k]["step"]
        assert step.device.type == "cpu" and step.dtype == torch.float32 and float(step) == 3.0
    assert ours.state[ours_p[0]]["step"].device == ours_p[0].device  # (the live count stays on the device)
    stock = cls(_model_params(), lr=1e-2, weight_decay=0.1)
    stock.load_state_dict(so)  # a stock optimizer resumes from it
    assert optim.fuse_optimizer(ours, devices=(torch.device(device).type,)) == "the optimizer is fused already"


def test_switched_optimizer_falls_back_where_the_kernel_does_not_apply(monkeypatch, device):
    """amsgrad (a choice the kernel does not implement) and OWN_KERNEL off take the base class's step (torch's fused
    kernel), hooks still once; results as torch's."""
    dev = (torch.device(device).type,)
    ref_p, ours_p = _model_params(), _model_params()
    ref = torch.optim.AdamW(ref_p, lr=1e-2, amsgrad=True, foreach=False)
    ours = torch.optim.AdamW(ours_p, lr=1e-2, amsgrad=True)
    assert optim.fuse_optimizer(ours, devices=dev) is None
    assert ours._kernel_refusal() == "amsgrad=True"
    calls = []
    ours.register_step_post_hook(lambda *a: calls.append(1))
    for i in range(2):
        _grads(ref_p, i)
        _grads(ours_p, i)
        ref.step()
        ours.step()
    assert calls == [1, 1]
    for a, b in zip(ref_p, ours_p):
        torch.testing.assert_close(b, a, rtol=2e-6, atol=2e-7)
    monkeypatch.setattr(optim, "OWN_KERNEL", False)
    plain = torch.optim.AdamW(_model_params(), lr=1e-2)
    assert optim.fuse_optimizer(plain, devices=dev) is None
    assert type(plain) is torch.optim.AdamW and plain.param_groups[0]["fused"] is True
    line = optim.fuse_and_report(torch.optim.AdamW(_model_params(), lr=1e-2), "X")  # (optim.DEVICES: CUDA only)
    assert ("PyTorch's fused kernel" if device == "cuda" else "a parameter is on cpu") in line


def test_switched_optimizer_under_an_lr_scheduler_built_before(device):
    """A scheduler built before the switch had wrapped the class's old step: the switch re-points it (the kernel
    steps, the scheduler sees its optimizer step, no order warning)."""
    ps = _model_params()
    opt = torch.optim.AdamW(ps, lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 ** i)
    assert optim.fuse_optimizer(opt, devices=(torch.device(device).type,)) is None
    ran = []
    real = optim._OwnStep.step

    def spy(self, closure=None):
        ran.append(type(self))
        return real(self, closure)

    type(opt).step = spy  # (instance-level wrapper -> the class's current step)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(2):
                _grads(ps, i)
                opt.step()
                sched.step()
    finally:
        del type(opt).step
    assert ran == [optim.AdamW, optim.AdamW]
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.25)


def test_switched_optimizer_runs_a_closure(device):
    ps = _model_params()
    opt = torch.optim.Adam(ps, lr=1e-2)
    assert optim.fuse_optimizer(opt, devices=(torch.device(device).type,)) is None
    x = torch.randn(8, device=device)

    def closure():
        opt.zero_grad()
        loss = (ps[0] @ x).square().sum()
        loss.backward()
        return loss

    before = ps[0].detach().clone()
    loss = opt.step(closure)
    assert torch.is_tensor(loss) and float(loss.detach()) > 0  # (the closure's loss handed back)
    assert not torch.equal(before, ps[0]) and torch.equal(ps[1].detach(), _model_params()[1].detach())


# -- DTensor parameters (FSDP2), 2 processes over gloo -------------------------------------------------------------
def _fsdp_worker(rank: int, world: int, port: int, queue) -> None:
    from test_distributed import _finish, _join

    _join(rank, world, port, gpu=False)
    _finish(_fsdp_run(rank), queue)


def _fsdp_run(rank: int):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 5))
    ref = copy.deepcopy(model)
    start = [p.detach().clone() for p in ref.parameters()]
    fully_shard(model[0])
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    why = optim.fuse_optimizer(opt, devices=("cpu",))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    refusals = []
    for i in range(3):
        torch.manual_seed(10 + i)
        x = torch.randn(6, 8)  # (the same batch on both ranks: the averaged gradient is one process's)
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            if o is opt:
                refusals.append(o._kernel_refusal() if isinstance(o, optim._OwnStep) else "not switched")
            o.step()
    # each rank's shards against the same rows of one process's weights (FSDP2 shards dim 0 as torch.chunk does;
    # no gather: DTensor's full_tensor over gloo crashed on the GPU image's torch 2.11)
    errs, local = [], []
    for p, r, r0 in zip(model.parameters(), ref.parameters(), start):
        mine = p.to_local().detach()
        rows = torch.chunk(r.detach(), 2, dim=0)[rank]
        local.append(tuple(mine.shape))
        errs.append(float((mine[: rows.shape[0]] - rows).abs().max()) if rows.numel() else 0.0)
    moved = [float((r.detach() - r0).abs().max()) for r, r0 in zip(ref.parameters(), start)]
    return dict(rank=rank, why=why, name=type(opt).__name__, refusals=refusals, errs=errs, moved=moved, local=local,
                dtensor=all(isinstance(p, DTensor) for p in model.parameters()),
                state=opt.state_dict()["state"][0]["step"].device.type)


def test_dtensor_parameters_step_their_local_shards():
    """FSDP2 (``fully_shard``) parameters are DTensors: the switched AdamW steps each rank's shard (uneven: 5 rows
    over 2 ranks) and the gathered weights equal one process's stock AdamW."""
    import torch.multiprocessing as mp
    from test_distributed import _free_port, spawn_ranks

    queue = mp.get_context("spawn").SimpleQueue()
    spawn_ranks(_fsdp_worker, (2, _free_port(), queue))
    outs = sorted((queue.get(), queue.get()), key=lambda o: o["rank"])
    for out in outs:
        assert out["why"] is None and out["name"] == "AdamW" and out["dtensor"]
        assert out["refusals"] == [None, None, None]  # (the kernel stepped every time)
        assert max(out["errs"]) < 1e-5, out["errs"]
        assert min(out["moved"]) > 1e-3  # (every weight stepped)
        assert out["state"] == "cpu"  # (a checkpoint's step count on the host)
    assert [o["local"][2] for o in outs] == [(3, 16), (2, 16)]  # (the (5, 16) weight sharded unevenly)


def test_the_replica_plan_steps_a_switched_optimizer_per_parameter():
    """``lit_liger.dataparallel``'s chunked and zero1 steps take torch.optim's per-parameter optimizers: the switched
    class is one (it keeps the base class's algorithm)."""
    from lit_liger.dataparallel import _per_parameter

    opt = torch.optim.AdamW(_model_params(device="cpu"), lr=1e-3)
    assert _per_parameter(opt)
    assert optim.fuse_optimizer(opt, devices=("cpu",)) is None and type(opt) is optim.AdamW
    assert _per_parameter(opt)
