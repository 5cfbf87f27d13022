"""Softcap and sliding-window attention (``lit_liger.swap.attend``): LitGPT's mask semantics, the score_mod
math, swapped models with sliding windows against stock LitGPT, the report; FlexAttention itself on CPU
(forward; backward through its unfused reference) and on the GPU (fused kernels, real widths, compile,
CUDA graphs)."""

import copy

import pytest
import torch
from helpers import TOL, rel_err
from litgpt import GPT, Config
from litgpt import model as lm
from litgpt.utils import chunked_cross_entropy as litgpt_ce
from test_adapter import _check_parity, _pair

from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy
from lit_liger.swap import attend as A

needs_flex = pytest.mark.skipif(not A.flex_available(), reason="torch without FlexAttention")


# ------------------------------------------------------------------------------------------------
# LitGPT's masks, and the score_mod
# ------------------------------------------------------------------------------------------------
def _litgpt_window_mask(T: int, window: int) -> torch.Tensor:
    """The (T, T) mask LitGPT's own forward hands to its attention in a sliding-window layer (captured)."""
    cfg = Config(n_layer=1, n_embd=16, n_head=2, n_query_groups=2, head_size=8, block_size=max(T, 8),
                 sliding_window_size=window, sliding_window_indices=[1], rotary_percentage=1.0)
    attn = lm.CausalSelfAttention(cfg, 0)
    seen = []

    def capture(q, k, v, mask=None):
        seen.append(mask)
        return q.transpose(1, 2)

    attn.scaled_dot_product_attention = capture
    cos, sin = lm.build_rope_cache(T, cfg.rope_n_elem)
    attn(torch.randn(1, T, cfg.n_embd), cos.unsqueeze(0), sin.unsqueeze(0))
    (mask,) = seen
    assert mask.shape == (1, 1, T, T)
    return mask[0, 0]


def _grid(mask_mod, T: int) -> torch.Tensor:
    i = torch.arange(T)
    return mask_mod(0, 0, i[:, None], i[None, :])


@pytest.mark.parametrize("T, window", [(1, 3), (2, 3), (3, 3), (4, 3), (9, 1), (11, 12), (12, 12), (13, 12), (40, 7)])
def test_window_mask_mod_is_litgpts_sliding_window(T, window):
    litgpt = _litgpt_window_mask(T, window)
    allowed = _grid(A.window_mask_mod(window), T)
    assert allowed.dtype == torch.bool
    assert torch.equal(allowed, litgpt == 0)
    assert torch.isneginf(litgpt[~allowed]).all()
    # the CPU path's dense mask is the same mask, as LitGPT writes it (0 / -inf)
    assert torch.equal(A.dense_mask(T, window, "cpu", torch.float32)[0, 0], litgpt)
    # a window covering the sequence is plain causal attention (what effective_window relies on)
    assert (A.effective_window(T, window) is None) == torch.equal(allowed, _grid(A.window_mask_mod(None), T))


def test_causal_mask_mod_is_litgpts_causal_mask():
    T = 19
    assert torch.equal(_grid(A.window_mask_mod(None), T), lm.build_mask_cache(T)[0, 0])
    assert A.window_mask_mod(5) is A.window_mask_mod(5)  # one function object per window (compile guards)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_window_is_refused(bad):
    with pytest.raises(ValueError, match="sliding_window_size"):
        A.window_mask_mod(bad)
    with pytest.raises(ValueError, match="sliding_window_size"):
        A.effective_window(10, bad)


def test_softcap_score_mod_is_litgpts_softcapping():
    cap = 50.0
    s = (torch.randn(4, 64, dtype=torch.float64) * 80).requires_grad_()  # well into tanh's saturation
    s_ref = s.detach().clone().requires_grad_()
    out = A.softcap_score_mod(cap)(s, 0, 0, 0, 0)
    ref = lm.do_softcapping(s_ref, cap)
    assert rel_err(out, ref) <= 1e-12
    assert out.abs().max() < cap
    g = torch.randn_like(s)
    out.backward(g)
    ref.backward(g)
    assert rel_err(s.grad, s_ref.grad) <= 1e-12
    assert rel_err(s.grad, g * (1 - torch.tanh(s.detach() / cap) ** 2)) <= 1e-12  # d/ds cap·tanh(s/cap)
    with pytest.raises(ValueError, match="softcapping"):
        A.softcap_score_mod(0.0)


