"""Issue 68: a recomputed Block keeps its attention's output and log-sum-exp from the forward (``MemPlan.attn``), so
its rerun in backward runs only the attention's backward (``lit_liger.swap.attend.kept_sdpa``). CPU: the kept path
against PyTorch's SDPA (outputs and gradients, GQA and not), the plan's Blocks with kept attention (on the host, on
the GPU, in an offloaded pair, beside a non-offloaded recomputed Block) against keeping everything, the plan's
decisions and line. GPU: the same against SDPA in bf16 at a long-ish length, and through a model."""

import types

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err
from test_checkpointing import _data, _lora_pair, _step
from test_memplan import _config, _force

from lit_liger import LigerConfig, apply_liger
from lit_liger.kernels import _launch
from lit_liger.runtime import attach, memplan
from lit_liger.swap import attend, gpt as swap_gpt

GiB = 2**30


def _qkv(nh, ng, T, hs, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    mk = lambda h: torch.randn(2, h, T, hs, generator=g, device=device, dtype=dtype).requires_grad_(True)  # noqa: E731
    return mk(nh), mk(ng), mk(ng), torch.randn(2, nh, T, hs, generator=g, device=device, dtype=dtype)


def _math_attention(q, k, v):
    """Causal attention written out in float64 (scores, mask, softmax, the groups' heads repeated): a reference
    independent of PyTorch's fused kernels, which the kept path and SDPA share."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    rep = q.size(1) // k.size(1)
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    T = q.size(-2)
    scores = (q @ kk.transpose(-1, -2)) * q.size(-1) ** -0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ vv, (q, k, v)


def _kept_run(q, k, v, dy, runtime):
    """The forward without grad (a reentrant checkpoint's), then the rerun with grad: (its output, q/k/v grads)."""
    kept = attend.KeptAttention(runtime)
    scale = q.size(-1) ** -0.5
    with torch.no_grad():
        first = attend.kept_sdpa(kept, q, k, v, scale)
    assert first is not None and kept.saved is not None
    again = attend.kept_sdpa(kept, q, k, v, scale)  # the rerun takes what the forward kept
    assert kept.saved is None and again.grad_fn is not None
    assert torch.equal(first, again)
    again.backward(dy)
    return again.detach(), [t.grad for t in (q, k, v)]


@pytest.mark.parametrize(("nh", "ng"), [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("host", [False, True])
def test_kept_sdpa_same_as_sdpa(nh, ng, host, monkeypatch):
    """MHA, GQA, MQA; kept on the GPU (here: the device) or through the runtime's host copy: the output and the
    gradients of q, k, v are SDPA's (``enable_gqa``) and those of attention written out in float64, and the rerun runs
    no attention forward."""
    q, k, v, dy = _qkv(nh, ng, 24, 16)
    ref, ref_inputs = _math_attention(q, k, v)
    ref.backward(dy.double())
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=ng != nh)
    want.backward(dy)
    want_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    forwards = []
    real = attend._sdpa_forward
    monkeypatch.setattr(attend, "_sdpa_forward", lambda *a: forwards.append(a[0]) or real(*a))
    copies = []
    rt = attach.RUNTIME
    if host:
        monkeypatch.setattr(memplan, "to_host", lambda t, _r=memplan.to_host: copies.append(t.dim()) or _r(t))
    out, grads = _kept_run(q, k, v, dy, rt if host else None)
    assert forwards == ["cpu"]
    assert copies == ([4, 3] if host else [])  # (the output and the log-sum-exp)
    assert rel_err(out, want.detach()) <= 1e-6 and rel_err(out.double(), ref.detach()) <= 1e-5
    for got, exp, math in zip(grads, want_grads, ref_inputs):
        assert got.shape == exp.shape == math.shape and rel_err(got, exp) <= 1e-5
        assert rel_err(got.double(), math.grad) <= 1e-5


@pytest.mark.parametrize(("nh", "ng", "cap", "parts"), [(8, 4, 1, 4), (8, 4, 2, 2), (8, 8, 1, 8), (4, 1, 1, 1)])
def test_sliced_backward_same_as_one_call(nh, ng, cap, parts, monkeypatch):
    """The attention's backward over slices of whole key/value groups (the query's bytes over
    ``ATTN_BWD_SLICE_BYTES``, set here to ``cap`` groups' worth of query heads): one kernel call per slice, and the
    gradients of q, k, v those of one call over all heads and of attention written out in float64."""
    q, k, v, dy = _qkv(nh, ng, 40, 16)
    ref, ref_inputs = _math_attention(q, k, v)
    ref.backward(dy.double())
    scale = q.size(-1) ** -0.5
    with torch.no_grad():
        out, lse, aux = attend._sdpa_forward("cpu", q, k, v, scale)
    whole = attend._sdpa_backward("cpu", dy, q, k, v, out, lse, aux, scale)[:3]
    calls = []
    real = attend._sdpa_backward
    monkeypatch.setattr(attend, "_sdpa_backward", lambda *a: calls.append(a[2].size(1)) or real(*a))
    head_bytes = q[:, :1].numel() * q.element_size()
    monkeypatch.setattr(_launch, "ATTN_BWD_SLICE_BYTES", cap * (nh // ng) * head_bytes)
    got = attend.sliced_sdpa_backward("cpu", dy, q, k, v, out, lse, aux, scale)
    assert calls == [nh // parts] * parts
    for g, w, m in zip(got, whole, ref_inputs):
        assert g.shape == w.shape and rel_err(g, w) <= 1e-6
        assert rel_err(g.double(), m.grad) <= 1e-5


def test_attn_bwd_slices():
    """The fewest slices (dividing the groups) whose query slice is within the cap; one group a slice at most."""
    cap = _launch.ATTN_BWD_SLICE_BYTES
    assert _launch.attn_bwd_slices(8, cap) == 1
    assert _launch.attn_bwd_slices(8, cap + 1) == 2
    assert _launch.attn_bwd_slices(8, 3 * cap) == 4  # (3 does not divide 8)
    assert _launch.attn_bwd_slices(8, 8 * GiB) == 8 and _launch.attn_bwd_slices(1, 8 * GiB) == 1
    assert _launch.attn_bwd_slices(6, 3 * cap) == 3


def test_kept_sdpa_without_a_fused_kernel_attends_as_before(monkeypatch):
    """Where PyTorch's choice is a kernel lit-liger cannot call apart (the math kernel here), nothing is kept and the
    caller attends as it did."""
    monkeypatch.setattr(attend, "_kept_backend", lambda *a: None)
    q, k, v, _ = _qkv(4, 2, 8, 16)
    kept = attend.KeptAttention()
    assert attend.kept_sdpa(kept, q, k, v, 0.25) is None and kept.saved is None


@pytest.mark.parametrize(("n_layer", "host", "pairs", "attn", "attn_host"), [
    (3, 3, 1, 3, 2),  # a pair (its first Block reruns twice from the kept output), host and GPU kept
    (3, 1, 0, 2, 1),  # an offloaded Block keeping on the host, a GPU-input Block (non-reentrant) keeping on the GPU
    (4, 4, 2, 1, 0),  # only the lowest Block keeps (on the GPU), the others rerun their attention
])
def test_blocks_keeping_attention_same_as_keeping_everything(n_layer, host, pairs, attn, attn_host, monkeypatch):
    """LoRA with dropout (each rerun draws its forward's masks), every Block recomputed: the lowest ``attn`` Blocks
    keep their attention's output, ``attn_host`` of them on the host. The loss and gradients are those of keeping
    every activation; the attention's forward ran once per Block in the forward and again only in the reruns of the
    Blocks that keep nothing; each kept output's backward ran once; the host copies are the kept ones."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    cfg, plain, auto = _lora_pair(0.2, n_layer=n_layer)
    apply_liger(plain, LigerConfig(activation_checkpointing=False))
    apply_liger(auto)
    x, y = _data(cfg)
    loss_a, grads_a = _step(plain, x, y)
    kept_fwd, kept_bwd, sdpa, copies = [], [], [], []
    real_fwd, real_bwd, real_sdpa = attend._sdpa_forward, attend._sdpa_backward, F.scaled_dot_product_attention
    monkeypatch.setattr(attend, "_sdpa_forward", lambda *a: kept_fwd.append(1) or real_fwd(*a))
    monkeypatch.setattr(attend, "_sdpa_backward", lambda *a: kept_bwd.append(1) or real_bwd(*a))
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: sdpa.append(1) or real_sdpa(*a, **kw))
    monkeypatch.setattr(memplan, "to_host", lambda t, _r=memplan.to_host: copies.append(t.dim()) or _r(t))
    _force(monkeypatch, n_layer, True, host=host, pairs=pairs, attn=attn, attn_host=attn_host)
    assert swap_gpt._memory_plan_here(auto, x) == (n_layer, True, 0, host, 0, pairs, attn, attn_host)
    loss_b, grads_b = _step(auto, x, y)
    # every Block attends once in the forward (through the kernel called apart: every Block here is recomputed); the
    # Blocks that keep nothing again in each rerun (a pair's first Block twice: the rerun that makes the second's
    # input, and its own); every Block's backward once
    reruns = sum(2 if i < 2 * pairs and i % 2 == 0 else 1 for i in range(attn, n_layer))
    assert (len(kept_fwd), len(kept_bwd), len(sdpa)) == (n_layer + reruns, n_layer, 0)
    # the host's copies: the offloaded inputs (3-dim), each host-kept Block's output (4-dim) and log-sum-exp (3-dim)
    assert copies.count(4) == attn_host and copies.count(3) == host - pairs + attn_host
    assert rel_err(loss_b, loss_a) <= 1e-6 and grads_a.keys() == grads_b.keys() and grads_a
    for n in grads_a:
        assert rel_err(grads_b[n], grads_a[n]) <= 1e-5, (n, rel_err(grads_b[n], grads_a[n]))


def test_attention_keepable_only_on_plain_causal_sdpa():
    """Every layer on plain causal SDPA (Llama) keeps; a softcap / window model (Gemma-2) does not."""
    from test_adapter import tiny_config
    from litgpt import GPT

    for name, want in (("Llama-3.2-1B", True), ("gemma-2-2b", False)):
        model = GPT(tiny_config(name))
        apply_liger(model)
        assert swap_gpt._attention_keepable(model) is want, name


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------
def test_keep_attention_takes_the_host_then_the_gpu_room_left():
    """Llama-3.1-8B at 262,144 tokens: the host's room left by the inputs first, then the GPU's, at most one per
    recomputed Block; the estimate and the host's share grow by what is kept; no host room known: the GPU's only;
    the line says how many and where."""
    cfg = _config("Llama-3.1-8B")
    T = 262144
    out, lse = memplan.attention_bytes(cfg, T)
    assert (out, lse) == (T * 4096 * 2, T * 32 * 4)
    per_host = memplan.host_bytes(out) + memplan.host_bytes(lse)
    base = memplan.MemPlan(32, True, 40 * GiB, 41 * GiB, host=25, host_need=50 * GiB, host_room=74 * GiB)
    plan = memplan.keep_attention(base, cfg, T)
    assert (plan.attn, plan.attn_host) == (11, 11)  # 24 GiB of host left: 11 outputs of 2.03 GiB; 1 GiB of GPU: none
    assert plan.need == base.need and plan.host_need == base.host_need + 11 * per_host <= plan.host_room
    roomy = memplan.keep_attention(memplan.MemPlan(32, True, 40 * GiB, 43 * GiB, host=25, host_need=50 * GiB,
                                                   host_room=74 * GiB), cfg, T)
    assert (roomy.attn, roomy.attn_host) == (12, 11) and roomy.need == 40 * GiB + out + lse <= roomy.available
    unknown = memplan.keep_attention(replace_room(base, None), cfg, T)
    assert (unknown.attn, unknown.attn_host) == (0, 0) and unknown == replace_room(base, None)
    everything = memplan.keep_attention(memplan.MemPlan(32, True, 10 * GiB, 41 * GiB, host=2, host_need=4 * GiB,
                                                        host_room=900 * GiB), cfg, T)
    assert (everything.attn, everything.attn_host) == (32, 32)
    line = plan.line(T, 32)
    assert "11 of them keep their attention's output for the backward's rerun (in pinned host memory): 11 attention " \
           "forwards fewer" in line
    assert ("12 of them keep their attention's output for the backward's rerun (11 in pinned host memory, 1 on the "
            "GPU)") in roomy.line(T, 32)


def replace_room(plan, host_room):
    from dataclasses import replace

    return replace(plan, host_room=host_room)


def test_plan_for_keeps_attention_only_where_inputs_go_to_the_host_and_the_model_can(monkeypatch):
    """A long micro-batch whose inputs go to the host: kept attention where the model says it can (``attend``), none
    where it cannot; a short one that keeps everything: the question is not asked."""
    cfg = _config("Llama-3.1-8B")
    monkeypatch.setattr(memplan, "room_now", lambda g, device, fraction=None: memplan.Room(
        80 * GiB, memplan.MEMORY_FRACTION, 16 * GiB, 0, 0))
    monkeypatch.setattr(memplan, "host_available", lambda: 200 * GiB)
    asked = []
    cuda = types.SimpleNamespace(type="cuda")

    def gpt():
        return types.SimpleNamespace(config=cfg, parameters=lambda: iter([torch.nn.Parameter(torch.zeros(4))]))

    long = memplan.plan_for(gpt(), 196608, cuda, tile=True, attend=lambda: asked.append(1) or True)
    assert long.host and long.attn == 32 and asked == [1]
    assert long.host_need <= long.host_room and long.need <= long.available
    assert memplan.plan_for(gpt(), 196608, cuda, tile=True, attend=False).attn == 0
    short = memplan.plan_for(gpt(), 2048, cuda, tile=True, attend=lambda: asked.append(1) or True)
    assert short.recompute == 0 and short.attn == 0 and asked == [1]


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("host", [False, True])
def test_kept_sdpa_same_as_sdpa_on_the_gpu(host):
    """bf16, Llama-3.1-8B's heads (32 query heads over 8 groups, head size 128), 8,192 tokens: the kernel PyTorch
    picks, called apart, gives SDPA's output and gradients (the same kernels: equal to bf16 rounding)."""
    q, k, v, dy = _qkv(32, 8, 8192, 128, device="cuda", dtype=torch.bfloat16)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want.backward(dy)
    want_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    assert attend._kept_backend(q, k, v, 128 ** -0.5) in ("flash", "cudnn")
    out, grads = _kept_run(q, k, v, dy, attach.RUNTIME if host else None)
    torch.cuda.synchronize()
    assert rel_err(out.float(), want.detach().float()) <= 1e-2
    for got, exp in zip(grads, want_grads):
        assert got.shape == exp.shape and rel_err(got.float(), exp.float()) <= 2e-2


@pytest.mark.gpu
def test_blocks_keeping_attention_on_the_gpu(monkeypatch):
    """A tiny Llama (bf16 LoRA) at 2,048 tokens on the GPU, every Block offloaded, two of three keeping their
    attention (one on the host): the loss and gradients are those of the plain run within bf16 rounding, and the
    kernel's backward called apart ran for each Block."""
    monkeypatch.setattr(memplan, "OFFLOAD_MIN_BYTES", 0)
    cfg, plain, auto = _lora_pair(0.0, n_layer=3, block_size=2048)
    plain, auto = plain.cuda().bfloat16(), auto.cuda().bfloat16()
    apply_liger(plain, LigerConfig(activation_checkpointing=False, cuda_graphs=False))
    apply_liger(auto, LigerConfig(cuda_graphs=False))
    x, y = _data(cfg, B=1, T=2048)
    x, y = x.cuda(), y.cuda()
    loss_a, grads_a = _step(plain, x, y)
    backs = []
    real_bwd = attend._sdpa_backward
    monkeypatch.setattr(attend, "_sdpa_backward", lambda *a: backs.append(a[0]) or real_bwd(*a))
    _force(monkeypatch, 3, True, host=3, attn=2, attn_host=1)
    loss_b, grads_b = _step(auto, x, y)
    assert len(backs) == 3 and set(backs) <= {"flash", "cudnn"}  # (the Block that keeps nothing too)
    assert rel_err(loss_b.float(), loss_a.float()) <= 1e-2
    for n in grads_a:
        assert rel_err(grads_b[n].float(), grads_a[n].float()) <= 5e-2, n


@pytest.mark.gpu
def test_sliced_backward_on_the_gpu(monkeypatch):
    """bf16, Llama-3.1-8B's heads, 16,384 tokens, the backward over 8 slices (one group each): the gradients of one
    call over all heads within bf16 rounding, and a lower peak (the kernel's float32 accumulator of the query's
    gradient spans one slice)."""
    q, k, v, dy = _qkv(32, 8, 16384, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v, dy = q[:1].detach(), k[:1].detach(), v[:1].detach(), dy[:1]
    scale = 128 ** -0.5
    backend = attend._kept_backend(q, k, v, scale)
    assert backend in ("flash", "cudnn")
    out, lse, aux = attend._sdpa_forward(backend, q, k, v, scale)
    peaks = []
    for cap in (q.numel() * q.element_size(), q.numel() * q.element_size() // 8):
        monkeypatch.setattr(_launch, "ATTN_BWD_SLICE_BYTES", cap)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads = attend.sliced_sdpa_backward(backend, dy, q, k, v, out, lse, aux, scale)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        if len(peaks) == 1:
            whole = grads
        del grads
    got = attend.sliced_sdpa_backward(backend, dy, q, k, v, out, lse, aux, scale)
    for g, w in zip(got, whole):
        assert g.shape == w.shape and rel_err(g.float(), w.float()) <= 1e-2
    print(f"sliced backward ({backend}): peak above the inputs {peaks[0] / 2**20:.0f} MiB in one call, "
          f"{peaks[1] / 2**20:.0f} MiB over 8 slices; the query {q.numel() * 2 / 2**20:.0f} MiB")
    assert peaks[1] < peaks[0]
