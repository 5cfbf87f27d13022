"""``python -m benchmarks diag NAME [args]``: GPU diagnostics a maintainer runs again (one question each, JSON out).

Not benchmarks of record: each answers where time or memory goes, or which launch setting to pick, on the machine
it runs on. ``diag`` alone lists them; ``diag NAME -h`` (where the diagnostic parses options) or its docstring says
what it takes. Findings so far are in the result folders' NOTES.md (docs/performance.md cites them).
"""

from __future__ import annotations

import runpy
import sys

from .._common import PROG

#: name -> (module in this package, what it answers)
DIAGS = {
    "attn-sweep": ("attn_sweep", "launch plans of lit-liger's Triton softcap attention vs FlexAttention, per shape "
                                 "(sets kernels/_launch.py's attention_plan for a new GPU)"),
    "flex-sweep": ("flex_sweep", "FlexAttention launch settings (warps, blocks) and inductor's autotune, per family "
                                 "(kernels/_launch.py's flex_kernel_options)"),
    "op-host": ("op_host", "host microseconds to issue each swapped op's fwd+bwd against the LitGPT code it replaces "
                           "(FastKernel, Triton's launcher; DEVICE=cpu for a smoke run)"),
    "gaps": ("gaps", "where a training step's GPU sits idle, and every host-synchronizing call (torch.profiler)"),
    "window-mem": ("window_mem", "what is live at a sliding-window step's memory peak, per LigerConfig setting "
                                 "(memory-history replay)"),
    "replica-step": ("replica_step", "a replica's step on several GPUs (lit_liger.parallel.dataparallel): accumulation and "
                                     "synchronizing iterations, optimizer, per count of overlapped backward segments"),
    "graph-gain": ("graph_gain", "where CUDA graphs stop paying (step time captured vs not, per model and tokens) "
                                 "and what a Block keeps per token (lit_liger.runtime.graphs.CAPTURE_MAX_WORK, memplan)"),
    "ddp-capture": ("ddp_capture", "why a CUDA-graph capture inside torch's DistributedDataParallel forward fails "
                                   "(2 GPUs), per DDP setting, with the first failure's traceback"),
    "recipe-mem": ("recipe_mem", "memory and time of a LoRA loop on recipe-shaped lengths, per CUDA-graph pool "
                                 "setting (lit_liger/runtime/graphs.py) or torch.compile"),
    "data-pass": ("data_pass", "litgpt's pass over the data for its longest sample, in one process against "
                               "lit_liger.runtime.lengths' worker processes (CPU only)"),
    "loader-cycle": ("loader_cycle", "what a DataLoader iterator with running workers costs when the garbage collector "
                                     "frees it, with and without lit_liger.runtime.loaders.stop_workers (CPU only)"),
    "decode": ("decode", "litgpt's sample generation (its recipes' evaluations): seconds per new token, the host's "
                         "profile, and the one-token KV-cache step in a CUDA graph"),
    "long-attn": ("long_attn", "causal attention from 64k to 512k tokens: PyTorch's SDPA backends and lit-liger's "
                               "Triton kernel, forward and backward time, TFLOP/s, memory (issue 68)"),
    "cli-mem": ("cli_mem", "what is live at a real lit-liger / litgpt training run's memory peak, by the code that "
                           "allocated it (memory-history replay of the whole run)"),
    "pack-bits": ("pack_bits", "the LoRA dropout's mask packed into bits (kernels/dropout.py's pack_kept) against "
                               "its strided predecessor, at gemma2-2b's recipe shapes (CUDA-graph timed)"),
    "graph-launch": ("graph_launch", "the host's time to launch a CUDA graph, per node and per kind of node (aten, "
                                     "Triton, memcpy, memset, two streams, cuBLAS), the GPU idle or busy"),
    "capture-cost": ("capture_cost", "what a CUDA-graph capture costs on the host and where its recording's time goes "
                                     "(cProfile), against the same micro-batches uncaptured"),
    "lora-cost": ("lora_cost", "what a recipe's LoRA layers cost a training iteration on the GPU (CUDA graphs, CUDA "
                               "events), per variant of the model or of lit-liger's LoRA code, in turns (issue 66)"),
    "trace-layer": ("trace_layer", "one Block's kernels in order, forward and backward, with their starts, durations "
                                   "and streams, from a torch.profiler trace (CPU only: reads lora-cost's traces)"),
}


def usage() -> str:
    width = max(map(len, DIAGS))
    rows = "\n".join(f"    {name.ljust(width)}  {what}" for name, (_, what) in DIAGS.items())
    return f"usage: {PROG} diag NAME [args]\n\n{rows}\n"


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    name, rest = argv[0], argv[1:]
    if name not in DIAGS:
        raise SystemExit(f"unknown diagnostic {name!r}\n\n{usage()}")
    # each diagnostic is a program reading sys.argv (as it was when it lived in scripts/): run it as __main__
    sys.argv = [f"{PROG} diag {name}", *rest]
    runpy.run_module(f"{__package__}.{DIAGS[name][0]}", run_name="__main__", alter_sys=False)
