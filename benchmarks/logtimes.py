"""litgpt's iteration times from the logs of ``lit-liger`` runs (``python -m benchmarks.logtimes FILE ...``): per file
the timed window's mean iteration, the same without stalls (:func:`benchmarks.recipe.steady_split`) and the
iterations over ``--over`` times the median, with their numbers. For a device call's script
(``benchmarks/calls.sh``), where a run's JSON row may be missing (a run cut by its time limit keeps its log)."""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from .recipe import steady_split

_LINE = re.compile(r"iter (\d+).*?iter time: ([\d.]+)\s*ms")


def iteration_times(text: str) -> list[tuple[int, float]]:
    """``(iteration, ms)`` of each of litgpt's ``iter N ... iter time: X ms`` lines."""
    return [(int(m.group(1)), float(m.group(2))) for m in map(_LINE.search, text.splitlines()) if m]


def summary(text: str, warmup: int = 0, over: float = 3.0) -> dict:
    times = iteration_times(text)
    window = [t for i, t in times if i > warmup]
    if not window:
        return {"iterations": 0}
    median = statistics.median(window)
    return {"iterations": len(window), "iter_ms_mean": statistics.fmean(window), "iter_ms_median": median,
            **steady_split(window), "over": [(i, round(t, 1)) for i, t in times if i > warmup and t > over * median]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.logtimes", description=__doc__)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--warmup", type=int, default=0, help="iterations left out at the start (default 0)")
    p.add_argument("--over", type=float, default=3.0, help="list the iterations over this many medians")
    opts = p.parse_args(argv)
    for f in opts.files:
        s = summary(f.read_text(encoding="utf-8", errors="replace"), opts.warmup, opts.over)
        if not s["iterations"]:
            print(f"{f.name[:70]}: no iterations")
            continue
        print(f"{f.name[:70]}: n {s['iterations']}, mean {s['iter_ms_mean']:.2f} ms, median {s['iter_ms_median']:.2f}, "
              f"steady {s['iter_ms_mean_steady']:.2f} ({s['stalls']} stalls, {s['stall_ms']:.0f} ms); over "
              f"{opts.over:g}x the median: {s['over']}")


if __name__ == "__main__":
    main()
