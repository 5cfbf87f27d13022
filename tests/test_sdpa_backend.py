"""``LigerConfig.sdpa_backend``: the measured choice per device and capture, the flags it sets and restores."""

import pytest
import torch

from lit_liger import LigerConfig
from lit_liger.swap import attend as A
from lit_liger.runtime.graphs import _captured_attention


def _flags():
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())


def test_config_accepts_the_backends_and_rejects_others():
    assert LigerConfig().sdpa_backend == "auto"
    for name in ("auto", *A.SDPA_BACKENDS):
        assert LigerConfig(sdpa_backend=name).sdpa_backend == name
    with pytest.raises(ValueError, match="sdpa_backend must be one of 'auto', 'flash'"):
        LigerConfig(sdpa_backend="fast")
    assert "sdpa_backend" not in LigerConfig.switches()
    # the settings with fixed values come from their Literal types (the CLI's messages read the same table)
    choices = LigerConfig.choices()
    assert choices.keys() == {"flce_mode", "sdpa_backend", "fp8", "data_parallel"} and choices["flce_mode"] == ("fast", "lean")
    assert set(choices["sdpa_backend"]) == {"auto", *A.SDPA_BACKENDS}
    with pytest.raises(ValueError, match="flce_mode must be one of 'fast', 'lean', got 'fastest'"):
        LigerConfig(flce_mode="fastest")


def test_auto_is_flash_uncaptured_on_nvidia_sm80_and_torch_when_captured(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert A.sdpa_backend_for("auto", cuda) == "flash"
    assert A.sdpa_backend_for("auto", cuda, captured=True) == "torch"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))
    assert A.sdpa_backend_for("auto", cuda) == "torch"  # no flash attention before sm80
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 4))
    assert A.sdpa_backend_for("auto", cuda) == "torch"  # ROCm: not measured, PyTorch's choice
    assert A.sdpa_backend_for("auto", torch.device("cpu")) == "torch"
    for name in A.SDPA_BACKENDS:
        assert A.sdpa_backend_for(name, cuda) == A.sdpa_backend_for(name, cuda, captured=True) == name


def test_flags_set_inside_and_restored_after_even_on_error():
    before = _flags()
    for name, flags in A.SDPA_BACKENDS.items():
        with A.sdpa_flags(flags):
            assert _flags() == (before if flags is None else flags), name
        assert _flags() == before
    with pytest.raises(RuntimeError):
        with A.sdpa_flags(A.SDPA_BACKENDS["math"]):
            raise RuntimeError("boom")
    assert _flags() == before
    # every setting keeps a fallback that can take any call (math)
    assert all(f is None or f[2] for f in A.SDPA_BACKENDS.values())
    assert A.SDPA_BACKENDS["flash"][3] is False and A.SDPA_BACKENDS["flash"][0] is True  # cuDNN off, flash on


def test_capture_marks_the_attention_choice():
    """A capture marks its own model's attention modules (another swapped model's stay as they were), and only while
    it runs, an error included."""
    from litgpt import GPT, Config

    from lit_liger import apply_liger

    cfg = Config.from_name("Llama-3.2-1B", n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16,
                           intermediate_size=128, padded_vocab_size=128, vocab_size=128, block_size=32)
    a, b = GPT(cfg), GPT(cfg)
    apply_liger(a), apply_liger(b)
    attn = [blk.attn for blk in a.transformer.h]
    other = [blk.attn for blk in b.transformer.h]
    assert attn and not any("_liger_capturing" in m.__dict__ for m in attn + other)
    with _captured_attention(a):
        assert all(m.__dict__.get("_liger_capturing") is True for m in attn)
        assert not any("_liger_capturing" in m.__dict__ for m in other)
    assert not any("_liger_capturing" in m.__dict__ for m in attn)
    with pytest.raises(ValueError):
        with _captured_attention(a):
            raise ValueError
    assert not any("_liger_capturing" in m.__dict__ for m in attn)


def test_adapter_reads_the_setting_and_leaves_cpu_alone():
    from litgpt import GPT, Config

    from lit_liger import apply_liger

    cfg = Config.from_name("Llama-3.2-1B", n_layer=1, n_embd=64, n_head=4, n_query_groups=2, head_size=16,
                           intermediate_size=128, padded_vocab_size=128, vocab_size=128, block_size=32)
    m = GPT(cfg)
    rep = apply_liger(m, LigerConfig(sdpa_backend="efficient"))
    attn = m.transformer.h[0].attn
    assert attn._liger_sdpa == "efficient"
    assert any("SDPA backend 'efficient'" in why for _, _, why in rep.swapped)
    assert attn._liger_sdpa_flags(torch.zeros(1, 4, 2, 16)) is None  # CPU tensors: PyTorch's flags untouched


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["auto", "flash", "cudnn", "efficient", "math", "torch"])
def test_gpu_each_backend_gives_litgpt_attention(backend):
    import copy

    from litgpt import GPT, Config

    from helpers import rel_err

    from lit_liger import apply_liger

    torch.manual_seed(0)
    cfg = Config.from_name("Llama-3.2-1B", n_layer=2, block_size=320, padded_vocab_size=512, vocab_size=512)
    with torch.device("cuda"):
        stock = GPT(cfg).to(torch.bfloat16)
    ours = copy.deepcopy(stock)
    apply_liger(ours, {"sdpa_backend": backend, "fused_linear_cross_entropy": False})
    x = torch.randint(0, 512, (2, 300), device="cuda")
    ys, yo = stock(x), ours(x)
    ys.float().logsumexp(-1).mean().backward()
    yo.float().logsumexp(-1).mean().backward()
    assert rel_err(yo, ys) < 1e-2
    for (n, ps), (_, po) in zip(stock.named_parameters(), ours.named_parameters()):
        assert rel_err(po.grad, ps.grad) < 2e-2, n  # bf16 gradients: the bound of the graph tests
