"""What is live at a real ``lit-liger`` training run's memory peak, by the code that allocated it.

usage: python -m benchmarks diag cli-mem OUT.json [--top N] -- finetune_lora CHECKPOINT [litgpt/lit-liger args ...]

Runs ``lit_liger.cli.main(args)`` in this process (``--liger false`` runs stock litgpt) with PyTorch's CUDA memory
history recorded from before the checkpoint loads, then replays the history: the bytes live at the run's highest
point (weights included), the phase around it, and the blocks live then grouped by the first lit-liger / litgpt /
torch frames that allocated them (a CUDA graph's replays allocate nothing: its blocks show where its capture or its
warm-up allocated them). Keep the run short (``--train.max_steps``): every allocation of the run is kept, with its
Python stack, until the end (a SIGTERM, as ``timeout`` sends, ends the run and still reports). Also printed: ``torch.cuda.max_memory_allocated`` (litgpt's "Memory Used") and this process's peak host
memory (max RSS, pinned host copies included).
``LIT_LIGER_BENCH_DEVICE_GIB``: run as on a card of that many GiB (``benchmarks.finetune._cap_device``).
"""
import json
import os
import resource
import signal
import sys

import torch

from ._common import group_at_peak, live_at_peak

GiB, MiB = 1 << 30, 1 << 20


def main(argv: list[str]) -> None:
    if "--" not in argv or not argv or argv[0].startswith("-"):
        raise SystemExit(__doc__.split("\n\n")[1])
    cut = argv.index("--")
    out, opts, args = argv[0], argv[1:cut], argv[cut + 1:]
    top = int(opts[opts.index("--top") + 1]) if "--top" in opts else 40
    from lit_liger.cli import main as cli_main

    if os.environ.get("LIT_LIGER_BENCH_DEVICE_GIB"):  # a smaller card's memory on a larger one, as the recipe's runs
        from ..finetune import _cap_device

        _cap_device(float(os.environ["LIT_LIGER_BENCH_DEVICE_GIB"]))
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    # a run stopped by `timeout` (SIGTERM) still reports what was recorded up to then (the exit raised where the main
    # thread next runs Python: in a long backward, a recomputed Block's hook)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    status = None
    sys.argv = ["lit-liger", *args]  # (litgpt's save_hyperparameters parses sys.argv at the run's end)
    try:
        cli_main(args)
    except SystemExit as exc:  # litgpt's parser or the run ending: still report what was recorded
        status = exc.code
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    best, at_peak = live_at_peak(trace)
    groups = group_at_peak(at_peak, ("lit_liger", "kernels/", "litgpt", "torch/utils/checkpoint", "torch/optim",
                                     "torch/autograd", "torch/cuda/graphs", "lightning"), depth=3, top=top)
    res = {"args": args, "exit": status, "max_memory_allocated_GiB": round(torch.cuda.max_memory_allocated() / GiB, 3),
           "trace_events": len(trace), "trace_dropped_events": len(trace) >= 4_000_000,
           "peak_live_GiB": round(best / GiB, 3),
           "host_max_rss_GiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB, 2),
           "live_at_peak": groups}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "live_at_peak"}))
    for g in groups:
        print(f"   {g['MiB']:9.1f} MiB x{g['n']:<5d} {g['where'][:260]}")


main(sys.argv[1:])
