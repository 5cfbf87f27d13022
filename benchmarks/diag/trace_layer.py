"""One Block's kernels, in order, from a torch.profiler Chrome trace of training iterations (CPU only: reads a file).

usage: python -m benchmarks diag trace-layer TRACE.json[.gz] [--layer K] [--fwd NAME] [--bwd NAME]

A Block runs one attention kernel a pass, so the ``K``-th launch of ``--fwd`` (default ``_attn_fwd_kernel``,
lit-liger's softcap attention; ``flash``/``cudnn`` kernels for SDPA) starts Block ``K``'s forward section and the
``K``-th launch of ``--bwd`` (default ``_attn_dq_kernel``) a backward section. For each it prints every kernel from that
launch to the next one: its start (us from the section's start), duration (us), the stream the trace names and its
name; and the median section length over the trace (the time between consecutive markers, the sections that span an
iteration's end left out by taking the median). ``diag lora-cost`` writes such traces (``TRACE_DIR``); so does
``LIT_LIGER_PROFILE``. Kernels inside a replayed CUDA graph are traced one by one, on the graph's own stream numbers;
durations beside another stream's kernel include the wait for SMs, and the profiler slows graph launches (not their
kernels).
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics


def load_kernels(path: str) -> list[dict]:
    """The trace's kernel events, by start."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def sections(kernels: list[dict], marker: str) -> list[tuple[int, int]]:
    """``(first, end)`` indices of ``kernels`` from each launch whose name starts with ``marker`` to the next one."""
    at = [i for i, e in enumerate(kernels) if e["name"].startswith(marker)]
    return list(zip(at, at[1:]))


def section_rows(kernels: list[dict], first: int, end: int) -> list[tuple[float, float, str, str]]:
    """``(start us from the section's start, duration us, stream, name)`` of ``kernels[first:end]``."""
    t0 = kernels[first]["ts"]
    return [(e["ts"] - t0, e["dur"], str(e.get("tid", "")), e["name"]) for e in kernels[first:end]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="diag trace-layer", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--layer", type=int, default=10, help="which section (0-based launch of the marker)")
    ap.add_argument("--fwd", default="_attn_fwd_kernel")
    ap.add_argument("--bwd", default="_attn_dq_kernel")
    ap.add_argument("--width", type=int, default=90, help="characters of each kernel's name")
    a = ap.parse_args(argv)
    kernels = load_kernels(a.trace)
    for what, marker in (("forward", a.fwd), ("backward", a.bwd)):
        spans = sections(kernels, marker)
        if not spans:
            print(f"{what}: no kernel named {marker}* in {a.trace}")
            continue
        lengths = [kernels[j]["ts"] - kernels[i]["ts"] for i, j in spans]
        k = min(a.layer, len(spans) - 1)
        rows = section_rows(kernels, *spans[k])
        print(f"\n{what}: {len(spans) + 1} launches of {marker}*, median section {statistics.median(lengths):.1f} us; "
              f"section {k}: {lengths[k]:.1f} us, {len(rows)} kernels")
        print(f"{'start':>8s} {'us':>7s} {'stream':>6s}  kernel")
        for start, dur, stream, name in rows:
            print(f"{start:8.1f} {dur:7.2f} {stream:>6s}  {name[:a.width]}")


if __name__ == "__main__":
    main()
