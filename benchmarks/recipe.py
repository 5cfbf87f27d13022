"""What litgpt's own fine-tuning recipes run: variable-length instruction data, micro-batch 1 and 4.

    python -m benchmarks recipe [--models Llama-3.2-1B,Qwen2.5-1.5B] [--methods lora] [--micro_batches 4,1]
                                [--iters 200] [--variants stock,liger,liger-no-graphs] [--lengths alpaca|fixed|long]
                                [--max_seq_length 512] [--global_batch 16] [--tied_head] [--quantize bnb.nf4-dq] [--devices 1,2] [--out DIR] [--smoke]

Each run is ``lit-liger finetune_<method> <checkpoint> --data JSON ...`` in a fresh process, on a random-init
checkpoint with the model's real widths and vocabulary (built locally: a byte-level BPE trained on Python's
standard library), ``--train.max_seq_length 512``, bf16-true, global batch 16, LoRA r=8 on query and value
(litgpt's defaults), ``--data.num_workers 2``. The data is Alpaca-shaped and generated here: a short
instruction, an input that is empty 60% of the time, an output whose length is lognormal; tokens per sample
(prompt template included) p10 ~90, median ~210, p90 ~480, so every micro-batch has a new longest sample.

Variants: ``stock`` (``--liger false``, litgpt as is), ``liger`` (``--liger true``, the defaults: kernels,
fused loss, ``seq_buckets``, ``cuda_graphs`` automatic = on for LoRA/adapters, off for full fine-tuning),
``liger-no-graphs`` (``--liger.cuda_graphs false``), ``liger-graphs`` (``--liger.cuda_graphs true``: also for
full fine-tuning), ``liger-no-buckets`` (``--liger.seq_buckets false --liger.cuda_graphs false``), ``liger-sdpa-torch`` /
``liger-no-graphs-sdpa-torch`` (PyTorch's own SDPA backend choice, cuDNN on an H100, with and without graphs),
``liger-no-lora`` (LitGPT's LoRA layers, no graphs), ``liger-mt`` / ``liger-no-graphs-mt`` (autograd's backward on
PyTorch's device thread, ``--liger.caller_thread_backward false``, with and without graphs), and
``stock-no-dropout`` / ``liger-no-dropout`` (``--lora_dropout 0``), ``liger-ckpt`` (``--liger.activation_checkpointing
true``: each Block recomputed in backward, steps captured on torch >= 2.10), ``liger-ckpt-no-graphs`` (the same,
``--liger.cuda_graphs false``), ``liger-ckpt-lean`` (with ``--liger.flce_mode lean``). Reported per run, from litgpt's own CSV log: tokens/s
over real tokens (litgpt's ``tokens``: prompt + response, no padding) / summed ``iter_time``, the first
``--warmup`` iterations left out; iteration time p50 / p90; peak memory (allocated and reserved: CUDA graphs
keep their activations in a pool that ``max_memory_allocated`` does not count once captured, so reserved is
the honest comparison); the loss of every iteration (one optimizer step every 16 / micro-batch iterations).

Long documents (issue 47): ``--lengths long --max_seq_length 16384 --global_batch 1 --micro_batches 1`` makes every
sample a document that fills ``max_seq_length`` (litgpt truncates it there); rows add model FLOP/s and MFU with the
attention's FLOPs counted (causal, forward and backward: ``6 T n_head head_size`` per token and layer, T the
document's length; the recompute not counted) and whether the run completed, litgpt's final save and ``merge_lora``
included (a failed run is a row with its error).
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import json
import math
import random
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

VARIANTS = {
    "stock": ["--liger", "false"],
    "liger": ["--liger", "true"],
    "liger-no-graphs": ["--liger.cuda_graphs", "false"],
    "liger-graphs": ["--liger.cuda_graphs", "true"],
    "liger-no-buckets": ["--liger.seq_buckets", "false", "--liger.cuda_graphs", "false"],
    "liger-sdpa-torch": ["--liger.sdpa_backend", "torch"],
    "liger-sdpa-flash": ["--liger.sdpa_backend", "flash"],
    "liger-no-graphs-sdpa-torch": ["--liger.cuda_graphs", "false", "--liger.sdpa_backend", "torch"],
    "liger-no-lora": ["--liger.lora", "false", "--liger.cuda_graphs", "false"],
    "liger-mt": ["--liger.caller_thread_backward", "false"],
    "liger-no-graphs-mt": ["--liger.cuda_graphs", "false", "--liger.caller_thread_backward", "false"],
    "stock-no-dropout": ["--liger", "false", "--lora_dropout", "0"],
    # issue 66: the same run through stock litgpt's console script, lit-liger's plugin routing it (VIA_LITGPT)
    "liger-via-litgpt": ["--liger", "true"],
    # run-to-run spread of stock itself, and stock with cuDNN attention off (SDPA then picks flash, the kernel
    # lit-liger's uncaptured steps use): both compare with the first "stock" row, not become the reference
    "stock-again": ["--liger", "false"],
    "stock-no-cudnn": ["--liger", "false"],
    "liger-no-dropout": ["--liger", "true", "--lora_dropout", "0"],
    # issue 47's governance off: no memory plan, every length captured (the headline recipes' speed before it)
    "liger-no-plan": ["--liger.activation_checkpointing", "false", "--liger.cuda_graphs_max_tokens", "100000000"],
    "liger-ckpt": ["--liger.activation_checkpointing", "true"],  # captured (torch >= 2.10)
    "liger-ckpt-no-graphs": ["--liger.activation_checkpointing", "true", "--liger.cuda_graphs", "false"],
    "liger-ckpt-lean": ["--liger.activation_checkpointing", "true", "--liger.flce_mode", "lean"],
    # issue 32: packing off (on by default since 2026-11-26)
    "liger-padded": ["--liger.packing", "false"],
    # issue 32, full fine-tuning: AdamW left as litgpt builds it (foreach)
    "liger-unfused-opt": ["--liger.fused_optimizer", "false"],
    # ... and litgpt's loop waiting for the GPU at each iteration's log (LigerConfig.defer_loss_sync off)
    "liger-sync": ["--liger.defer_loss_sync", "false"],
    # issue 33 / 46: the data-parallel plan on several devices (lit_liger.parallel.dataparallel): "liger" is automatic
    "liger-replicated": ["--liger.data_parallel", "replicate"],
    "liger-dp-shard": ["--liger.data_parallel", "shard"],
    "liger-dp-zero1": ["--liger.data_parallel", "zero1"],
    "liger-dp-zero1-no-graphs": ["--liger.data_parallel", "zero1", "--liger.cuda_graphs", "false"],
    "liger-dp-litgpt": ["--liger.data_parallel", "litgpt"],
    # ... and each device's micro-batches in litgpt's order (LigerConfig.balance_ranks off: not dealt by length)
    "liger-no-balance": ["--liger.balance_ranks", "false"],
    # (the variants that flipped a module switch from outside, their winners now the code's, are gone: issue 67,
    # docs/performance-trail.md's "Switches retired in issue 67")
    # issue 46: zero1 as on an 80 GB card (an H100's 79.19 GiB), memory only: on a larger card (an H200) the allocator
    # is capped there and lit-liger's memory plans see that card (benchmarks.finetune._cap_device); its speed is the
    # real card's
    "liger-dp-zero1-80gb": ["--liger.data_parallel", "zero1"],
    # issue 35: the projections' GEMMs in float8 (torchao's recipes; needs torchao and an sm_89+ GPU)
    "liger-fp8": ["--liger.fp8", "tensorwise"],
    "liger-fp8-rowwise": ["--liger.fp8", "rowwise"],
}
# variants that run in a child with this environment (read by benchmarks.finetune._child)
VARIANT_ENV = {"stock-no-cudnn": {"LIT_LIGER_BENCH_NO_CUDNN_SDPA": "1"},
               "liger-dp-zero1-80gb": {"LIT_LIGER_BENCH_DEVICE_GIB": "79.19"}}
# variants run through the `litgpt` console script and lit-liger's plugin (benchmarks.finetune.run_one's via_litgpt)
VIA_LITGPT = ("liger-via-litgpt",)
# stock variants that are not a new reference for the rows after them
NOT_REFERENCE = ("stock-again", "stock-no-cudnn")
# issue 16's targets (H100, Llama-3.2-1B, LoRA): tokens/s vs stock, memory vs stock
TARGETS = {"tok_per_s": 3.0, "memory": 0.7}
WORDS = ("data", "value", "function", "return", "list", "string", "number", "file", "user", "model", "write",
         "explain", "summarize", "python", "error", "result", "input", "output", "class", "object", "time",
         "first", "second", "example", "because", "which", "would", "should", "about", "their", "there")


def make_alpaca_like(path: Path, tokenizer_dir: Path, n: int, seed: int = 0, fixed: bool = False) -> dict[str, float]:
    """``n`` JSON instruction samples with Alpaca's length profile (measured with the checkpoint's tokenizer).
    ``fixed``: every output long enough (~700 tokens) that litgpt truncates every sample to ``max_seq_length``."""
    from litgpt import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    rng = random.Random(seed)
    # lognormal output lengths: median ~150 tokens, sigma 0.75 (Alpaca's long tail); short instructions
    rows, lengths = [], []
    for _ in range(n):
        def words(k: int) -> str:
            return " ".join(rng.choice(WORDS) for _ in range(max(1, k)))

        out_tokens = 700 if fixed else min(2000, int(rng.lognormvariate(math.log(150), 0.75)))
        row = {"instruction": words(rng.randint(6, 20)).capitalize() + ".",
               "input": "" if rng.random() < 0.6 else words(rng.randint(5, 60)),
               "output": words(max(1, int(out_tokens * 0.8)))}
        rows.append(row)
        lengths.append(len(tok.encode(row["instruction"] + " " + row["input"] + " " + row["output"])) + 40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows), encoding="utf-8")
    q = statistics.quantiles(lengths, n=10)
    return {"n_samples": n, "tokens_p10": q[0], "tokens_median": statistics.median(lengths), "tokens_p90": q[-1]}


def make_long_docs(path: Path, tokenizer_dir: Path, n: int, length: int, seed: int = 0) -> dict[str, float]:
    """``n`` JSON samples whose output alone is longer than ``length`` tokens (litgpt truncates each to its
    ``max_seq_length``): documents that fill the context."""
    from litgpt import Tokenizer

    tok = Tokenizer(tokenizer_dir)
    rng = random.Random(seed)
    probe = " ".join(rng.choice(WORDS) for _ in range(2000))
    per_word = max(0.5, len(tok.encode(probe)) / 2000)
    rows, lengths = [], []
    for _ in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(int(1.1 * length / per_word) + 64))
        rows.append({"instruction": "Continue the document.", "input": "", "output": words})
        lengths.append(min(length, len(tok.encode(words)) + 40))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows), encoding="utf-8")
    return {"n_samples": n, "tokens_min": min(lengths), "tokens_median": statistics.median(lengths),
            "max_seq_length": length}


def attention_flops_per_token(info: dict[str, Any], seq_len: int) -> float:
    """The attention's FLOPs per token of a training iteration over documents of ``seq_len`` tokens: causal QK^T and
    AV in forward (``2 * seq_len * d`` per token and layer on average, ``d = n_head * head_size``), twice that in
    backward."""
    return 6.0 * seq_len * info["n_head"] * info["head_size"] * info["n_layer"]


def _command(method: str, ckpt: Path, data: Path, run_dir: Path, mb: int, iters: int, precision: str,
             smoke: bool, variant: str, quantize: str | None = None, devices: int = 1, max_seq_length: int = 512,
             global_batch: int = 16, val_fraction: float = 0.02) -> list[str]:
    """The run's command line: ``iters`` iterations (micro-batches) per device, ``global_batch`` (at least one
    micro-batch per device; in a smoke run one micro-batch per device)."""
    global_batch = max(global_batch, mb * devices) if not smoke else mb * devices
    steps = max(1, iters * mb * devices // global_batch)
    return [f"finetune_{method}", str(ckpt), "--out_dir", str(run_dir), "--precision", precision,
            "--devices", str(devices),
            "--data", "JSON", "--data.json_path", str(data), "--data.val_split_fraction", str(val_fraction),
            "--data.num_workers", "0" if smoke else "2", "--train.micro_batch_size", str(mb),
            "--train.global_batch_size", str(global_batch), "--train.max_seq_length", "64" if smoke else str(max_seq_length),
            "--train.max_steps", str(steps), "--train.epochs", "1000", "--train.lr_warmup_steps", str(min(10, steps // 2)),
            "--train.save_interval", str(10**9), "--eval.interval", str(10**9), "--eval.final_validation", "false",
            "--eval.max_iters", "2", "--eval.max_new_tokens", "8", "--logger_name", "csv", "--seed", "1337",
            *VARIANTS[variant], *(["--quantize", quantize] if quantize else [])]


def _config_command(method: str, ckpt: Path, data: Path, run_dir: Path, config: Path, precision: str, variant: str,
                    devices: int = 1) -> list[str]:
    """A recipe as shipped (``--config``: its training, evaluation and saving settings, and every run's end: final
    validation, the saved and merged checkpoints), on this checkpoint and the Alpaca-shaped JSON ``data`` in place of
    its data set (Alpaca2k's 5% for validation)."""
    return [f"finetune_{method}", "--config", str(config), str(ckpt), "--out_dir", str(run_dir),
            "--precision", precision, "--devices", str(devices), "--data", "JSON", "--data.json_path", str(data),
            "--data.val_split_fraction", "0.05", "--logger_name", "csv", *VARIANTS[variant]]


def flops_per_token(info: dict[str, Any], method: str) -> float:
    """Model FLOPs per real token of a training iteration, attention left out: 6N for full fine-tuning (forward
    2N, input and weight gradients 4N), 4N for a frozen base (LoRA, adapters, QLoRA: no weight-gradient GEMMs);
    N = the matmul parameters (every Linear, the lm_head included; the embedding is a lookup)."""
    n = info["n_params"] - info["padded_vocab_size"] * info["n_embd"]
    return (6.0 if method in ("full", "pretrain") else 4.0) * n


def add_mfu(row: dict[str, Any], info: dict[str, Any], nominal: float | None, measured: float | None,
            devices: int = 1) -> None:
    """Model FLOP/s and MFU of a row: over real tokens, against the device's nominal dense bf16 peak and the
    bf16 matmul rate measured in this run (per device, for ``devices`` of them); and, where the run's log gives the
    padding, over the token positions the GPU processed (padding included)."""
    tflops = row["tokens_per_s"] * flops_per_token(info, row["method"].split(" ")[0]) / 1e12 / devices
    row["model_TFLOPs"] = tflops
    if nominal:
        row["mfu_nominal"] = tflops / nominal
    if measured:
        row["mfu_measured_peak"] = tflops / measured
    if row.get("padding_fraction") is not None and nominal:
        row["mfu_nominal_processed"] = row["mfu_nominal"] / (1 - row["padding_fraction"])


def padding_from_log(text: str) -> dict[str, Any]:
    """Token counts of a run from its output: litgpt's report (real tokens with the prompt template, and as
    collated, padding included) and, for lit-liger, the positions the GPU ran (its padding line)."""
    import re

    out: dict[str, Any] = {}
    real = re.search(r"Tokens w/ Prompt\s*:\s*(\d+)", text)
    collated = re.search(r"Total Tokens \(w/ Padding\)\s*:\s*(\d+)", text)
    ran = re.search(r"lit-liger: the GPU ran ([\d,]+) token positions", text)
    if real and collated:
        out["tokens_real"], out["tokens_collated"] = int(real.group(1)), int(collated.group(1))
        out["tokens_processed"] = int(ran.group(1).replace(",", "")) if ran else out["tokens_collated"]
        if out["tokens_processed"]:
            out["padding_fraction"] = 1 - out["tokens_real"] / out["tokens_processed"]
    graphs = re.search(r"lit-liger: CUDA graphs: (\d+) input shapes captured in ([\d.]+) s.*?\(per phase: ([^)]*)\)", text)
    if graphs:  # (lit_liger.runtime.graphs.capture_report)
        out["graph_captures"], out["graph_capture_s"] = int(graphs.group(1)), float(graphs.group(2))
        out["graph_capture_phases_s"] = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+) s", graphs.group(3))}
        share = re.search(r"input shapes captured in [\d.]+ s, ([\d.]+)% of the run's ([\d.]+) s", text)
        if share:  # (issue 47: capture time <= 5% of a recipe's run, the training loop's wall time)
            out["graph_capture_share"], out["train_wall_s"] = float(share.group(1)) / 100, float(share.group(2))
        wait = re.search(r"the GPU waited ([\d.]+) s for them", text)
        if wait:  # (the part of the captures the GPU waited for: they record without a device synchronize)
            out["graph_gpu_wait_s"] = float(wait.group(1))
        first = re.search(r"the process's first warm-up pass \(([\d.]+) s\)", text)
        if first:  # (its first calls: Triton's compilations without a disk cache, which an uncaptured run makes too)
            out["graph_first_warmup_s"] = float(first.group(1))
        warmed = re.search(r"(\d+) of the captures warmed up first", text)
        if warmed:  # (the captures that ran a warm-up pass: most record without one)
            out["graph_warmed"] = int(warmed.group(1))
    return out


