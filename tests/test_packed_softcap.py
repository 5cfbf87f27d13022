"""Packed attention with a logit softcap (Gemma-2): lit-liger's softcap kernel with each position's sample start
(``softcap_attention(..., starts=...)``) against ``reference`` with a block-diagonal causal mask and against the kernel
per sample; and a tiny Gemma-2 model packed with lit-liger against stock LitGPT on the padded batch."""

import pytest
import torch
from helpers import rel_err
from test_adapter import _pair, tiny_config
from test_packing import _batch, _compare, _full_step_loss, _lora_step_loss, pack_on_cpu  # noqa: F401

from lit_liger import LigerConfig, apply_liger
from lit_liger.swap import adapter as adapter_mod
from lit_liger.kernels.attention import reference, sample_starts, softcap_attention
from lit_liger.swap import packing as swap_packing

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _cu(lengths):
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    return torch.tensor(cu, dtype=torch.int32)


def _inputs(N, nh, ng, hs, dtype, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(1, nh, N, hs, dtype=dtype) * 2
    k = torch.randn(1, ng, N, hs, dtype=dtype) * 2
    v = torch.randn(1, ng, N, hs, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def test_sample_starts():
    cu = _cu([5, 1, 3, 0, 2])  # (an empty sample: a repeated boundary)
    assert sample_starts(cu, 11).tolist() == [0] * 5 + [5] + [6] * 3 + [9] * 2
    assert sample_starts(cu, 11, window=2).tolist() == [0, 0, 1, 2, 3, 5, 6, 6, 7, 9, 9]
    assert sample_starts(cu, 11).dtype == torch.int32


@pytest.mark.parametrize("lengths,window", [((5, 1, 17, 9), None), ((5, 1, 17, 9, 40, 3), None),
                                            ((37, 2, 30), 7), ((64,), None)])
@pytest.mark.parametrize("dtype,hs,nh,ng", [(torch.float32, 16, 4, 2), (torch.float32, 32, 2, 2),
                                            (torch.bfloat16, 64, 4, 1)])
def test_varlen_kernel_matches_reference_and_per_sample(lengths, window, dtype, hs, nh, ng):
    """Outputs and dq/dk/dv against the block-diagonal reference (fp32 math) and against the kernel run on each sample
    alone; 16-row blocks span samples, and long samples have unmasked blocks."""
    N, scale, cap = sum(lengths), hs ** -0.5, 3.0
    starts = sample_starts(_cu(lengths), N, window)
    q, k, v = _inputs(N, nh, ng, hs, dtype)
    y = softcap_attention(q, k, v, scale, cap, starts=starts)
    assert y.shape == (1, nh, N, hs)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (q, k, v), g)

    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    yr = reference(qr, kr, vr, scale, cap, starts)
    ref_grads = torch.autograd.grad(yr, (qr, kr, vr), g.float())
    for a, b in zip((y, *grads), (yr, *ref_grads)):
        assert rel_err(a, b) <= TOL[dtype], rel_err(a, b)

    if window is None:  # the kernel on each sample alone (its own causal attention)
        ys, gs = [], [[], [], []]
        s = 0
        for L in lengths:
            parts = [t.detach()[:, :, s:s + L].contiguous().requires_grad_() for t in (q, k, v)]
            yi = softcap_attention(*parts, scale, cap)
            ys.append(yi)
            for acc, gi in zip(gs, torch.autograd.grad(yi, parts, g[:, :, s:s + L])):
                acc.append(gi)
            s += L
        for a, b in zip((y, *grads), (torch.cat(ys, 2), *(torch.cat(x, 2) for x in gs))):
            assert rel_err(a, b) <= TOL[dtype], rel_err(a, b)


def test_varlen_rejects_bad_starts():
    q, k, v = _inputs(8, 2, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="starts"):
        softcap_attention(q, k, v, 0.25, 5.0, starts=torch.zeros(8, dtype=torch.int64))


def _gemma2(**extra):
    return tiny_config("gemma-2-2b", block_size=64, **extra)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors on a CUDA machine take LitGPT's per-sample path "
                    "(no interpreter there); on the GPU the kernel tests above and the packed Gemma-2 recipe cover it")
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("call", ["finetune_lora", "finetune_full"])
def test_packed_gemma2_equals_stock_padded(window, call, pack_on_cpu, monkeypatch):  # noqa: F811
    """A 2-layer Gemma-2 (softcap 50, final softcap, GQA; ``window``: its local / global layers with a sliding window
    shorter than a sample) packed with lit-liger: the softcap kernel over the samples' starts serves every layer, and
    the loss and every gradient equal stock LitGPT's on the padded batch."""
    cfg = _gemma2(sliding_window_size=window) if window else _gemma2()
    if window:
        cfg.sliding_window_indices = [1, 0]
    assert cfg.attention_logit_softcapping is not None
    ref, ours = _pair(cfg)
    report = apply_liger(ours, LigerConfig(packing=True))
    assert "training batches packed" in str(report) and "packing off" not in str(report)
    assert all(b.attn._liger_packable() is None for b in ours.transformer.h)
    calls = []
    real = swap_packing.attend

    def spy(*args, **kw):
        calls.append(kw.get("softcap_kernel"))
        return real(*args, **kw)

    monkeypatch.setattr(swap_packing, "attend", spy)
    x, y = _batch(cfg)
    out = ours(x)
    assert out.rows is not None and calls == [True, True]
    del out
    _compare(ref, ours, _lora_step_loss if call == "finetune_lora" else _full_step_loss, x, y)


def test_softcap_switched_off_keeps_packing_off(pack_on_cpu):  # noqa: F811
    """Without lit-liger's softcap kernel (``softcap_attention=False``) a softcap layer still cannot pack."""
    ref, ours = _pair(_gemma2())
    report = apply_liger(ours, LigerConfig(packing=True, softcap_attention=False))
    assert "packing off: transformer.h.0.attn: attention logit softcapping" in str(report)
