"""Where a real training run's iterations go, per process: ``LIT_LIGER_PROFILE=DIR[,FIRST[,COUNT[,host]]]``.

Set in the environment of a ``lit-liger`` training command (every rank inherits it), it profiles the training
iterations ``FIRST`` .. ``FIRST + COUNT - 1`` (counted by the model's training forwards; default 200 and 20) with
``torch.profiler`` on each process, and writes ``DIR/rank{R}-trace.json`` (the Chrome trace) and
``DIR/rank{R}-summary.json``, and prints one line per rank:

* ``wall_ms``: the window on the host, the device synchronized at both ends;
* per CUDA stream, the time some kernel ran (``busy_ms``), kernel time by category (collectives, matrix
  multiplies, the optimizer, the rest) and the :data:`TOP_KERNELS` kernels that took the most time, by name (a
  category is a guess from names: "optimizer" also counts every other ``multi_tensor_apply`` / ``foreach`` kernel,
  such as the zeroing of the gradients);
* the compute stream's idle time (the window less its busy time) and the collectives' time that no compute kernel
  ran beside (``exposed_collective_ms``);
* the compute stream's gaps between kernels by length (``gaps``: count and total ms under 5 µs, 5-50 µs and over
  50 µs; the first are a CUDA graph's launches one after another, the last the host or a copy holding the device)
  and the :data:`LONGEST_GAPS` longest, each with the kernels before and after it (``longest_gaps``);
* launches per kernel name for the same top kernels (``top_kernels_launches``);
* the host's CUDA calls by name (``host_calls``: count and total ms, the longest in total first), and the CUDA graph
  launches' host time (``graph_launches``: count, total, median and longest ms, and the GPU's wait from a launch's
  call to its graph's first kernel): a launch whose first kernel starts when the call returns found the GPU idle.

With ``host`` as the fourth field the window also runs Python's ``cProfile`` on the training thread, writes
``DIR/rank{R}-host.pstats`` and adds ``host_top``: the :data:`HOST_TOP` functions with the most time of their own
and ``host_cumulative``: those with the most time including their callees, in ms per iteration (cProfile slows the
Python it watches: read the shares, not the wall).

It changes nothing else in the run (the profiler's own overhead aside: compare tok/s with a run without it). That
overhead is large for CUDA graphs: with kernels traced, each node of a graph costs the host ~2 µs at launch (gemma2-2b's
recipe on an H200: 1.2-5.6 ms a launch profiled, 24-42 µs not; benchmarks/results/h200-2026-12-03f), so a profiled
graph run is bound by the host where the unprofiled one is not: read the kernels' times, not the idle time.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["ENV", "Window", "host_profile", "host_tables", "iterations", "summarize_trace", "window", "window_from_env"]

ENV = "LIT_LIGER_PROFILE"
#: kernel-name substrings (lower case) -> category, the first match wins
CATEGORIES = (("collective", ("nccl",)),
              ("optimizer", ("adam", "multi_tensor", "foreach", "sgd")),
              ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "sm90_", "sm80_", "cublas", "matmul")),
              ("attention", ("flash", "fmha", "attention", "attn")))


def window(env: dict | None = None) -> tuple[Path, int, int] | None:
    """``(directory, first iteration, count)`` from :data:`ENV`, or None when it is unset or empty."""
    value = (os.environ if env is None else env).get(ENV, "").strip()
    if not value:
        return None
    parts = value.split(",")
    try:
        first = int(parts[1]) if len(parts) > 1 and parts[1].strip() else 200
        count = int(parts[2]) if len(parts) > 2 and parts[2].strip() else 20
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: expected DIR[,FIRST[,COUNT]] with whole numbers") from None
    if first < 0 or count < 1:
        raise ValueError(f"{ENV}={value!r}: FIRST must be >= 0 and COUNT >= 1")
    if len(parts) > 3 and parts[3].strip() not in ("", "host") or len(parts) > 4:
        raise ValueError(f"{ENV}={value!r}: expected DIR[,FIRST[,COUNT[,host]]]")
    return Path(parts[0]), first, count


def host_profile(env: dict | None = None) -> bool:
    """Whether :data:`ENV` asks for the host's Python profile too (its fourth field is ``host``)."""
    value = (os.environ if env is None else env).get(ENV, "")
    parts = value.split(",")
    return len(parts) > 3 and parts[3].strip() == "host"


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Length of the union ``xs`` outside the union ``ys`` (both sorted, disjoint)."""
    total, j = 0.0, 0
    for a, b in xs:
        covered = 0.0
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            covered += min(b, ys[k][1]) - max(a, ys[k][0])
            k += 1
        total += (b - a) - covered
    return total


#: kernels named per stream in a summary (``top_kernels_ms``), the longest in total first
TOP_KERNELS = 30
#: the longest gaps of the compute stream listed in a summary
LONGEST_GAPS = 8
#: host functions listed by cProfile time in a summary (``host_top``, ``host_cumulative``)
HOST_TOP = 40
#: host CUDA calls named in a summary (``host_calls``), the longest in total first
HOST_CALLS = 12
#: the gap buckets' upper ends in ms (the last bucket is open)
GAP_BUCKETS = ((0.005, "under_5us"), (0.05, "5_to_50us"), (float("inf"), "over_50us"))


def _gaps(kernels: list[tuple[float, float, str]]) -> tuple[dict[str, list], list[list]]:
    """The gaps between one stream's kernels ``(start, end, name)`` (ms): per bucket of :data:`GAP_BUCKETS`
    ``[count, ms]``, and the :data:`LONGEST_GAPS` longest as ``[ms, kernel before, kernel after]``."""
    buckets = {name: [0, 0.0] for _, name in GAP_BUCKETS}
    gaps = []
    end, before = None, None
    for a, b, name in sorted(kernels):
        if end is not None and a > end:
            gap = a - end
            label = next(n for top, n in GAP_BUCKETS if gap < top)
            buckets[label][0] += 1
            buckets[label][1] += gap
            gaps.append((gap, before, name))
        if end is None or b >= end:
            end, before = b, name
    longest = [[round(g, 4), x[:80], y[:80]] for g, x, y in sorted(gaps, key=lambda t: -t[0])[:LONGEST_GAPS]]
    return {k: [c, round(ms, 3)] for k, (c, ms) in buckets.items()}, longest


def summarize_trace(events: list[dict], wall_ms: float, iterations: int) -> dict[str, Any]:
    """The summary of a Chrome trace's kernel events (``cat`` ``kernel``, microsecond ``ts``/``dur``,
    ``args.stream``) over a window of ``wall_ms`` and ``iterations``: see the module's docstring."""
    streams: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("cat") != "kernel" or "dur" not in e:
            continue
        s = str((e.get("args") or {}).get("stream", e.get("tid")))
        st = streams.setdefault(s, {"intervals": [], "collective": [], "by_category": {}, "by_name": {}, "kernels": 0,
                                    "launches": {}, "named": []})
        a, b = float(e["ts"]) / 1e3, (float(e["ts"]) + float(e["dur"])) / 1e3
        name = str(e.get("name", ""))
        cat = category(name)
        st["by_category"][cat] = st["by_category"].get(cat, 0.0) + (b - a)
        key = f"{cat}: {name[:120]}"
        st["by_name"][key] = st["by_name"].get(key, 0.0) + (b - a)
        st["launches"][key] = st["launches"].get(key, 0) + 1
        st["named"].append((a, b, name))
        st["kernels"] += 1
        (st["collective"] if cat == "collective" else st["intervals"]).append((a, b))
    out_streams = {}
    for s, st in streams.items():
        busy = _union(st["intervals"] + st["collective"])
        top = sorted(st["by_name"].items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
        out_streams[s] = {"busy_ms": round(_length(busy), 3), "kernels": st["kernels"],
                          "by_category_ms": {k: round(v, 3) for k, v in sorted(st["by_category"].items(),
                                                                                key=lambda kv: -kv[1])},
                          "top_kernels_ms": {k: round(v, 3) for k, v in top},
                          "top_kernels_launches": {k: st["launches"][k] for k, _ in top}}
    compute = max(streams, key=lambda s: _length(_union(streams[s]["intervals"])), default=None)
    result: dict[str, Any] = {"wall_ms": round(wall_ms, 3), "iterations": iterations,
                              "wall_ms_per_iteration": round(wall_ms / max(iterations, 1), 3), "streams": out_streams}
    if compute is not None:
        work = _union([iv for st in streams.values() for iv in st["intervals"]])
        comm = _union([iv for st in streams.values() for iv in st["collective"]])
        busy = _length(_union(streams[compute]["intervals"]))
        result.update({"compute_stream": compute, "compute_busy_ms": round(busy, 3),
                       "compute_idle_ms": round(max(wall_ms - busy, 0.0), 3),
                       "collective_ms": round(_length(comm), 3),
                       "exposed_collective_ms": round(_minus(comm, work), 3)})
        result["gaps"], result["longest_gaps"] = _gaps(streams[compute]["named"])
    result.update(_host_calls(events, iterations))
    return result


def _host_calls(events: list[dict], iterations: int) -> dict[str, Any]:
    """The host's CUDA runtime / driver calls by name, and the graph launches' host time and the GPU's wait for each
    launched graph's first kernel (both ms; see the module's docstring)."""
    calls: dict[str, list] = {}
    launches: dict[Any, float] = {}  # correlation id -> the launch call's start (ms)
    durations = []
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or "dur" not in e:
            continue
        name = str(e.get("name", ""))
        c = calls.setdefault(name, [0, 0.0])
        c[0] += 1
        c[1] += float(e["dur"]) / 1e3
        if name == "cudaGraphLaunch":
            durations.append(float(e["dur"]) / 1e3)
            launches[(e.get("args") or {}).get("correlation")] = float(e["ts"]) / 1e3
    first: dict[Any, float] = {}
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") == "kernel" and corr in launches:
            first[corr] = min(first.get(corr, float("inf")), float(e["ts"]) / 1e3)
    if not calls:
        return {}
    top = sorted(calls.items(), key=lambda kv: -kv[1][1])[:HOST_CALLS]
    out: dict[str, Any] = {"host_calls": {k: [n, round(ms, 3)] for k, (n, ms) in top}}
    if durations:
        waits = sorted(first[c] - t for c, t in launches.items() if c in first)
        durations.sort()
        out["graph_launches"] = {
            "count": len(durations), "host_ms": round(sum(durations), 3),
            "host_ms_per_iteration": round(sum(durations) / max(iterations, 1), 3),
            "median_ms": round(durations[len(durations) // 2], 3), "max_ms": round(durations[-1], 3),
            "first_kernel_after_call_median_ms": round(waits[len(waits) // 2], 3) if waits else None}
    return out


def host_tables(stats: Any, iterations: int) -> dict[str, list]:
    """``host_top`` and ``host_cumulative`` of a ``pstats.Stats``: ``[function, calls, ms per iteration]``."""
    rows = []
    for (file, line, func), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():
        where = f"{Path(file).name}:{line}({func})" if line else func
        rows.append((where, calls, tottime, cumtime))
    n = max(iterations, 1)
    own = sorted(rows, key=lambda r: -r[2])[:HOST_TOP]
    cum = sorted(rows, key=lambda r: -r[3])[:HOST_TOP]
    return {"host_top": [[w, c, round(t * 1e3 / n, 3)] for w, c, t, _ in own],
            "host_cumulative": [[w, c, round(t * 1e3 / n, 3)] for w, c, _, t in cum]}


class Window:
    """The profile window of :func:`window` over iterations counted by :meth:`tick` (one call before each training
    iteration); :meth:`close` ends it early (the loop ended inside it: what ran is summarized)."""

    def __init__(self, directory: Path, first: int, count: int, rank: int = 0, host: bool = False) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.first, self.count, self.rank = directory, first, count, rank
        self.cuda = torch.cuda.is_available()
        self.seen, self.prof, self.t0, self.done = 0, None, 0.0, False
        self.host = host
        self.python: Any = None  # the cProfile.Profile of the window (host)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def tick(self) -> None:
        if self.done:
            return
        if self.seen == self.first + self.count:
            self.close()
        elif self.seen == self.first:
            from torch.profiler import ProfilerActivity, profile

            self._sync()
            # (kernels only on CUDA: the summary reads nothing else, and tracing every host op slowed a host-bound
            # 8B step by half; a CPU run traces its ops, for a trace at all)
            self.prof = profile(activities=[ProfilerActivity.CUDA] if self.cuda else [ProfilerActivity.CPU])
            self.prof.__enter__()
            if self.host:
                import cProfile

                self.python = cProfile.Profile()
                self.python.enable()
            self.t0 = time.perf_counter()
        self.seen += 1

    def close(self) -> None:
        prof = self.prof
        if prof is None:
            return
        self._sync()
        wall = (time.perf_counter() - self.t0) * 1e3
        if self.python is not None:
            self.python.disable()
        prof.__exit__(None, None, None)
        self.prof, self.done = None, True
        trace = self.directory / f"rank{self.rank}-trace.json"
        prof.export_chrome_trace(str(trace))
        with open(trace) as f:
            events = json.load(f).get("traceEvents", [])
        summary = summarize_trace(events, wall, self.seen - self.first)
        summary.update({"rank": self.rank, "first_iteration": self.first})
        if self.python is not None:
            import pstats

            stats_path = self.directory / f"rank{self.rank}-host.pstats"
            self.python.dump_stats(str(stats_path))
            summary.update(host_tables(pstats.Stats(str(stats_path)), self.seen - self.first))
            self.python = None
        (self.directory / f"rank{self.rank}-summary.json").write_text(json.dumps(summary, indent=1))
        keys = ("wall_ms_per_iteration", "compute_busy_ms", "compute_idle_ms", "collective_ms",
                "exposed_collective_ms")
        print(f"lit-liger: profile rank {self.rank}, iterations {self.first}-{self.seen - 1}: "
              + ", ".join(f"{k} {summary[k]}" for k in keys if k in summary) + f" ({self.directory})", flush=True)


def window_from_env(rank: int = 0) -> Window | None:
    """A :class:`Window` from :data:`ENV`, or None when it is unset."""
    spec = window()
    return None if spec is None else Window(*spec, rank=rank, host=host_profile())


@contextlib.contextmanager
def iterations(model: Any, rank: int = 0) -> Iterator[None]:
    """During a training loop: profile the window of :func:`window` (nothing when :data:`ENV` is unset), counted by
    ``model``'s forwards in training mode (a hook on ``model``: pass the training loop's wrapper, not the swapped GPT,
    whose CUDA graphs step aside for a module hook)."""
    win = window_from_env(rank) if isinstance(model, torch.nn.Module) else None
    if win is None:
        yield
        return

    def pre_hook(module: torch.nn.Module, args: Any) -> None:
        if module.training:
            win.tick()

    handle = model.register_forward_pre_hook(pre_hook)
    try:
        yield
    finally:
        handle.remove()
        win.close()
