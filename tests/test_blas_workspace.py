"""The ``lit-liger`` / ``litgpt --liger`` training commands' cuBLAS workspace per stream (``cli.CUBLAS_WORKSPACE``):
set while the command trains, only where CUDA graphs may capture and the user set none, put back after (CPU)."""

import os
import sys
import types

import pytest

from lit_liger import LigerConfig
from lit_liger.cli import CUBLAS_WORKSPACE, with_liger

KEY = "CUBLAS_WORKSPACE_CONFIG"


@pytest.fixture
def script(monkeypatch):
    """A module shaped like a litgpt script whose setup records the variable it sees."""
    import litgpt.utils
    from litgpt import GPT

    mod = types.ModuleType("fake_litgpt_script_ws")
    mod.GPT, mod.chunked_cross_entropy = GPT, litgpt.utils.chunked_cross_entropy
    mod.save_hyperparameters = lambda *a, **k: None
    seen = []

    def setup(fail: bool = False) -> None:
        """A litgpt-like setup.

        Arguments:
            fail: raise inside the run.
        """
        seen.append(os.environ.get(KEY))
        if fail:
            raise RuntimeError("run failed")

    setup.__module__ = mod.__name__
    mod.setup = setup
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delenv(KEY, raising=False)
    return with_liger(setup), seen


def test_set_while_training_with_graphs_and_put_back(script):
    setup, seen = script
    assert CUBLAS_WORKSPACE == ":4096:4"
    setup(liger=True)
    setup(liger=False)  # stock: nothing set
    setup(liger=LigerConfig(cuda_graphs=False))  # no captures: no second stream, nothing set
    assert seen == [CUBLAS_WORKSPACE, None, None]
    assert KEY not in os.environ
    with pytest.raises(RuntimeError, match="run failed"):
        setup(fail=True, liger=True)
    assert KEY not in os.environ  # put back on an error too


def test_the_users_own_setting_is_kept(script, monkeypatch):
    setup, seen = script
    monkeypatch.setenv(KEY, ":16:8")
    setup(liger=True)
    assert seen == [":16:8"] and os.environ[KEY] == ":16:8"


def test_off_with_the_second_stream_off(script, monkeypatch):
    from lit_liger.swap import lora

    setup, seen = script
    monkeypatch.setattr(lora, "OVERLAP_BRANCH", False)
    setup(liger=True)
    assert seen == [None]
