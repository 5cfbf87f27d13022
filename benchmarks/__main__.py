"""``lit-liger bench NAME [options]``: lit-liger's benchmarks (``python -m benchmarks NAME`` from a checkout).

    kernels      per-op fwd+bwd time, extra memory, time/floor       [--ops rmsnorm,rope,...] [--quick] [--smoke]
    step         a whole LitGPT training step per variant             [--models Llama-3.2-1B,...] [--tiny] [--smoke]
    finetune     lit-liger finetune_lora/full, --liger false vs true  [--model M] [--methods lora,full] [--smoke]
    recipe       litgpt's LoRA/full recipe on Alpaca-shaped variable-length data, micro-batch 4 and 1,
                 stock vs lit-liger (buckets, CUDA graphs)   [--models M,...] [--micro_batches 4,1] [--smoke]
    trainer      Trainer + LigerCallback on litgpt's SFT data (LoRA, Llama-3.2-1B), 1 and N GPUs (DDP), stock vs
                 lit-liger   [--devices 1,2] [--variants stock,liger] [--batches 300]
    convergence  loss curves of a small model, eager vs lit-liger     [--steps 300] [--smoke]
    strategies   Trainer + LigerCallback under FSDP / ModelParallel / DeepSpeed 2 and 3, several GPUs
                 [--strategies fsdp,deepspeed3] [--devices 2]
    scaling      finetune_full (FSDP) on 2/4/8 GPUs, liger off/on: largest micro-batch, tokens/s per GPU,
                 largest context at micro-batch 1, scaling efficiency [--devices 2,4,8] [--model M]
    all          kernels, step, finetune and convergence, into one folder   [--out DIR] [--quick] [--smoke] [--tiny]
    plot         re-render the markdown tables and PNG charts of a results folder from its JSON: plot DIR
    chart        the README's LoRA-recipe chart (docs/recipe_lora.png) from the committed recipe results
    diag         GPU diagnostics (attn-sweep, flex-sweep, op-host, gaps, ddp-capture, ...): diag NAME [args]

The benchmarks take ``--out DIR``; ``lit-liger bench NAME -h`` lists all of its options. Results go to
``benchmarks/results/<device>-<date>/`` in a checkout, ``./lit-liger-bench-results/<device>-<date>/`` for an
installed package, and ``/tmp/lit-liger-bench/`` with ``--smoke`` (a few tokens, CPU-friendly). Optional
pieces: ``pip install "lit-liger[bench]"`` adds the liger-kernel peer and matplotlib (the PNG charts).
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import json
import sys
from pathlib import Path


def _all(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=f"{C.PROG} all",
                                description="kernels, step, finetune and convergence, into one folder")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--tiny", action="store_true", help="step: toy-size configs (for --smoke on CPU)")
    p.add_argument("--models", default=None, help="step: comma-separated LitGPT config names")
    opts = p.parse_args(argv)
    out = opts.out or C.default_out_dir(opts.smoke)
    common = ["--out", str(out)] + (["--quick"] if opts.quick else []) + (["--smoke"] if opts.smoke else [])
    from . import convergence, finetune, kernels, step

    kernels.main(common)
    step.main(common + (["--tiny"] if opts.tiny else []) + (["--models", opts.models] if opts.models else []))
    smoke = ["--smoke"] if opts.smoke else []
    finetune.main(["--out", str(out)] + smoke)
    convergence.main(["--out", str(out)] + smoke)


def _plot(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=f"{C.PROG} plot", description="re-render md + PNG from the JSON")
    p.add_argument("dir", type=Path)
    opts = p.parse_args(argv)
    from . import convergence, finetune, kernels, step

    done = False
    for name, module in (("kernels.json", kernels), ("step.json", step), ("finetune.json", finetune),
                         ("convergence.json", convergence)):
        path = opts.dir / name
        if path.exists():
            with open(path) as f:
                written = module.render(json.load(f), opts.dir)
            print("wrote " + ", ".join(str(w) for w in written))
            done = True
    if not done:
        raise SystemExit(f"no kernels.json, step.json, finetune.json or convergence.json in {opts.dir}")


# subcommand -> (module of this package, its entry point taking the remaining arguments)
_COMMANDS = {
    "kernels": ("kernels", "main"),
    "step": ("step", "main"),
    "finetune": ("finetune", "main"),
    "convergence": ("convergence", "main"),
    "strategies": ("strategies", "compare"),
    "scaling": ("scaling", "main"),
    "recipe": ("recipe", "main"),
    "trainer": ("trainer", "main"),
    "chart": ("chart", "main"),
    "diag": ("diag", "main"),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.replace("``", ""))
        return
    cmd, rest = argv[0], argv[1:]
    if cmd in _COMMANDS:
        import importlib

        module, entry = _COMMANDS[cmd]
        getattr(importlib.import_module(f".{module}", __package__), entry)(rest)
    elif cmd == "all":
        _all(rest)
    elif cmd == "plot":
        _plot(rest)
    else:
        raise SystemExit(f"unknown benchmark {cmd!r}\n\n{__doc__.replace('``', '')}")


if __name__ == "__main__":
    main()