@needs_flex
def test_block_mask_skips_only_blocks_outside_the_window():
    T, window = 300, 100  # 128-token blocks: 3 x 3, the window leaves block (2, 0) empty
    bm = A.block_mask(T, window, torch.device("cpu"))
    assert A.block_mask(T, window, torch.device("cpu")) is bm  # cached per (T, window, device)
    assert bm.mask_mod is A.window_mask_mod(window)
    B = bm.BLOCK_SIZE[0]
    n = -(-T // B)
    allowed = torch.zeros(n * B, n * B, dtype=torch.bool)
    allowed[:T, :T] = _grid(A.window_mask_mod(window), T)
    expected = allowed.view(n, B, n, B).any(dim=3).any(dim=1)  # a block is visited iff it holds a visible key
    assert torch.equal(bm.to_dense()[0, 0].bool(), expected)
    assert not expected.all()  # the case skips blocks


def test_block_mask_is_never_built_during_cuda_graph_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    if not A.flex_available():
        pytest.skip("torch without FlexAttention")
    with pytest.raises(RuntimeError, match="capture"):
        A.block_mask(77, 9, torch.device("cuda", 0))  # not built yet: refused before touching the device


def test_flex_attend_refuses_bad_shapes():
    q = torch.randn(1, 4, 6, 8)
    with pytest.raises(ValueError, match="nh % ng"):
        A.flex_attend(q, torch.randn(1, 3, 6, 8), torch.randn(1, 3, 6, 8), scale=1.0)
    with pytest.raises(ValueError, match="heads, T, hs"):
        A.flex_attend(q, torch.randn(4, 6, 8), torch.randn(4, 6, 8), scale=1.0)


def test_flex_launch_settings_only_where_measured(monkeypatch):
    from lit_liger.kernels import _launch as L

    cuda = torch.device("cuda", 0)
    assert L.flex_kernel_options(256, torch.bfloat16, torch.device("cpu")) is None
    monkeypatch.setattr(L, "device_limits", lambda d: L.DeviceLimits("h100", 32, 1024, 132, (9, 0), False))
    opts = L.flex_kernel_options(256, torch.bfloat16, cuda, windowed=True)
    assert opts["bwd_num_warps"] == 8
    assert all(k.startswith("bwd_") for k in opts)  # the backward's only: the forward keeps torch's default
    # a causal block mask's blocks are contiguous; a window's partial blocks are not (never claimed there)
    assert L.flex_kernel_options(256, torch.bfloat16, cuda)["BLOCKS_ARE_CONTIGUOUS"] is True
    assert "BLOCKS_ARE_CONTIGUOUS" not in opts
    assert L.flex_kernel_options(128, torch.bfloat16, cuda) is None  # torch's sm90 default kept
    assert L.flex_kernel_options(256, torch.float32, cuda) is None
    monkeypatch.setattr(L, "device_limits", lambda d: L.DeviceLimits("a100", 32, 1024, 108, (8, 0), False))
    assert L.flex_kernel_options(256, torch.bfloat16, cuda) is None


def test_flex_attend_hands_the_launch_settings_to_flex_attention(monkeypatch):
    seen = {}
    monkeypatch.setattr(A, "flex_kernel_options",
                        lambda hs, dtype, device, windowed: {"bwd_num_warps": hs, "windowed": windowed})
    monkeypatch.setattr(A, "flex_attention", lambda q, k, v, **kw: seen.update(kw) or q)
    monkeypatch.setattr(A, "block_mask", lambda T, window, device: None)
    q = torch.randn(1, 2, 6, 8)
    A.flex_attend(q, q, q, scale=1.0)
    assert seen["kernel_options"] == {"bwd_num_warps": 8, "windowed": False}
    A.flex_attend(q, q, q, scale=1.0, window=4)  # shorter than T = 6: a window
    assert seen["kernel_options"] == {"bwd_num_warps": 8, "windowed": True}
    A.flex_attend(q, q, q, scale=1.0, window=6)  # covers every key: LitGPT's mask is the causal one
    assert seen["kernel_options"] == {"bwd_num_warps": 8, "windowed": False}


# ------------------------------------------------------------------------------------------------
# The swapped attention module: FlexAttention forced on CPU tensors vs LitGPT's module
# ------------------------------------------------------------------------------------------------
# (n_query_groups, softcap, window, attention_scores_scalar, T): MHA / GQA / MQA, window < T, = T, > T
ATTN_CASES = [
    (4, None, 5, None, 13),
    (2, 30.0, None, None, 13),
    (2, 30.0, 5, 24, 13),
    (1, 20.0, 4, None, 9),
    (1, None, 16, None, 16),
    (4, 50.0, 7, None, 6),
]


def _attn_pair(ng, softcap, window, scalar, T, dtype=torch.float32, device="cpu"):
    """Two copies of a 2-layer GPT (layer 0 with the window, layer 1 global), the second swapped."""
    cfg = Config(name="attn-test", n_layer=2, n_embd=48, n_head=4, n_query_groups=ng, head_size=16,
                 intermediate_size=64, block_size=32, padded_vocab_size=64, vocab_size=64, bias=False,
                 norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=0.5,
                 sliding_window_size=window, sliding_window_indices=[1, 0] if window else None,
                 attention_logit_softcapping=softcap, attention_scores_scalar=scalar)
    ref, ours = _pair(cfg)
    ref, ours = ref.to(device, dtype), ours.to(device, dtype)
    apply_liger(ours)
    torch.manual_seed(2)
    x = torch.randn(2, T, cfg.n_embd, device=device, dtype=dtype)
    cos, sin = ref.cos[:T].unsqueeze(0), ref.sin[:T].unsqueeze(0)
    return cfg, ref, ours, x, cos, sin


def _spy_flex(monkeypatch):
    calls = []
    real = A.flex_attend

    def spy(q, k, v, **kw):
        calls.append(kw)
        return real(q, k, v, **kw)

    monkeypatch.setattr(A, "flex_attend", spy)
    return calls


def _spy_softcap_kernel(monkeypatch):
    """Calls of lit-liger's Triton softcap attention from the swapped module."""
    from lit_liger.swap import attention as swap_attention

    calls = []
    real = swap_attention.softcap_attention

    def spy(q, k, v, scale, softcap):
        calls.append((tuple(q.shape), scale, softcap))
        return real(q, k, v, scale, softcap)

    monkeypatch.setattr(swap_attention, "softcap_attention", spy)
    return calls


@needs_flex
@pytest.mark.parametrize("ng, softcap, window, scalar, T", ATTN_CASES)
def test_flex_path_forward_matches_litgpt_on_cpu(ng, softcap, window, scalar, T, monkeypatch):
    cfg, ref, ours, x, cos, sin = _attn_pair(ng, softcap, window, scalar, T)
    monkeypatch.setattr(A, "_FLEX_ON_CPU", True)
    calls = _spy_flex(monkeypatch)
    kernel_calls = _spy_softcap_kernel(monkeypatch)
    with torch.no_grad():
        for i in range(cfg.n_layer):
            out = ours.transformer.h[i].attn(x, cos, sin)
            assert rel_err(out, ref.transformer.h[i].attn(x, cos, sin)) <= 1e-5, i
    # a window shorter than T: FlexAttention; a softcap layer whose T fits its window: the Triton kernel
    capped = [i for i in range(cfg.n_layer) if softcap is not None and (i == 1 or window is None or window >= T)]
    flexed = [i for i in range(cfg.n_layer) if i not in capped and (softcap is not None or (window and i == 0))]
    assert len(calls) == len(flexed)
    assert [c[2] for c in kernel_calls] == [softcap] * len(capped)
    if flexed:
        assert calls[0]["window"] == window


@needs_flex
@pytest.mark.parametrize("ng, softcap, window, scalar, T", [ATTN_CASES[2], ATTN_CASES[3], ATTN_CASES[0]])
def test_flex_path_gradients_match_litgpt_on_cpu(ng, softcap, window, scalar, T, monkeypatch):
    """FlexAttention refuses CPU backward (it has no fused CPU kernel for it); with that check lifted its
    unfused reference runs the same score_mod / mask_mod / GQA / scale arguments through autograd."""
    import torch.nn.attention.flex_attention as flex

    if not hasattr(flex, "_validate_device"):
        pytest.skip("this torch has no CPU-backward check to lift")
    monkeypatch.setattr(flex, "_validate_device", lambda *a: None)
    # its autograd reference is traced by dynamo ("eager" backend): start each case from static shapes
    # (after other lengths, automatic dynamic shapes trip that tracing on CPU in torch 2.13)
    torch._dynamo.reset()
    monkeypatch.setattr(A, "_FLEX_ON_CPU", True)
    cfg, ref, ours, x, cos, sin = _attn_pair(ng, softcap, window, scalar, T)
    calls = _spy_flex(monkeypatch)
    a_ref, a_ours = ref.transformer.h[0].attn, ours.transformer.h[0].attn  # the window layer
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_ours = a_ref(x_ref, cos, sin), a_ours(x_ours, cos, sin)
    assert len(calls) == 1
    assert rel_err(y_ours, y_ref) <= 1e-5
    g = torch.randn_like(y_ref)
    y_ref.backward(g)
    y_ours.backward(g)
    assert rel_err(x_ours.grad, x_ref.grad) <= 1e-5
    for (n, p), q in zip(a_ours.named_parameters(), a_ref.parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-5, n


@pytest.mark.parametrize("ng, softcap, window, scalar, T", [ATTN_CASES[1], ATTN_CASES[5]])
def test_softcap_kernel_gradients_match_litgpt_on_cpu(ng, softcap, window, scalar, T, monkeypatch):
    """Softcap layers whose sequence fits the window: lit-liger's Triton kernel (under the interpreter), loss and
    every gradient of the attention module against LitGPT's."""
    cfg, ref, ours, x, cos, sin = _attn_pair(ng, softcap, window, scalar, T)
    kernel_calls = _spy_softcap_kernel(monkeypatch)
    flex_calls = _spy_flex(monkeypatch)
    for i in range(cfg.n_layer):
        a_ref, a_ours = ref.transformer.h[i].attn, ours.transformer.h[i].attn
        x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_ref, y_ours = a_ref(x_ref, cos, sin), a_ours(x_ours, cos, sin)
        assert rel_err(y_ours, y_ref) <= 1e-5, i
        g = torch.randn_like(y_ref)
        y_ref.backward(g)
        y_ours.backward(g)
        assert rel_err(x_ours.grad, x_ref.grad) <= 1e-5, i
        for (n, p), q in zip(a_ours.named_parameters(), a_ref.parameters()):
            assert rel_err(p.grad, q.grad) <= 1e-5, (i, n)
    assert len(kernel_calls) == cfg.n_layer and flex_calls == []
    off = _attn_pair(ng, softcap, window, scalar, T)[2]
    apply_liger(off, {"softcap_attention": False})  # switched off: FlexAttention's path (here LitGPT's math on CPU)
    kernel_calls.clear()
    with torch.no_grad():
        off.transformer.h[1].attn(x, cos, sin)
    assert kernel_calls == []


# ------------------------------------------------------------------------------------------------
# Whole models with sliding windows (CPU: LitGPT's math after lit-liger's RoPE)
# ------------------------------------------------------------------------------------------------
# name -> tiny overrides keeping the family's flags, with a window shorter than the test's T=12
WINDOW_FAMILIES = {
    # softcap 50 + final softcap, local/global alternating, GQA
    "gemma-2-2b": dict(n_layer=3, n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=96,
                       sliding_window_size=5),
    # local, global, local; qk-norm fused into RoPE; local/global RoPE bases; MQA
    "gemma-3-1b-it": dict(n_layer=3, n_embd=64, n_head=4, n_query_groups=1, head_size=16, intermediate_size=96,
                          sliding_window_size=4, sliding_window_indices=[1, 0, 1], rope_indices=[1, 0, 1]),
    # every layer windowed, GQA
    "Mistral-7B-v0.1": dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=96,
                            sliding_window_size=6),
    # every layer windowed, MHA
    "Phi-3-mini-4k-instruct": dict(n_layer=2, n_embd=48, n_head=2, n_query_groups=2, head_size=24,
                                   intermediate_size=80, sliding_window_size=5),
}


def window_config(name: str, **extra) -> Config:
    over = dict(padded_vocab_size=160, vocab_size=150, block_size=32)
    over.update(WINDOW_FAMILIES[name])
    over.update(extra)
    return Config.from_name(name, **over)


@pytest.mark.parametrize("name", list(WINDOW_FAMILIES))
def test_window_family_parity_on_cpu(name, monkeypatch):
    cfg = window_config(name)
    ref, ours = _pair(cfg)
    report = apply_liger(ours)
    calls = _spy_flex(monkeypatch)
    kernel_calls = _spy_softcap_kernel(monkeypatch)
    _check_parity(ref, ours, cfg)  # B=2, T=12 > window: loss, every gradient, the no-grad logits
    assert calls == []  # CPU tensors: LitGPT's math, not FlexAttention
    # Gemma-2's global softcap layer: lit-liger's Triton kernel (under the interpreter), once per training forward
    assert bool(kernel_calls) == (cfg.attention_logit_softcapping is not None)
    # the fused norm_1 -> qkv now covers the window layers too
    assert sum(1 for _, _, k in report.swapped if "norm_1 and norm_2 outputs recomputed" in k) == cfg.n_layer
    assert not any("sliding" in why for path, _, why in report.skipped if path.startswith("transformer.h."))


def test_report_names_each_layers_attention():
    cfg = window_config("gemma-2-2b")
    _, ours = _pair(cfg)
    report = apply_liger(ours)
    cap = cfg.attention_logit_softcapping
    cpu = "LitGPT's math on CPU without the Triton interpreter"
    local = (f"attention: lit-liger Triton causal softcap {cap} (bf16/fp16 on CUDA, sequences up to 5 tokens); "
             f"flex attention (softcap {cap}, sliding window 5) otherwise; {cpu}")
    glob = f"attention: lit-liger Triton causal softcap {cap} (bf16/fp16 on CUDA); flex attention (softcap {cap}) " \
           f"otherwise; {cpu}"
    assert report.paths(local) == ["transformer.h.0.attn", "transformer.h.2.attn"]
    assert report.paths(glob) == ["transformer.h.1.attn"]
    assert local in str(report)
    off = apply_liger(ours, {"flex_attention": False})
    assert off.paths(f"attention: LitGPT's math (softcap {cap}, sliding window 5; flex_attention switched off)") \
        == ["transformer.h.0.attn", "transformer.h.2.attn"]
    keep = "softcap / sliding-window layers keep RoPE + FlexAttention"  # the compile_min_tokens line says so
    assert any(keep in why for _, _, why in report.swapped) and not any(keep in why for _, _, why in off.swapped)
    g3 = apply_liger(_pair(window_config("gemma-3-1b-it"))[1])
    assert g3.paths("attention: SDPA (causal)") == ["transformer.h.1.attn"]  # Gemma-3's global layer
    assert g3.count("attention: flex attention (sliding window 4) on CUDA; LitGPT's math on CPU") == 2
    assert "flex_attention" in LigerConfig.switches()


def test_flex_switched_off_keeps_litgpt_results(monkeypatch):
    cfg = window_config("Mistral-7B-v0.1")
    ref, ours = _pair(cfg)
    apply_liger(ours, {"flex_attention": False})
    monkeypatch.setattr(A, "_FLEX_ON_CPU", True)  # even where FlexAttention could run, the switch wins
    calls = _spy_flex(monkeypatch)
    _check_parity(ref, ours, cfg)
    assert calls == []


# ------------------------------------------------------------------------------------------------
# GPU: FlexAttention's fused kernels against stock LitGPT
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("ng, softcap, window, scalar",
                         [(2, 50.0, 200, 256), (8, None, 200, None), (1, 30.0, None, None)])
def test_gpu_flex_attention_module_matches_litgpt(ng, softcap, window, scalar):
    """One swapped attention layer at a real width (hs 128, T=700 > window: skipped and partial blocks;
    GQA with softcap and attention_scores_scalar, MHA with a window, MQA with softcap), forward and every
    gradient in fp32 against stock LitGPT (bf16: the family tests below)."""
    cfg = Config(name="attn-gpu", n_layer=1, n_embd=1024, n_head=8, n_query_groups=ng, head_size=128,
                 intermediate_size=64, block_size=1024, padded_vocab_size=64, vocab_size=64, bias=False,
                 norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0,
                 sliding_window_size=window, sliding_window_indices=[1] if window else None,
                 attention_logit_softcapping=softcap, attention_scores_scalar=scalar)
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref32 = GPT(cfg)
    ref32.apply(ref32._init_weights)
    stock, ours = ref32, copy.deepcopy(ref32)
    apply_liger(ours)
    T = 700
    x0 = torch.randn(2, T, cfg.n_embd, device="cuda")
    g = torch.randn(2, T, cfg.n_embd, device="cuda")
    res = {}
    for key, m in (("stock", stock), ("ours", ours)):
        x = x0.clone().requires_grad_()
        attn = m.transformer.h[0].attn
        y = attn(x, m.cos[:T].unsqueeze(0), m.sin[:T].unsqueeze(0))  # each model's own rope cache, as in GPT
        y.backward(g)
        res[key] = [y, x.grad] + [p.grad for p in attn.parameters()]
    names = ["out", "dx"] + [n for n, _ in ours.transformer.h[0].attn.named_parameters()]
    for n, a, b in zip(names, res["ours"], res["stock"]):
        assert rel_err(a, b) <= (1e-5 if n == "out" else 1e-4), (n, rel_err(a, b))


def _gpu_window_model(name, n_layer, window, dtype, block_size=1024):
    over = dict(n_layer=n_layer, block_size=block_size)
    if window is not None:
        over["sliding_window_size"] = window
    cfg = Config.from_name(name, **over)
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref32 = GPT(cfg)
    ref32.apply(ref32._init_weights)
    return cfg, ref32


# name, n_layer, window (None: the config's own), T: every case has local layers with T > window
GPU_FAMILIES = [
    ("gemma-2-2b", 2, 256, 640),  # softcap 50, window layer + global layer, GQA, hs 256
    ("gemma-3-1b-it", 6, None, 640),  # window 512, 5 local + 1 global, qk-norm, MQA, hs 256
    ("Mistral-7B-v0.1", 2, 256, 640),  # every layer windowed, GQA, hs 128
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name, n_layer, window, T", GPU_FAMILIES)
def test_gpu_window_family_parity(name, n_layer, window, T, dtype):
    """Loss and every gradient of the swapped model (FlexAttention in the softcap / window layers) against
    stock LitGPT at the family's real width: fp32 directly (1e-5 loss, 1e-4 gradients, as on CPU); bf16
    no further from the fp32 model than stock LitGPT's bf16 (as test_gpu_real_size_bf16_parity)."""
    cfg, ref32 = _gpu_window_model(name, n_layer, window, dtype)
    stock, ours = copy.deepcopy(ref32).to(dtype), copy.deepcopy(ref32).to(dtype)
    report = apply_liger(ours, {"cuda_graphs": False})
    assert any(k.startswith(("attention: flex", "attention: lit-liger Triton")) for _, _, k in report.swapped)
    x = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (2, T), device="cuda")
    models = {"stock": stock, "ours": ours} if dtype == torch.float32 else {"fp32": ref32, "stock": stock, "ours": ours}
    losses = {}
    for key, m in models.items():
        out = m(x)
        losses[key] = chunked_cross_entropy(out, y) if key == "ours" else litgpt_ce(out, y, chunk_size=0)
        losses[key].backward()
    p_stock = dict(stock.named_parameters())
    if dtype == torch.float32:
        assert rel_err(losses["ours"], losses["stock"]) <= 1e-5
        for n, p in ours.named_parameters():
            assert rel_err(p.grad, p_stock[n].grad) <= 1e-4, (n, rel_err(p.grad, p_stock[n].grad))
        return
    assert rel_err(losses["ours"], losses["fp32"]) <= max(2 * rel_err(losses["stock"], losses["fp32"]), 1e-3)
    p32 = dict(ref32.named_parameters())
    worst = max((rel_err(p.grad, p32[n].grad) / max(rel_err(p_stock[n].grad, p32[n].grad), 1e-3), n)
                for n, p in ours.named_parameters())
    assert worst[0] <= 2.0, worst


@pytest.mark.gpu
@pytest.mark.parametrize("name, window", [("gemma-2-2b", 128)])  # softcap, local + global layers, GQA
def test_gpu_compile_fullgraph_flex_layers(name, window):
    """torch.compile(fullgraph=True) over a swapped model whose layers attend through FlexAttention
    (traced, block mask built in the graph): no graph break, same loss and gradients as eager."""
    cfg, ref32 = _gpu_window_model(name, 2, window, torch.bfloat16, block_size=512)
    ours = ref32.to(torch.bfloat16)
    apply_liger(ours, {"compile_min_tokens": 0, "cuda_graphs": False})  # lit-liger's ops at every size
    x = torch.randint(0, cfg.vocab_size, (2, 384), device="cuda")
    y = torch.randint(0, cfg.vocab_size, (2, 384), device="cuda")
    y[:, :10] = -100

    def step(idx, targets):
        return chunked_cross_entropy(ours(idx), targets)

    loss_e = step(x, y)
    loss_e.backward()
    grads_e = {n: p.grad.clone() for n, p in ours.named_parameters()}
    ours.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    loss_c = torch.compile(step, fullgraph=True)(x, y)  # raises on any graph break
    loss_c.backward()
    assert rel_err(loss_c, loss_e) <= 1e-2
    worst = max((rel_err(p.grad, grads_e[n]), n) for n, p in ours.named_parameters())
    assert worst[0] <= 5e-2, worst  # bf16, two differently fused programs; a wrong attention gives ~1


@pytest.mark.gpu
def test_gpu_window_step_no_host_sync_and_cuda_graphs():
    """A Mistral-shaped step with T > window never waits for the GPU after its warm-up (block masks are
    built once per shape). With ``cuda_graphs=True`` the step is captured and replayed, and gives the same loss
    and gradients."""
    cfg, ref32 = _gpu_window_model("Mistral-7B-v0.1", 2, 128, torch.bfloat16, block_size=512)
    plain = ref32.to(torch.bfloat16)
    graphed = copy.deepcopy(plain)
    apply_liger(plain, {"cuda_graphs": False})
    apply_liger(graphed, {"cuda_graphs": True})
    x = torch.randint(0, cfg.vocab_size, (2, 320), device="cuda")  # a bucket length: no padding
    y = torch.randint(0, cfg.vocab_size, (2, 320), device="cuda")
    chunked_cross_entropy(plain(x), y).backward()  # warm-up: compilation, block mask, probes
    plain.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = chunked_cross_entropy(plain(x), y)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    from lit_liger.runtime.graphs import runner_for

    for _ in range(2):
        graphed.zero_grad(set_to_none=True)
        loss_g = chunked_cross_entropy(graphed(x), y)
        loss_g.backward()
    runner = runner_for(graphed)
    assert runner.captures == 1 and runner.replays == 2 and runner.why_not(x) is None
    assert rel_err(loss_g, loss) <= 1e-5
    p_plain = dict(plain.named_parameters())
    for n, p in graphed.named_parameters():
        # bf16; the second model's calls may run the dynamic-shape FlexAttention kernel (a recompile)
        assert rel_err(p.grad, p_plain[n].grad) <= 2 * TOL[torch.bfloat16], n


# ------------------------------------------------------------------------------------------------
# lit-liger check on these families
# ------------------------------------------------------------------------------------------------
def test_check_refuses_a_window_for_a_model_without_one():
    from lit_liger.doctor import check

    with pytest.raises(ValueError, match="no sliding-window layers"):
        check(model="pythia-14m", n_layer=1, seq_len=8, batch_size=1, device="cpu", sliding_window_size=4)


@pytest.mark.gpu
@pytest.mark.parametrize("model, window", [("gemma-2-2b", 64)])
def test_gpu_check_covers_softcap_and_window_families(model, window, capsys):
    from lit_liger.doctor import check

    r = check(model=model, n_layer=2, seq_len=256, batch_size=2, device="cuda", sliding_window_size=window)
    assert r["ok"], r
    assert "flex attention (softcap 50.0, sliding window 64)" in capsys.readouterr().out  # fp32: FlexAttention
