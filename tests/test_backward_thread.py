"""``LigerConfig.caller_thread_backward`` (off by default): the training thread runs autograd's backward (a
per-thread setting), set for a ``lit-liger`` training command's run and for the Trainer's fit by ``LigerCallback``,
and put back after."""

import sys
import threading
import types

import pytest
import torch

from lit_liger import LigerCallback, LigerConfig
from lit_liger.cli import with_liger


def multithreaded() -> bool:
    return torch._C._is_multithreading_enabled()


def test_setting_and_its_context():
    assert LigerConfig().caller_thread_backward is False
    assert "caller_thread_backward" not in LigerConfig.switches()
    with pytest.raises(TypeError, match="caller_thread_backward"):
        LigerConfig(caller_thread_backward="yes")
    on = LigerConfig(caller_thread_backward=True)
    assert multithreaded()
    with on.backward_thread():
        assert not multithreaded()
        seen = []
        t = threading.Thread(target=lambda: seen.append(multithreaded()))
        t.start()
        t.join()
        assert seen == [True]  # per thread: other threads keep PyTorch's default
    assert multithreaded()
    off_too = LigerConfig.off()
    off_too.caller_thread_backward = True  # lit-liger off: nothing changes
    for cfg in (LigerConfig(), off_too):
        with cfg.backward_thread():
            assert multithreaded()


@pytest.mark.gpu
def test_gpu_backward_on_the_caller_thread_gives_the_same_gradients():
    """On CUDA tensors (where the setting moves the backward off PyTorch's device thread; a CPU backward always runs
    on the caller's) the lit-liger ops' gradients are bit for bit those of the device-thread backward."""
    from lit_liger.kernels import rms_norm, swiglu

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(3, 50, 256, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(256, device="cuda", generator=g, requires_grad=True)
    b = torch.randn(3, 50, 256, device="cuda", generator=g, requires_grad=True)
    grads = []
    for cfg in (LigerConfig(), LigerConfig(caller_thread_backward=True)):
        with cfg.backward_thread():
            assert multithreaded() is (not cfg.caller_thread_backward)
            grads.append(torch.autograd.grad(swiglu(rms_norm(x, w), b).square().sum(), (x, w, b)))
    for a, c in zip(*grads):
        assert a.abs().sum() > 0 and torch.equal(a, c)


@pytest.fixture
def fake_script(monkeypatch):
    """A module shaped like a litgpt script (the names ``lit-liger`` patches) whose setup records the thread's
    setting."""
    import litgpt.utils
    from litgpt import GPT

    mod = types.ModuleType("fake_litgpt_script")
    mod.GPT, mod.chunked_cross_entropy = GPT, litgpt.utils.chunked_cross_entropy
    mod.save_hyperparameters = lambda *a, **k: None
    seen = []

    def setup(fail: bool = False) -> None:
        """A litgpt-like setup.

        Arguments:
            fail: raise inside the run.
        """
        seen.append(multithreaded())
        if fail:
            raise RuntimeError("run failed")

    setup.__module__ = mod.__name__
    mod.setup = setup
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return with_liger(setup), seen


def test_cli_run_sets_it_for_the_run_and_puts_it_back(fake_script):
    setup, seen = fake_script
    on = LigerConfig(caller_thread_backward=True)
    setup(liger=on)
    setup(liger=False)
    setup(liger=True)  # the default: PyTorch's device thread
    assert seen == [False, True, True]
    assert multithreaded()
    with pytest.raises(RuntimeError, match="run failed"):
        setup(fail=True, liger=on)
    assert multithreaded()  # put back on an error too


def test_callback_sets_it_from_train_start_to_train_end():
    cb = LigerCallback(LigerConfig(caller_thread_backward=True), log_metrics=False)
    cb.on_train_start(None, None)
    assert not multithreaded()
    cb.on_train_start(None, None)  # twice: one saved state, still restored to the original below
    cb.on_train_end(None, None)
    assert multithreaded()
    cb.teardown(None, None, "fit")  # after on_train_end: nothing left to restore
    assert multithreaded()
    cb.on_train_start(None, None)
    cb.teardown(None, None, "fit")  # fitting interrupted: teardown restores
    assert multithreaded()
    off = LigerCallback(log_metrics=False)
    off.on_train_start(None, None)
    assert multithreaded()
    off.on_train_end(None, None)
