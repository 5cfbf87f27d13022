"""Generation's one-token KV-cache steps replayed from one CUDA graph (``lit_liger.runtime.decode``): litgpt's logits and
tokens, the graph's life with the KV cache, and litgpt's forward wherever the graph does not apply."""

from __future__ import annotations

import pytest
import torch
from litgpt.generate.base import generate
from test_adapter import _pair, tiny_config

from lit_liger import LigerConfig, apply_liger

from lit_liger.runtime import decode
from lit_liger.swap.state import state_of


def _models(name: str = "Llama-3.2-1B", device: str = "cpu", dtype=torch.float32, block_size: int = 64, **cfg):
    ref, ours = _pair(tiny_config(name, block_size=block_size))
    ref, ours = ref.to(device, dtype), ours.to(device, dtype)
    report = apply_liger(ours, LigerConfig(**cfg))
    for m in (ref, ours):
        m.eval()
        with torch.device(device):
            m.set_kv_cache(batch_size=1)
    return ref, ours, report


def test_the_kv_cache_calls_drop_the_graph_and_keep_a_failed_capture_off():
    _, ours, _ = _models()
    placeholder = object.__new__(decode._Graphs)
    vars(ours)[decode._ATTR] = placeholder
    ours.set_kv_cache(batch_size=1)
    assert decode._ATTR not in vars(ours)
    vars(ours)[decode._ATTR] = placeholder
    ours.clear_kv_cache()
    assert decode._ATTR not in vars(ours) and ours.mask_cache is None
    vars(ours)[decode._ATTR] = decode._OFF  # (a capture failed for this model: it stays uncaptured)
    ours.set_kv_cache(batch_size=1)
    assert vars(ours)[decode._ATTR] is decode._OFF


def test_cpu_generation_is_litgpts_and_captures_nothing():
    ref, ours, report = _models()
    assert "KV-cache steps replayed from CUDA graphs" in str(report)
    prompt = torch.randint(0, 150, (5,))
    before = dict(state_of(ours).decode)
    a = generate(ref, prompt, max_returned_tokens=14, temperature=0.0)
    b = generate(ours, prompt, max_returned_tokens=14, temperature=0.0)
    assert torch.equal(a, b) and state_of(ours).decode == before
    x, pos = torch.tensor([[3]]), torch.tensor([5])
    with torch.no_grad():
        assert decode._why_not(ours, x, pos, 0) == "not a one-token CUDA step"


def test_key_length_rounds_the_filled_length_up_to_a_power_of_two_below_the_cache():
    k = decode.key_length
    assert decode.MIN_KEYS == 256
    assert [k(n, 4096) for n in (1, 61, 256, 257, 512, 513, 2048, 2049)] == [256, 256, 256, 512, 512, 1024, 2048, None]
    assert k(100, 256) is None and k(100, 257) == 256  # (no shorter than the cache: the whole cache)
    assert k(70_000, 131_072) is None and k(65_536, 131_072) == 65_536
    # litgpt gives no int (Thunder: None; a tensor would need the host to read it): the whole cache
    assert k(None, 4096) is None and k(torch.tensor(5), 4096) is None and k(True, 4096) is None and k(0, 4096) is None


def test_watched_tensors_leave_the_model_collectable_by_reference_counting():
    """The graphs watch every parameter and buffer by address, ``gpt``'s own attributes (the mask) by name only: the
    watch list holds no reference to ``gpt``'s ``__dict__``, which holds the graphs (a cycle would keep a dropped
    model's caches until Python's next collection)."""
    _, ours, _ = _models()
    watched = decode._watched(ours)
    assert all(d is not vars(ours) for d, _, _ in watched)
    assert (None, "mask_cache", ours.mask_cache.data_ptr()) in watched
    n = sum(1 for m in ours.modules() for d in (m._parameters, m._buffers) for t in d.values() if t is not None)
    assert len(watched) == n + 1
    state = object.__new__(decode._Graphs)
    state.watched = watched
    assert state.current(ours)
    ours.mask_cache = ours.mask_cache.clone()  # (a new mask: the graphs would read the old one)
    assert not state.current(ours)


def test_cuda_graphs_false_leaves_generation_uncaptured():
    _, ours, report = _models(cuda_graphs=False)
    assert "KV-cache steps replayed" not in str(report)
    assert decode._why_not(ours, torch.tensor([[3]]), torch.tensor([5]), 0) == "off"


# ---------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "Qwen3-0.6B"])
def test_gpu_replayed_steps_give_litgpts_logits_and_tokens(name):
    ref, ours, _ = _models(name, "cuda")
    prompt = torch.randint(0, 150, (6,), device="cuda")
    before = dict(state_of(ours).decode)
    a = generate(ref, prompt, max_returned_tokens=30, temperature=0.0)  # (fp32: greedy tokens, litgpt's own)
    b = generate(ours, prompt, max_returned_tokens=30, temperature=0.0)
    assert torch.equal(a, b)
    assert state_of(ours).decode["captures"] - before["captures"] == 1
    assert state_of(ours).decode["replays"] - before["replays"] == 30 - 6 - 1  # (every step after the prompt's)
    # logits, step by step, against litgpt's forward with and without input_pos_maxp1 on the same cache
    for m in (ref, ours):
        m.set_kv_cache(batch_size=1, device="cuda")
    with torch.inference_mode():
        n = len(prompt)
        for m in (ref, ours):
            m(prompt.view(1, -1), torch.arange(n, device="cuda"), input_pos_maxp1=n)
        replays = state_of(ours).decode["replays"]
        for i, tok in enumerate([7, 99, 3, 42]):
            x, pos = torch.tensor([[tok]], device="cuda"), torch.tensor([n + i], device="cuda")
            got = ours(x, pos, input_pos_maxp1=n + i + 1)
            full = ref(x, pos)  # (litgpt's forward over the whole cache, as captured)
            short = ref(x, pos, input_pos_maxp1=n + i + 1)
            torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got, short, rtol=1e-5, atol=1e-5)
        assert state_of(ours).decode["replays"] - replays == 4  # (each of ours came from the graph, not litgpt's forward)
    assert isinstance(vars(ours)[decode._ATTR], decode._Graphs)
    ours.clear_kv_cache()
    assert decode._ATTR not in vars(ours)


