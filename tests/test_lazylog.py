"""lit_liger.runtime.lazylog: the device-side running mean against torchmetrics', and the deferred log's order and values."""

import math
import warnings

import pytest
import torch
from torchmetrics import RunningMean as TMRunningMean

from lit_liger.runtime import lazylog


@pytest.mark.parametrize("window", [1, 3, 4])
def test_running_mean_equals_torchmetrics_bit_for_bit(window):
    torch.manual_seed(0)
    log = lazylog.DeferredLog(print, lambda *a, **k: None)
    ours = lazylog.RunningMean(window, log).to("cpu")
    ref = TMRunningMean(window=window, sync_on_compute=False)
    values = (torch.rand(11) * 10).to(torch.bfloat16)
    values[5] = float("nan")
    for i, v in enumerate(values):
        with warnings.catch_warnings(record=True) as ref_warned:
            warnings.simplefilter("always")
            ref.update(v)
        ours.update(v)
        with warnings.catch_warnings(record=True) as our_warned:
            warnings.simplefilter("always")
            got = float(ours.compute().item())
        want = ref.compute().item()
        assert (math.isnan(got) and math.isnan(want)) or got == want, (i, got, want)
        if i == 5:  # torchmetrics warns at the update, ours when the value is read
            assert any("nan" in str(w.message) for w in ref_warned) and any("nan" in str(w.message) for w in our_warned)
        elif i > 5:
            assert not any("nan" in str(w.message) for w in our_warned)


def test_deferred_log_keeps_order_and_fills_values():
    printed, logged = [], []
    log = lazylog.DeferredLog(lambda *a, **k: printed.append(a[0]), lambda m, step=None: logged.append((step, m)))
    mean = lazylog.RunningMean(2, log).to("cpu")
    for it in range(3):
        mean.update(torch.tensor(float(it + 1)))
        loss = mean.compute().item()
        log.print(f"iter {it} loss {loss:.3f}")
        log.log_dict({"loss": loss, "iter": it}, step=it)
        if it == 0:
            assert printed == [] and logged == []  # kept until the next log
        if it == 1:
            log.print("validation")  # anything else emitted flushes what waits, in order
            assert printed == ["iter 0 loss 1.000", "iter 1 loss 1.500", "validation"]
    assert printed[-1] == "validation"  # iteration 2's line waits
    log.close()
    assert printed == ["iter 0 loss 1.000", "iter 1 loss 1.500", "validation", "iter 2 loss 2.500"]
    assert logged == [(0, {"loss": 1.0, "iter": 0}), (1, {"loss": 1.5, "iter": 1}), (2, {"loss": 2.5, "iter": 2})]
    assert all(type(m["loss"]) is float for _, m in logged)


@pytest.mark.parametrize("lag", [1, 3])
def test_deferred_log_waits_lag_logs_back_and_emits_up_to_there(monkeypatch, lag):
    """lazylog.LAG: a log's item() waits for the value LAG logs back (the host runs that many logs ahead of the GPU) and
    emits the lines kept before the next one; the rest, in order, at close."""
    monkeypatch.setattr(lazylog, "LAG", lag)
    waited = []
    real_wait = lazylog._Pending.wait
    monkeypatch.setattr(lazylog._Pending, "wait", lambda self: (waited.append(getattr(self, "number", None)),
                                                                 real_wait(self))[1])
    printed, logged = [], []
    log = lazylog.DeferredLog(lambda *a, **k: printed.append(a[0]), lambda m, step=None: logged.append((step, m)))
    mean = lazylog.RunningMean(1, log).to("cpu")
    want = []
    for it in range(7):
        mean.update(torch.tensor(float(it)))
        loss = mean.compute().item()
        log.log_dict({"throughput": 10.0 * it}, step=it)  # (litgpt's ThroughputMonitor, plain floats: kept in order)
        log.print(f"iter {it} loss {loss:.1f}")
        log.log_dict({"loss": loss}, step=it)
        want.append(f"iter {it} loss {float(it):.1f}")
        assert printed == want[:max(0, it + 1 - lag)], (it, printed)
        assert [s for s, m in logged if "loss" in m] == list(range(max(0, it + 1 - lag)))
        # every dict in the order logged (litgpt's throughput dict, plain floats, kept behind what waits)
        calls = [(i, k) for i in range(7) for k in ("throughput", "loss")]
        assert [(s, next(iter(m))) for s, m in logged] == calls[:len(logged)], (it, logged)
        # the values waited for: the logs' own (numbered 1, 2, ...), LAG behind this one (log it + 1)
        assert list(dict.fromkeys(n for n in waited if n is not None)) == list(range(1, max(0, it + 1 - lag) + 1))
    log.close()
    assert printed == want and [m["loss"] for _, m in logged if "loss" in m] == [float(i) for i in range(7)]
    assert [m["throughput"] for _, m in logged if "throughput" in m] == [10.0 * i for i in range(7)]


