"""Test set-up: without a CUDA GPU, kernels run on CPU tensors through Triton's interpreter.

TRITON_INTERPRET must be set before any kernel module is imported, hence here at collection time.

Without a GPU the whole suite (``python -m pytest -q``, no paths named) runs on two pytest-xdist workers: 1,201 s
against 1,936 s in one process on CI's 2-core machine (`.ci/run`, 2026-11-28). ``-n 0`` (or naming a file or test)
runs in this process.
Every test has a hard limit (``faulthandler_timeout`` in pyproject.toml; ``-o faulthandler_timeout=0``: none): a test
that hangs prints every thread's stack and ends its process, so CI fails at that test with where it stood instead of
running out its own time.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"

#: workers for the whole suite on a CPU-only machine (CI's has 2 cores)
CPU_WORKERS = 2


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The whole suite without a GPU: ``CPU_WORKERS`` pytest-xdist workers, unless ``-n`` was given, paths were
    named, or xdist is not installed (it comes with the ``test`` extra)."""
    if HAS_CUDA or hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    named = getattr(config, "args_source", None) == pytest.Config.ArgsSource.ARGS
    if config.option.numprocesses is None and not named and not config.getoption("usepdb", False):
        config.option.numprocesses = CPU_WORKERS
        if config.option.dist == "no":
            config.option.dist = "worksteal"  # each test to whichever worker is free (tests take 0.01-100 s)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: what this test session found in place of lit-liger's litgpt plugin file before writing it ([None]: nothing), to put
#: back at the end
_PLUGIN_BEFORE: list = []


def pytest_configure(config):
    """The ``litgpt`` console script takes ``--liger`` in the tests that run it (tests/test_litgpt_plugin.py,
    tests/test_config_hub.py): this checkout's plugin (``lit-liger litgpt_plugin install``) is written into this
    environment for the session if it is not there, by the controlling process only (not by pytest-xdist's workers),
    and what was there before is put back at the end (``pytest_unconfigure``)."""
    if hasattr(config, "workerinput"):
        return
    from lit_liger import litgpt_plugin

    if litgpt_plugin.status() != "installed":
        path = litgpt_plugin.site_file()
        _PLUGIN_BEFORE.append(path.read_text(encoding="utf-8") if path.is_file() else None)
        litgpt_plugin.install()


def pytest_unconfigure(config):
    if _PLUGIN_BEFORE and not hasattr(config, "workerinput"):
        from lit_liger import litgpt_plugin

        before = _PLUGIN_BEFORE.pop()
        if before is None:
            litgpt_plugin.remove()
        else:
            litgpt_plugin.site_file().write_text(before, encoding="utf-8")


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _capture_from_the_first_micro_batch(request, monkeypatch):
    """The CUDA-graph tests count captures and replays from a model's first micro-batch. ``graphs.EAGER_FIRST`` (on in
    a run: that micro-batch runs uncaptured, the next ones are captured without a warm-up pass) is off for them and
    tested on its own by the tests marked ``eager_first``."""
    if "eager_first" not in request.keywords:
        from lit_liger.runtime import graphs

        monkeypatch.setattr(graphs, "EAGER_FIRST", False)


@pytest.fixture
def terminated(monkeypatch):
    """The pids of the DataLoader workers PyTorch had to terminate (still alive after its 5 s join timeout) as it shut
    an iterator down, recorded through ``multiprocessing``'s ``Process.terminate`` for the test."""
    import multiprocessing.process

    out: list[int] = []
    terminate = multiprocessing.process.BaseProcess.terminate

    def recording(self):
        if self.is_alive():
            out.append(self.pid)
        terminate(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "terminate", recording)
    return out