@pytest.mark.gpu
def test_gpu_generation_across_key_lengths_gives_litgpts_tokens_and_logits():
    ref, ours, _ = _models("Llama-3.2-1B", "cuda", block_size=2048)
    prompt = torch.randint(0, 150, (200,), device="cuda")
    before = dict(state_of(ours).decode)
    a = generate(ref, prompt, max_returned_tokens=600, temperature=0.0)  # (keys 256, 512, 1024: three graphs)
    b = generate(ours, prompt, max_returned_tokens=600, temperature=0.0)
    assert torch.equal(a, b)
    assert state_of(ours).decode["captures"] - before["captures"] == 3
    assert state_of(ours).decode["replays"] - before["replays"] == 600 - 200 - 1
    assert sorted(k[-1] for k in vars(ours)[decode._ATTR].by_key) == [256, 512, 1024]
    # step by step across a boundary: each replayed logit equals litgpt's forward over the filled part
    for m in (ref, ours):
        m.set_kv_cache(batch_size=1, device="cuda")
    with torch.inference_mode():
        n = 254
        x0 = torch.randint(0, 150, (1, n), device="cuda")
        for m in (ref, ours):
            m(x0, torch.arange(n, device="cuda"), input_pos_maxp1=n)
        replays = state_of(ours).decode["replays"]
        for i, tok in enumerate([7, 99, 3, 42]):  # (positions 254-257: keys 256, 256, 256, 512)
            x, pos = torch.tensor([[tok]], device="cuda"), torch.tensor([n + i], device="cuda")
            got = ours(x, pos, input_pos_maxp1=n + i + 1)
            want = ref(x, pos, input_pos_maxp1=n + i + 1)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert state_of(ours).decode["replays"] - replays == 4


@pytest.mark.gpu
def test_gpu_bf16_logits_within_rounding_of_litgpts():
    ref, ours, _ = _models("Llama-3.2-1B", "cuda", torch.bfloat16)
    prompt = torch.randint(0, 150, (6,), device="cuda")
    with torch.inference_mode():
        for m in (ref, ours):
            m(prompt.view(1, -1), torch.arange(6, device="cuda"), input_pos_maxp1=6)
        for i in range(3):
            x, pos = torch.tensor([[11 + i]], device="cuda"), torch.tensor([6 + i], device="cuda")
            got, want = ours(x, pos, input_pos_maxp1=7 + i), ref(x, pos, input_pos_maxp1=7 + i)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()


@pytest.mark.gpu
def test_gpu_graph_recaptured_when_what_it_reads_moves_and_not_kept_in_training():
    _, ours, _ = _models("Llama-3.2-1B", "cuda")
    prompt = torch.randint(0, 150, (4,), device="cuda")
    before = state_of(ours).decode["captures"]
    generate(ours, prompt, max_returned_tokens=10, temperature=0.0)
    generate(ours, prompt, max_returned_tokens=10, temperature=0.0)  # (same cache: the same graph)
    assert state_of(ours).decode["captures"] - before == 1
    w = ours.transformer.h[0].attn.qkv.weight if hasattr(ours.transformer.h[0].attn, "qkv") else next(ours.parameters())
    w.data = w.data.clone()  # (a parameter at another address: the graph would read the old one)
    generate(ours, prompt, max_returned_tokens=10, temperature=0.0)
    assert state_of(ours).decode["captures"] - before == 2
    ours.set_kv_cache(batch_size=1, device="cuda")  # (a new cache: a new graph)
    generate(ours, prompt, max_returned_tokens=10, temperature=0.0)
    assert state_of(ours).decode["captures"] - before == 3
    with torch.no_grad():  # (not inference mode, as litgpt's generate is: a graph of its own, no error)
        x, pos = prompt[:1].view(1, 1), torch.tensor([9], device="cuda")
        ours(x, pos)
    assert state_of(ours).decode["captures"] - before == 4
    ours.train()
    with torch.no_grad():
        assert decode._why_not(ours, prompt[:1].view(1, 1), prompt[:1], 0) is not None
    ours.eval()
    ours.transformer.h[1].attn.kv_cache.is_sliding_window = True  # (its cache reads its length back: uncapturable)
    with torch.no_grad():
        assert "sliding-window" in decode._why_not(ours, prompt[:1].view(1, 1), prompt[:1], 0)


@pytest.mark.gpu
def test_gpu_capture_failure_warns_once_and_runs_litgpts_forward(monkeypatch):
    ref, ours, _ = _models("Llama-3.2-1B", "cuda")

    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("no graphs here")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Broken)
    prompt = torch.randint(0, 150, (5,), device="cuda")
    a = generate(ref, prompt, max_returned_tokens=12, temperature=0.0)
    with pytest.warns(UserWarning, match="could not be captured"):
        b = generate(ours, prompt, max_returned_tokens=12, temperature=0.0)
    assert torch.equal(a, b) and vars(ours)[decode._ATTR] is decode._OFF
    ours.set_kv_cache(batch_size=1, device="cuda")
    assert vars(ours)[decode._ATTR] is decode._OFF