def test_factory_falls_back_to_torchmetrics_without_an_active_log():
    """The recipe's patched ``RunningMean``: torchmetrics' own outside a deferring ``fit``; inside, running means that
    feed that fit's log (held by the factory the recipe calls; another recipe's factory is not affected)."""
    make, other = lazylog.running_mean_factory(TMRunningMean), lazylog.running_mean_factory(TMRunningMean)
    assert isinstance(make(window=2, sync_on_compute=False), TMRunningMean)
    log = lazylog.DeferredLog(print, print)
    with make.deferring(log) as held:
        assert held is log and make.log is log
        mean = make(window=2, sync_on_compute=False)
        assert isinstance(mean, lazylog.RunningMean) and mean.log is log
        assert isinstance(make(window=2, nan_strategy="error"), TMRunningMean)  # not litgpt's arguments
        assert isinstance(other(window=2, sync_on_compute=False), TMRunningMean)
    assert make.log is None and isinstance(make(window=2, sync_on_compute=False), TMRunningMean)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_logged_tensors_keep_their_value_at_log_time(device):
    """litgpt adds to its token-count tensors in place after logging them: the deferred entry holds the logged value."""
    logged = []
    log = lazylog.DeferredLog(print, lambda m, step=None: logged.append(m))
    mean = lazylog.RunningMean(1, log).to(device)
    tokens = torch.tensor(5, device=device)
    mean.update(torch.tensor(2.0, device=device))
    log.log_dict({"loss": mean.compute().item(), "tokens": tokens})
    tokens += 100
    mean.update(torch.tensor(3.0, device=device))
    log.log_dict({"loss": mean.compute().item(), "tokens": tokens})
    tokens += 100
    log.close()
    assert [(m["loss"], int(m["tokens"])) for m in logged] == [(2.0, 5), (3.0, 105)]
    if device == "cuda":  # the GPU path: device running mean equal to torchmetrics' there too
        ref = TMRunningMean(window=3, sync_on_compute=False).to(device)
        ours = lazylog.RunningMean(3, log).to(device)
        for v in torch.rand(7, device=device):
            ref.update(v)
            ours.update(v)
            assert float(ours.compute().item()) == ref.compute().item()
        log.close()


def test_cli_deferred_log_restores_fabric_and_keeps_fit_errors(capsys, monkeypatch):
    """lit_liger.cli._deferred_log around litgpt's fit: the recipe's running means (the patched ``RunningMean`` of
    ``fit``'s module) feed the log meanwhile; Fabric's print / log_dict are its own again afterwards, what was kept is
    emitted, and an error inside fit is the one raised."""
    import sys
    import types

    from lit_liger.cli import _deferred_log

    recipe = types.ModuleType("lazylog_probe_recipe")  # (a litgpt recipe: fit reads RunningMean in its module)
    exec("def fit():\n    pass\n", recipe.__dict__)
    recipe.RunningMean = lazylog.running_mean_factory(TMRunningMean)
    monkeypatch.setitem(sys.modules, recipe.__name__, recipe)

    class Fabric:
        def __init__(self):
            self.logged = []

        def print(self, *a, **k):
            print(*a, **k)

        def log_dict(self, m, step=None):
            self.logged.append((step, dict(m)))

    fabric = Fabric()
    with pytest.raises(ValueError, match="in fit"):
        with _deferred_log(fabric, rank0=True, fit=recipe.fit):
            assert recipe.RunningMean.log is not None and "print" in fabric.__dict__
            mean = recipe.RunningMean(window=1, sync_on_compute=False).to("cpu")
            assert isinstance(mean, lazylog.RunningMean)
            mean.update(torch.tensor(4.0))
            loss = mean.compute().item()
            fabric.print(f"loss {loss:.2f}")
            fabric.log_dict({"loss": loss}, step=1)
            raise ValueError("in fit")
    assert recipe.RunningMean.log is None and "print" not in fabric.__dict__ and "log_dict" not in fabric.__dict__
    assert "loss 4.00" in capsys.readouterr().out and fabric.logged == [(1, {"loss": 4.0})]


# ----------------------------------------------------------------------------------------------
# lit_liger.runtime.hostgc: Python's garbage collector during litgpt's loop
# ----------------------------------------------------------------------------------------------
def test_quiet_freezes_for_the_loop_and_times_each_collection():
    import gc

    from lit_liger.runtime import hostgc

    assert gc.get_freeze_count() == 0
    with hostgc.quiet() as watch:
        assert watch.frozen > 0 and gc.get_freeze_count() > 0
        garbage = [[] for _ in range(10)]
        for a, b in zip(garbage, garbage[1:] + garbage[:1]):
            a.append(b)  # (a reference cycle: only the collector frees it)
        del garbage, a, b
        assert gc.collect() >= 10  # (the cycle, created after the freeze, is collected)
        assert watch in gc.callbacks
    assert gc.get_freeze_count() == 0 and watch not in gc.callbacks
    assert len(watch.pauses[2]) >= 1 and all(p >= 0 for p in watch.pauses[2])
    line = hostgc.report(watch)
    assert line.startswith("lit-liger: Python's garbage collector in the training loop: ") and "gc.freeze" in line
    assert hostgc.report(hostgc.GcWatch()) is None
    assert hostgc.report(watch, 0.4149).endswith("gc.freeze); the longest full collection of any process 414.9 ms)")


def test_quiet_unfreezes_after_an_error():
    import gc

    from lit_liger.runtime import hostgc

    try:
        with hostgc.quiet():
            raise RuntimeError("the loop failed")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0
