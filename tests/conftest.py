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


def _patch_the_language_once_per_launch() -> None:
    """Triton's interpreter patches ``triton.language`` for a kernel's launch (``_patch_lang``: the language modules
    the kernel's globals hold, undone when the launch ends) and again at every call of a ``@triton.jit`` helper inside
    it. There, for modules the launch (or an earlier helper of it) has patched already, it walks them with
    ``inspect.getmembers`` and finds nothing left to patch (patched members are no longer builtins): ~18% of a
    profiled interpreter test (test_buckets' Qwen3 LoRA case, 9,254 helper calls in 25 launches). Here a helper's
    call inside a launch patches only where its globals hold a language module not patched yet in this launch
    (``triton.language.standard``'s helpers hold ``core``, which lit-liger's kernels, seeing ``tl`` only, do not),
    as Triton does it; otherwise it skips the walk. Left as it is where the interpreter has no such function."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    real, scope_type = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if real is None or scope_type is None or getattr(real, "_lit_liger_once", False):
        return
    langs = (tl, getattr(tl, "core", tl))
    done: list[set] = []  # (the language modules patched in the launch running now: one set while one runs)

    def patch_lang(fn):
        held = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs}
        if done:
            if held <= done[0]:
                return scope_type()  # (a helper inside a launch: nothing left to patch)
            done[0] |= held
            return real(fn)  # (Triton's own call; its changes are not undone, as there)
        scope = real(fn)
        done.append(held)
        restore = scope.restore

        def restore_and_leave() -> None:
            done.clear()
            restore()

        scope.restore = restore_and_leave
        return scope

    patch_lang._lit_liger_once = True
    interpreter._patch_lang = patch_lang

    # the numpy dtype of a Triton type, which the interpreter rebuilds a 20-entry table for at each of its ~140k calls
    # in that test (~5% of it): remembered per element type (a block's is its element's, as there)
    np_dtype, memo, block = getattr(interpreter, "_get_np_dtype", None), {}, getattr(tl, "block_type", ())
    if np_dtype is not None:
        def remembered(tt_dtype):
            key = tt_dtype.element_ty if isinstance(tt_dtype, block) else tt_dtype
            try:
                return memo[key]
            except KeyError:
                out = memo[key] = np_dtype(key)
                return out
            except TypeError:  # (an unhashable type)
                return np_dtype(tt_dtype)

        interpreter._get_np_dtype = remembered


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_the_language_once_per_launch()

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