def main(argv: list[str] | None = None) -> dict:
    from . import finetune as F

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog=f"{C.PROG} recipe", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="Llama-3.2-1B")
    p.add_argument("--methods", default="lora", help="comma-separated: lora, full, adapter")
    p.add_argument("--micro_batches", default="4,1")
    p.add_argument("--devices", default="1", help="comma-separated device counts (e.g. 1,2: scaling efficiency "
                   "against the 1-device row of the same variant; tokens/s over all devices)")
    p.add_argument("--iters", type=int, default=200, help="training iterations (micro-batches) per run")
    p.add_argument("--warmup", type=int, default=20, help="first iterations left out of tokens/s and times")
    p.add_argument("--variants", default="stock,liger")
    p.add_argument("--n_layer", type=int, default=None, help="layers (default: the model's own)")
    p.add_argument("--n_samples", type=int, default=4000)
    p.add_argument("--lengths", choices=("alpaca", "fixed", "long"), default="alpaca",
                   help="alpaca: variable lengths (default); fixed: every sample truncated to max_seq_length; long: "
                        "documents that fill max_seq_length (MFU with attention counted)")
    p.add_argument("--max_seq_length", type=int, default=512, help="litgpt's --train.max_seq_length")
    p.add_argument("--global_batch", type=int, default=16, help="litgpt's --train.global_batch_size")
    p.add_argument("--block_size", type=int, default=None,
                   help="the random checkpoint's context length (default: max(512, max_seq_length)); one checkpoint "
                        "serves several --max_seq_length runs")
    p.add_argument("--work_dir", type=Path, default=F.WORK_DIR)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tied_head", action="store_true",
                   help="a checkpoint whose lm_head equals its embedding, as litgpt converts a Hugging Face model with "
                        "tied embeddings (Llama-3.2-1B/3B, Qwen2.5 up to 3B): lit-liger keeps one copy (tied_weights)")
    p.add_argument("--quantize", default=None, help="QLoRA: litgpt's --quantize for every variant (e.g. bnb.nf4-dq; "
                   "needs bitsandbytes, pip install 'lit-liger[qlora]')")
    p.add_argument("--config", type=Path, default=None,
                   help="a recipe as shipped (e.g. configs/llama-3.2-1B/lora.yaml; --methods names its method): its "
                        "own training, evaluation and saving settings; only the checkpoint and the data (--n_samples "
                        "Alpaca-shaped samples) are this benchmark's; --iters is unused")
    p.add_argument("--litgpt_args", default="", help="more arguments of every run's command line, after the "
                   "benchmark's own (e.g. \"--train.save_interval 1000000\")")
    p.add_argument("--smoke", action="store_true", help="tiny model, a few iterations (CPU: Triton interpreter)")
    opts = p.parse_args(argv)
    smoke = opts.smoke or not C.CUDA
    out = opts.out or C.default_out_dir(smoke)
    out = out / "recipe" if opts.out is None else out
    out.mkdir(parents=True, exist_ok=True)
    precision = "bf16-true" if C.CUDA else "32-true"
    iters = 4 if smoke else opts.iters
    warmup = 1 if smoke else min(opts.warmup, iters - 1)
    result: dict[str, Any] = {"environment": C.environment(), "argv": argv, "smoke": smoke, "rows": [],
                              "settings": {"iters": iters, "warmup": warmup, "precision": precision,
                                           "lengths": opts.lengths, "tied_head": opts.tied_head,
                                           "max_seq_length": opts.max_seq_length, "global_batch": opts.global_batch,
                                           "quantize": opts.quantize,
                                           "config": None if opts.config is None else str(opts.config)}}
    nominal = C.nominal_bf16_TFLOPs(C.device_name()) if C.CUDA else None
    measured = C.matmul_TFLOPs(8192, 8192, 8192) if C.CUDA else None  # the bf16 GEMM rate of this GPU, now
    result["settings"].update(nominal_bf16_TFLOPs=nominal, measured_bf16_matmul_TFLOPs=measured)
    single: dict[tuple, float] = {}  # the 1-device rows' tokens/s (scaling efficiency)
    for model in [m for m in opts.models.split(",") if m]:
        from litgpt import Config

        n_layer = opts.n_layer or (2 if smoke else Config.from_name(model).n_layer)
        block = max(512, opts.block_size or 0, opts.max_seq_length if opts.lengths == "long" else 0)
        ckpt, _, info = F.build_inputs(opts.work_dir, model, n_layer, smoke=smoke, n_samples=8, max_seq_length=block,
                                       tied_head=opts.tied_head)
        fixed = opts.lengths == "fixed"
        if opts.lengths == "long":
            length = 64 if smoke else opts.max_seq_length
            data = opts.work_dir / "data" / f"long-{length}-{ckpt.name}-{opts.n_samples}.json"
            n = 64 if smoke else min(opts.n_samples, 16)  # (16 documents, one of them for validation)
            data = data.with_name(f"long-{length}-{ckpt.name}-{n}.json")
            result.setdefault("data", {})[model] = make_long_docs(data, ckpt, n, length)
        else:
            data = opts.work_dir / "data" / f"alpaca-like{'-fixed' if fixed else ''}-{ckpt.name}-{opts.n_samples}.json"
            result.setdefault("data", {})[model] = make_alpaca_like(data, ckpt, 64 if smoke else opts.n_samples,
                                                                    fixed=fixed)
        result.setdefault("inputs", {})[model] = info
        for method in [m for m in opts.methods.split(",") if m]:
            for mb, n_dev in [(int(b), int(d)) for b in opts.micro_batches.split(",") if b
                              for d in opts.devices.split(",") if d]:
                stock = None
                for variant in [v for v in opts.variants.split(",") if v]:
                    q = f"-{opts.quantize}" if opts.quantize else ""
                    g = f"-{n_dev}dev" if n_dev > 1 else ""
                    long = f"{opts.max_seq_length}" if opts.lengths == "long" else ""
                    run_dir = (opts.work_dir / "recipe-runs"
                               / f"{model}-{method}{q}-B{mb}{g}-{variant}-{opts.lengths}{long}")
                    if opts.config is not None:
                        run_dir = run_dir.with_name(f"{opts.config.parent.name}-{opts.config.stem}-{variant}")
                        args = _config_command(method, ckpt, data, run_dir, opts.config, precision, variant, n_dev)
                    else:
                        args = _command(method, ckpt, data, run_dir, mb, iters, precision, smoke, variant,
                                        opts.quantize, n_dev, opts.max_seq_length, opts.global_batch,
                                        1.5 / 16 if opts.lengths == "long" and not smoke else 0.02)
                    args += shlex.split(opts.litgpt_args)
                    row: dict[str, Any] = {"model": model, "method": method + (f" ({opts.quantize})" if q else ""),
                                           "B": mb, "devices": n_dev, "variant": variant,
                                           "command": ("litgpt " if variant in VIA_LITGPT else "lit-liger ") + " ".join(args)}
                    try:
                        res = F.run_one(args, run_dir, warmup=warmup, env=VARIANT_ENV.get(variant),
                                        via_litgpt=variant in VIA_LITGPT)
                        # litgpt logs rank 0's tokens; its own "total_tokens" is that times the world size
                        res["tokens_per_s"] *= n_dev
                        from lit_liger.demo import read_metrics

                        metrics = read_metrics(run_dir)
                        times = [r["iter_time"] * 1e3 for r in metrics][warmup:]
                        row.update(res, status="ok", iter_ms_p50=statistics.median(times),
                                   iter_ms_p90=statistics.quantiles(times, n=10)[-1] if len(times) > 1 else times[0],
                                   iter_ms_mean=statistics.fmean(times), **steady_split(times))
                        accumulation = max(1, (16 if not smoke else mb * n_dev) // (mb * n_dev))
                        if opts.config is not None:
                            import yaml

                            train = yaml.safe_load(opts.config.read_text()).get("train", {})
                            mb_cfg = train.get("micro_batch_size", mb)
                            accumulation = max(1, train.get("global_batch_size", mb_cfg) // (mb_cfg * n_dev))
                        row.update(_sync_split(metrics, warmup, accumulation))
                        log = run_dir / "stdout.txt"
                        if log.is_file():
                            row.update(padding_from_log(log.read_text(encoding="utf-8", errors="replace")))
                        add_mfu(row, info, nominal, measured, n_dev)
                        if opts.lengths == "long" and nominal:
                            T = 64 if smoke else opts.max_seq_length
                            attn = row["tokens_per_s"] * attention_flops_per_token(info, T) / 1e12 / n_dev
                            row["model_TFLOPs_with_attention"] = row["model_TFLOPs"] + attn
                            row["mfu_nominal_with_attention"] = row["model_TFLOPs_with_attention"] / nominal
                        final = run_dir / "final"
                        row["completed"] = (final / "lit_model.pth").is_file() if method == "lora" else True
                        if final.is_dir() and opts.lengths == "long":
                            import shutil

                            shutil.rmtree(final)  # (an 8B merged checkpoint per run: 16 GB of disk)
                        one = single.get((model, row["method"], mb, variant))
                        if n_dev == 1:
                            single[(model, row["method"], mb, variant)] = row["tokens_per_s"]
                        elif one:
                            row["x_one_device"] = row["tokens_per_s"] / one
                            row["scaling_efficiency"] = row["x_one_device"] / n_dev
                    except Exception as e:  # noqa: BLE001 - a failed run is a row, not the end of the benchmark
                        row.update(status=f"failed: {e}")
                    if variant.startswith("stock") and variant not in NOT_REFERENCE and row["status"] == "ok":
                        stock = row  # the lit-liger variants after it compare with it
                    if stock is not None and row["status"] == "ok" and row is not stock:
                        row["x_stock_tok_s"] = row["tokens_per_s"] / stock["tokens_per_s"]
                        row.update(loss_divergence(stock.get("losses") or [], row.get("losses") or []))
                        for key in ("peak_memory_gb", "peak_reserved_gb"):
                            if row.get(key) and stock.get(key):
                                row[f"x_stock_{key}"] = row[key] / stock[key]
                    result["rows"].append(row)
                    print(_line(row), flush=True)
                    C.write_json(out / "recipe.json", result)
    render(result, out)
    return result


def _sync_split(metrics: list[dict], warmup: int, accumulation: int) -> dict[str, float]:
    """Median iteration time of the iterations that end with an optimizer step (every ``accumulation``-th: the
    gradient reduction on several devices, the optimizer) and of the accumulation iterations, warm-up left out."""
    sync, accum = [], []
    for r in metrics:
        if r.get("iter", 0) <= warmup:
            continue
        (sync if int(r["iter"]) % accumulation == 0 else accum).append(r["iter_time"] * 1e3)
    out = {}
    if sync:
        out["iter_ms_sync_p50"] = statistics.median(sync)
    if accum:
        out["iter_ms_accum_p50"] = statistics.median(accum)
    return out


#: an iteration of the timed window longer than this many times the window's median is a stall (a CUDA-graph capture,
#: a checkpoint's save, the profiler's export): :func:`steady_split`
STALL_X = 4.0


def steady_split(times_ms: list[float], stall_x: float = STALL_X) -> dict[str, float]:
    """The timed window's iterations without its stalls (longer than ``stall_x`` times the median): their mean, and how
    many stalls took how long. tokens/s counts the stalls, as a user's run does; comparing two variants by it alone
    also compares where their captures fell, and the first lit-liger run on a fresh machine compiles every Triton
    kernel (Triton's disk cache is empty) inside its first capture (1.45 s against 0.15 s for the next run,
    ``h200x2-2026-11-27f``)."""
    if not times_ms:
        return {}
    cut = stall_x * statistics.median(times_ms)
    steady = [t for t in times_ms if t <= cut]
    return {"iter_ms_mean_steady": statistics.fmean(steady), "stalls": len(times_ms) - len(steady),
            "stall_ms": sum(times_ms) - sum(steady)}


def loss_divergence(ref: list[float], losses: list[float], threshold: float = 0.01) -> dict[str, Any]:
    """Per-iteration relative loss difference against ``ref``: the largest (and where), and the first
    iteration (1-based) past ``threshold``; None where no iteration passes it."""
    diffs = [abs(b - a) / abs(a) for a, b in zip(ref, losses) if a]
    if not diffs:
        return {}
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    first = next((i + 1 for i, d in enumerate(diffs) if d > threshold), None)
    return {"loss_max_rel_diff": diffs[worst], "loss_max_rel_diff_iter": worst + 1,
            "loss_first_iter_over_1pct": first}


def _line(r: dict) -> str:
    return (f"{r['model']} {r['method']} B{r['B']} x{r.get('devices', 1)} {r['variant']}: {r['status']} "
            f"tok/s {C.fmt(r.get('tokens_per_s'))} ({C.fmt(r.get('x_stock_tok_s'))}x) p50 {C.fmt(r.get('iter_ms_p50'))} "
            f"p90 {C.fmt(r.get('iter_ms_p90'))} ms, MFU {C.fmt(r.get('mfu_nominal'))}, alloc {C.fmt(r.get('peak_memory_gb'))} GB, reserved "
            f"{C.fmt(r.get('peak_reserved_gb'))} GB")


COLUMNS = ["model", "method", "B", "GPUs", "variant", "tok/s", "x stock", "scaling", "model TFLOP/s per GPU",
           "MFU (nominal)",
           "MFU (measured peak)", "padding", "MFU over processed", "iter ms mean", "mean without stalls", "stall ms",
           "p50", "p90", "peak alloc GB",
           "peak reserved GB", "max rank alloc GB", "x stock reserved", "loss iter 1", "final loss", "status"]


def render(result: dict, out_dir: Path) -> list[Path]:
    env, s = result["environment"], result["settings"]
    rows = [[r["model"], r["method"], r["B"], r.get("devices", 1), r["variant"], r.get("tokens_per_s"),
             r.get("x_stock_tok_s"), r.get("scaling_efficiency"), r.get("model_TFLOPs"), r.get("mfu_nominal"), r.get("mfu_measured_peak"), r.get("padding_fraction"),
             r.get("mfu_nominal_processed"), r.get("iter_ms_mean"), r.get("iter_ms_mean_steady"), r.get("stall_ms"),
             r.get("iter_ms_p50"), r.get("iter_ms_p90"), r.get("peak_memory_gb"),
             r.get("peak_reserved_gb"), r.get("peak_memory_max_rank_gb"), r.get("x_stock_peak_reserved_gb"),
             (r.get("losses") or [None])[0], (r.get("losses") or [None])[-1], r["status"]] for r in result["rows"]]
    md = [f"# Recipe benchmark: {env['device']}, {env['date']}"
          + (" (fixed lengths: every sample truncated to max_seq_length)" if s.get("lengths") == "fixed" else "")
          + (" (tied head: the checkpoint's lm_head equals its embedding, as in a converted tied-embedding model)"
             if s.get("tied_head") else ""), "",
          f"torch {env['torch']}, triton {env['triton']}, litgpt {env['litgpt']}, lit-liger {env['lit_liger']} "
          f"({env.get('lit_liger_commit')})" + (" — SMOKE RUN (not a measurement)" if result.get("smoke") else ""),
          "", f"{s['iters']} iterations per run, the first {s['warmup']} left out; {s['precision']}; data: "
          + json.dumps(result.get("data")), "",
          "Model FLOP/s over real tokens (6N per token for full fine-tuning, 4N for a frozen base, N = matmul "
          f"parameters, attention left out); MFU against the nominal dense bf16 peak ({C.fmt(s.get('nominal_bf16_TFLOPs'))} "
          f"TFLOP/s) and the bf16 GEMM rate measured in this run ({C.fmt(s.get('measured_bf16_matmul_TFLOPs'))}).", "", C.markdown_table(COLUMNS, rows), "",
          f"Targets (issue 16, LoRA, Llama-3.2-1B): >= {TARGETS['tok_per_s']}x stock tokens/s at micro-batch 1 and 4, "
          f"<= {TARGETS['memory']}x stock memory.", "", "## Commands", "", "```",
          f"{C.PROG} recipe " + " ".join(result.get("argv") or []), *[r["command"] for r in result["rows"]], "```", ""]
    path = out_dir / "recipe.md"
    path.write_text("\n".join(md))
    written = [path]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    groups: dict[str, list[dict]] = {}
    for r in result["rows"]:
        if r["status"] == "ok":
            gpus = f" x{r.get('devices', 1)} GPUs" if r.get("devices", 1) > 1 else ""
            groups.setdefault(f"{r['model']} {r['method']} B={r['B']}{gpus}", []).append(r)
    if groups:
        fig, axes = plt.subplots(2, len(groups), figsize=(5 * len(groups), 7), squeeze=False)
        for i, (title, rs) in enumerate(groups.items()):
            ax = axes[0][i]
            ax.bar([r["variant"] for r in rs], [r["tokens_per_s"] for r in rs])
            ax.set_title(title)
            ax.set_ylabel("tokens/s (real tokens)")
            ax.tick_params(axis="x", labelrotation=20)
            ax = axes[1][i]
            for r in rs:
                ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["variant"], linewidth=0.8)
            ax.set_xlabel("iteration")
            ax.set_ylabel("loss")
            ax.legend()
        fig.suptitle(f"{env['device']} — litgpt recipe, Alpaca-shaped data, max_seq_length 512")
        fig.tight_layout()
        png = out_dir / "recipe.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        written.append(png)
    return written


if __name__ == "__main__":
    main()
