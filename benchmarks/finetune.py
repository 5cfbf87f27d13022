"""End-to-end benchmark: ``lit-liger finetune_lora`` / ``finetune_full``, ``--liger false`` vs ``--liger true``.

    python -m benchmarks finetune [--model Llama-3.2-1B] [--n_layer N] [--methods lora,full] [--steps 30]
                                  [--micro_batch_size 4] [--max_seq_length 2048] [--out DIR] [--smoke]

What a user runs, measured the way a user sees it. Everything is built offline by
:mod:`lit_liger.demo`'s builders (a byte-level BPE trained on Python's standard library, a random-init
checkpoint with a real LitGPT config's shape, a "write the stdlib function X" instruction set), then
each method runs twice, each run in a fresh process: ``lit-liger finetune_<method> ... --liger false``
(stock litgpt) and ``--liger true``. Same seed, same data, one optimizer step per micro-batch.

Numbers come from the runs themselves: tokens/s from the CSV logger's ``metrics.csv`` (litgpt's own
``tokens`` and ``iter_time``, the first steps left out as warm-up), peak memory from the child
process's ``torch.cuda.max_memory_allocated()`` (reset after litgpt's "Verifying settings" validation
pass, so it is the training steps' peak; the whole run's peak is kept beside it).
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

METHODS = ("lora", "full", "pretrain")
DEFAULT_METHODS = ("lora", "full")
# The target for LoRA (H100, Llama-3.2-1B): --liger true at >= 1.5x the tokens/s of --liger false
# with <= 0.6x its peak memory. No target is set for full finetuning.
TARGETS = {"lora": {"tok_per_s": 1.5, "memory": 0.6}}
# Issue 6 (FSDP full finetune of a Llama-3.1-8B shape on 2 x H200): per GPU, >= 1.25x tokens/s at <= 0.7x memory.
MULTI_GPU_TARGETS = {"full": {"tok_per_s": 1.25, "memory": 0.7}}
LOSS_RTOL = {"32-true": 1e-4, "bf16-true": 2e-2}  # first-step loss, --liger true vs false
TRACK_RTOL = 0.01  # issue 6: with several devices, --liger true tracks --liger false within 1% at every step
WORK_DIR = C.SMOKE_DIR / "finetune-work"  # checkpoints and runs: big, never under results/


# ----------------------------------------------------------------------------------------------
# Inputs: tokenizer, checkpoint, data (lit_liger.demo's builders)
# ----------------------------------------------------------------------------------------------
def build_inputs(work_dir: Path, model: str, n_layer: int, *, smoke: bool, n_samples: int, max_seq_length: int,
                 vocab_size: int | None = None, tied_head: bool = False) -> tuple[Path, Path, dict[str, Any]]:
    """Checkpoint dir and JSON data path (reused when already there), and what they hold.

    GPU: the model's real widths and padded vocabulary (the lm_head costs what it costs in the real
    model; the BPE has ``vocab_size`` = 8192 tokens, so ids stay below it), ``n_layer`` layers; samples of
    8,000-40,000 characters, so most fill ``max_seq_length`` after truncation. Smoke: demo's tiny widths and
    a 512-token vocabulary. ``tied_head``: ``lm_head.weight`` equal to the embedding, as in a converted checkpoint
    of a tied-embedding model (``lit_liger.demo.make_checkpoint``).
    """
    from litgpt import Config

    from lit_liger.demo import (
        make_checkpoint,
        make_instruction_dataset,
        source_files,
        tiny_overrides,
        train_tokenizer,
    )

    vocab_size = vocab_size or (512 if smoke else 8192)
    block_size = max(max_seq_length, 256)
    ckpt = work_dir / "checkpoints" / (f"random-{model}-{n_layer}L{'-tiny' if smoke else ''}-v{vocab_size}-b{block_size}"
                                       + ("-tied" if tied_head else ""))
    data_path = work_dir / "data" / f"stdlib_instructions-{'tiny' if smoke else 'long'}-{n_samples}.json"
    files = source_files()
    if not (ckpt / "lit_model.pth").is_file():
        vocab = train_tokenizer(ckpt, vocab_size, files[:40] if smoke else files)
        overrides: dict[str, Any] = {"n_layer": n_layer, "block_size": block_size}
        if smoke:
            overrides.update(tiny_overrides())
            padded = vocab
        else:  # real widths; lm_head keeps the real (padded) vocabulary
            padded = Config.from_name(model).padded_vocab_size
        big = not smoke and C.CUDA  # real widths: init on the GPU, saved in bf16 (an 8B model in seconds)
        make_checkpoint(ckpt, model, vocab_size=vocab, padded_vocab_size=padded,
                        device="cuda" if big else None, dtype=torch.bfloat16 if big else None, tied_head=tied_head,
                        **overrides)
        C.free_memory()
    if not data_path.is_file():
        make_instruction_dataset(data_path, files, n=n_samples, min_chars=0 if smoke else 8000,
                                 max_chars=1500 if smoke else 40000)
    cfg = Config.from_file(ckpt / "model_config.yaml")
    info = {"checkpoint_dir": str(ckpt), "data_path": str(data_path),
            "n_samples": len(json.loads(data_path.read_text(encoding="utf-8"))), "n_layer": cfg.n_layer,
            "n_embd": cfg.n_embd, "n_head": cfg.n_head, "head_size": cfg.head_size, "vocab_size": cfg.vocab_size, "padded_vocab_size": cfg.padded_vocab_size,
            "n_params": C.n_params(cfg)}
    return ckpt, data_path, info


def command(method: str, ckpt: Path, data_path: Path, run_dir: Path, precision: str, micro_batch_size: int,
            max_seq_length: int, steps: int, liger: bool, devices: int = 1, extra: str = "") -> list[str]:
    """``lit-liger <script>`` arguments: the demo's (``lit_liger.demo.finetune_command``) plus --liger (and, for
    ``--liger true``, ``extra``: more ``--liger.NAME VALUE`` arguments); ``devices`` > 1 keeps one micro-batch per
    device per optimizer step. ``pretrain`` trains the same architecture from scratch on the machine's Python sources
    (``lit_liger.demo.LocalText``)."""
    import shlex

    from lit_liger.demo import finetune_command

    args = finetune_command(ckpt, data_path, run_dir, precision, micro_batch_size, max_seq_length, steps)
    assert args[0] == "finetune_lora"
    args[args.index("--devices") + 1] = str(devices)
    args[args.index("--train.global_batch_size") + 1] = str(micro_batch_size * devices)
    liger_args = ["--liger", "true"] + shlex.split(extra) if liger else ["--liger", "false"]
    if method != "pretrain":
        return [f"finetune_{method}", *args[1:], *liger_args]
    cfg_file = run_dir.parent / f"pretrain-{ckpt.name}.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    model_config = yaml.safe_load((ckpt / "model_config.yaml").read_text())
    cfg_file.write_text(yaml.safe_dump({"model_name": ckpt.name, "model_config": model_config}))
    tokens = steps * micro_batch_size * devices * max_seq_length
    return ["pretrain", "--config", str(cfg_file), "--out_dir", str(run_dir), "--precision", precision,
            "--devices", str(devices), "--tokenizer_dir", str(ckpt), "--data", "lit_liger.demo.LocalText",
            "--train.micro_batch_size", str(micro_batch_size),
            "--train.global_batch_size", str(micro_batch_size * devices), "--train.max_seq_length",
            str(max_seq_length), "--train.max_tokens", str(tokens), "--train.lr_warmup_steps", "1",
            "--train.save_interval", str(10**9), "--eval.interval", str(10**9), "--eval.max_iters", "1",
            "--eval.final_validation", "false", "--logger_name", "csv", *liger_args]


# ----------------------------------------------------------------------------------------------
# One run (a child process)
# ----------------------------------------------------------------------------------------------
def run_one(args: list[str], run_dir: Path, *, warmup: int, in_process: bool = False,
            env: dict[str, str] | None = None, via_litgpt: bool = False) -> dict[str, Any]:
    """``lit-liger *args`` in a fresh process; its numbers (``lit_liger.demo._summarize`` of its logs).

    ``in_process`` runs it in this process instead (tests: no second interpreter start-up; peak memory
    counters are then shared with whatever ran before). ``env``: extra environment variables of the child
    (not with ``in_process``). Raises ``RuntimeError`` when the run fails.
    """
    from lit_liger.demo import _summarize

    if run_dir.exists():
        shutil.rmtree(run_dir)  # a previous run's logs/csv/version_0 would be read instead of this one's
    run_dir.mkdir(parents=True)
    stats = run_dir / "lit_liger_stats.json"
    log = run_dir / "stdout.txt"
    t0 = time.perf_counter()
    if in_process:
        if env:
            raise ValueError("env applies to a child process; in_process runs in this one")
        saved = list(sys.argv)
        try:
            _child(str(stats), args)
        finally:
            sys.argv[:] = saved
    else:
        env, cwd = {**os.environ, **(env or {})}, None
        if C.PACKAGE == "benchmarks":  # a checkout's top-level folder: the child needs it on its path
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(C.REPO_ROOT), env.get("PYTHONPATH")) if p)
            cwd = C.REPO_ROOT
        with log.open("w", encoding="utf-8") as out:  # (streamed: a run stopped from outside leaves its log)
            child = "--child-litgpt" if via_litgpt else "--child"  # (litgpt's console script + lit-liger's plugin)
            proc = subprocess.run([sys.executable, "-m", f"{C.PACKAGE}.finetune", child, str(stats), *args],
                                  cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, check=False)
        if proc.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"exit {proc.returncode}: {tail[0][:200]} (log: {log})")
    res = _summarize(run_dir, stats, warmup=warmup)
    res["process_s"] = time.perf_counter() - t0
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob(stats.name + ".rank*"))]
    peaks = [r["peak_memory_bytes"] for r in ranks if r.get("peak_memory_bytes")]
    if peaks and res.get("peak_memory_gb"):
        res["peak_memory_max_rank_gb"] = max(res["peak_memory_gb"], max(peaks) / 1e9)
    return res


#: the child's stats file, handed to the ranks that Lightning's launcher starts (they run this module again with the
#: lit-liger arguments only; see :func:`main`): internal plumbing, set by the child itself
_STATS_ENV = "LIT_LIGER_BENCH_STATS"


def _count_syncs(path: str) -> None:
    """``torch.cuda.set_sync_debug_mode("warn")`` for the whole run: each synchronizing call's Python stack (its last
    frames) counted, written to ``path`` at exit, most frequent first."""
    import atexit
    import traceback
    import warnings

    import torch

    counts: dict[str, int] = {}

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return
        stack = "".join(traceback.format_stack(limit=10)[:-2])
        counts[stack] = counts.get(stack, 0) + 1

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")

    def dump() -> None:
        with open(path, "w") as f:
            for stack, n in sorted(counts.items(), key=lambda kv: -kv[1]):
                f.write(f"=== {n} syncs\n{stack}\n")

    atexit.register(dump)


#: the environment variable that turns a run's diagnostics on in its processes (the child and, on several devices, the
#: ranks Lightning starts): ``key=value`` entries separated by ``;`` (:data:`DIAGNOSTICS`), e.g.
#: ``LIT_LIGER_BENCH_DIAG="syncs=/tmp/syncs.txt;time=litgpt.finetune.lora:fit"``
DIAG_ENV = "LIT_LIGER_BENCH_DIAG"
#: the keys of :data:`DIAG_ENV`'s entries and what each does in a run's process
DIAGNOSTICS = {
    "syncs": "FILE: every device sync's Python stack counted (torch.cuda.set_sync_debug_mode), written to FILE at "
             "exit, most frequent first (run one variant at a time)",
    "time": "module:function,module:Class.method,...: each such call of 50 ms or more printed (bench-timer: NAME S s)",
    "cprofile": "module:function,...: each such call run under cProfile, its stats written as function-N.pstats "
                "(N: the call's number, from 1) to cprofile_dir",
    "cprofile_dir": "DIR: where cprofile's stats go (default: the run's folder)",
    "fit": "FILE: cProfile over litgpt's fit (one process), its stats written to FILE",
}


def diagnostics(spec: str) -> dict[str, str]:
    """:data:`DIAG_ENV`'s ``spec`` as ``{key: value}``; an unknown key or an entry without ``=`` raises
    ``ValueError``."""
    out = {}
    for entry in filter(None, (e.strip() for e in spec.split(";"))):
        key, eq, value = entry.partition("=")
        if not eq or key.strip() not in DIAGNOSTICS:
            raise ValueError(f"{DIAG_ENV}: {entry!r} is not KEY=VALUE with KEY one of {', '.join(DIAGNOSTICS)}")
        out[key.strip()] = value.strip()
    return out


def _child(stats_path: str, argv: list[str], via_litgpt: bool = False) -> None:
    """Child entry point: ``lit_liger.demo._run_and_record`` (peak memory of the training steps and of
    the whole run, wall time; the peak counter is reset after each validation pass); ``via_litgpt``: the run through
    the ``litgpt`` console script and lit-liger's plugin (the recipe's ``liger-via-litgpt`` variant). The environment
    may set: ``LIT_LIGER_BENCH_NO_CUDNN_SDPA=1`` (the recipe's ``stock-no-cudnn``: cuDNN attention off),
    ``LIT_LIGER_BENCH_DEVICE_GIB`` (a smaller card's memory on a larger one, the recipe's ``*-80gb``:
    :func:`_cap_device`) and :data:`DIAG_ENV` (the diagnostics)."""
    from lit_liger.demo import _run_and_record

    if os.environ.get("LIT_LIGER_BENCH_NO_CUDNN_SDPA") == "1":  # the recipe's stock-no-cudnn variant
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)
    if os.environ.get("LIT_LIGER_BENCH_DEVICE_GIB"):  # a smaller card's memory on a larger one (the recipe's *-80gb)
        _cap_device(float(os.environ["LIT_LIGER_BENCH_DEVICE_GIB"]))
    diag = diagnostics(os.environ.get(DIAG_ENV, ""))
    if diag.get("syncs"):
        _count_syncs(diag["syncs"])
    if diag.get("time"):
        _time_calls(diag["time"])
    if diag.get("cprofile"):
        _time_calls(diag["cprofile"], 0.0, diag.get("cprofile_dir") or str(Path(stats_path).parent))
    if diag.get("fit"):
        _profile_fit(diag["fit"])
    _run_and_record(stats_path, argv, via_litgpt=via_litgpt)


def _time_calls(spec: str, least_s: float = 0.05, profile_dir: str | None = None) -> None:
    """Each ``module:function`` (or ``module:Class.method``) of ``spec`` (comma-separated) replaced by a wrapper that
    prints ``bench-timer: module:function S s`` after every call of at least ``least_s`` seconds (a module attribute:
    set it before lit-liger patches the recipe's module, or on a function called through its module); with
    ``profile_dir``, each call also runs under cProfile, its stats written there as ``function-N.pstats`` (N: the
    call's number, from 1)."""
    import cProfile
    import functools
    import importlib

    for item in filter(None, spec.split(",")):
        mod_name, _, path = item.partition(":")
        owner = importlib.import_module(mod_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        real = getattr(owner, name)

        def timed(*args: Any, _real=real, _item=item, _calls=[0], **kwargs: Any) -> Any:  # noqa: B006 - a counter
            _calls[0] += 1
            prof = cProfile.Profile() if profile_dir else None
            t0 = time.perf_counter()
            try:
                if prof is None:
                    return _real(*args, **kwargs)
                return prof.runcall(_real, *args, **kwargs)
            finally:
                if time.perf_counter() - t0 >= least_s:
                    print(f"bench-timer: {_item} {time.perf_counter() - t0:.3f} s", flush=True)
                if prof is not None:
                    prof.dump_stats(str(Path(profile_dir) / f"{_item.rpartition(':')[2]}-{_calls[0]}.pstats"))

        setattr(owner, name, functools.wraps(real)(timed))


def _profile_fit(path: str) -> None:
    """``cProfile`` on during the training loop of a ``lit-liger`` command (what ``lit_liger.runtime.profiling.iterations``
    wraps: litgpt's ``fit``), its stats written to ``path`` (one process)."""
    import contextlib
    import cProfile

    from lit_liger.runtime import profiling

    real = profiling.iterations

    @contextlib.contextmanager
    def profiled(*args: Any, **kwargs: Any):
        prof = cProfile.Profile()
        with real(*args, **kwargs):
            prof.enable()
            try:
                yield
            finally:
                prof.disable()
                prof.dump_stats(path)

    profiling.iterations = profiled


#: what a real card's CUDA context, NCCL's buffers and the libraries' workspaces hold outside PyTorch's allocator, left
#: out of an emulated card's allocator cap (:func:`_cap_device`)
OUTSIDE_ALLOCATOR_GIB = 2.0


def _cap_device(gib: float) -> None:
    """Run this process as on a card of ``gib`` GiB (memory only; the speed stays the real card's): PyTorch's
    allocator capped at ``gib`` less :data:`OUTSIDE_ALLOCATOR_GIB` (an allocation past it raises out of memory, as on
    that card), and lit-liger's memory plans (``lit_liger.runtime.memplan``, the data-parallel plan's choice) told the card has
    ``gib``. An H100 80GB reports 79.19 GiB. The process's device is ``LOCAL_RANK``'s (every rank of a run runs this)."""
    import torch

    from lit_liger.runtime import memplan

    index = int(os.environ.get("LOCAL_RANK", "0"))
    total = torch.cuda.get_device_properties(index).total_memory
    cap = int(gib * 2**30)
    if cap >= total:
        return
    torch.cuda.set_per_process_memory_fraction((cap - OUTSIDE_ALLOCATOR_GIB * 2**30) / total, index)
    memplan._TOTAL[index] = cap
    print(f"benchmarks: device {index} run as a {gib:g} GiB card (allocator capped at "
          f"{gib - OUTSIDE_ALLOCATOR_GIB:g} GiB of its {total / 2**30:.1f})", flush=True)


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
COLUMNS = ["method", "liger", "GPUs", "layers", "B", "T", "steps", "tok/s", "x stock tok/s", "peak GB", "x stock mem",
           "run peak GB", "loss@1", "loss@1 vs stock", "max step loss diff", "final loss", "target", "status"]


def _table_rows(result: dict) -> list[list[Any]]:
    return [[r["method"], r["liger"], r.get("devices", 1), r.get("n_layer"), r.get("B"), r.get("T"), r.get("steps"),
             r.get("tokens_per_s"), r.get("speedup_vs_stock"), r.get("peak_memory_gb"), r.get("memory_vs_stock"),
             r.get("peak_memory_run_gb"), r.get("first_loss"), r.get("first_loss_rel_diff"),
             r.get("max_step_loss_rel_diff"), r.get("final_loss"), r.get("target", "-"), r["status"]]
            for r in result["rows"]]


def _target(method: str, speedup: float | None, mem: float | None, devices: int = 1) -> str:
    t = (MULTI_GPU_TARGETS if devices > 1 else TARGETS).get(method)
    if not t or speedup is None:
        return "-"
    ok_speed = speedup >= t["tok_per_s"]
    ok_mem = mem is not None and mem <= t["memory"]
    text = f"tok/s >= {t['tok_per_s']}x: {'met' if ok_speed else 'missed'}; "
    text += f"mem <= {t['memory']}x: {'met' if ok_mem else 'missed' if mem is not None else 'n/a'}"
    return text


def _compare_larger_batch(row: dict, stock: dict) -> None:
    """A --liger true run at a larger micro-batch vs stock at the main one: issue 6's other way to meet its
    target is a micro-batch at least twice as large at equal (or lower) peak memory per GPU."""
    if stock.get("tokens_per_s") and row.get("tokens_per_s"):
        row["speedup_vs_stock"] = row["tokens_per_s"] / stock["tokens_per_s"]
    if row.get("peak_memory_gb") and stock.get("peak_memory_gb"):
        row["memory_vs_stock"] = row["peak_memory_gb"] / stock["peak_memory_gb"]
        ratio = row["B"] / stock["B"]
        ok = ratio >= 2 and row["memory_vs_stock"] <= 1.0
        row["target"] = (f"{C.fmt(ratio)}x micro-batch of stock's B={stock['B']} at {C.fmt(row['memory_vs_stock'])}x "
                         f"its memory: {'met' if ok else 'missed'} (>= 2x at <= 1x)")


def render(result: dict, out_dir: Path) -> list[Path]:
    env, s = result["environment"], result["settings"]
    md = [
        f"# Finetune benchmark: {env['device']}, {env['date']}",
        "",
        f"`lit-liger finetune_<method> --liger false` (stock litgpt) vs `--liger true`; torch {env['torch']}, "
        f"triton {env['triton']}, litgpt {env['litgpt']}, lit-liger {env['lit_liger']} "
        f"({env.get('lit_liger_commit')})" + (" — SMOKE RUN (tiny, not a measurement)" if result.get("smoke") else ""),
        "",
        (f"Model: {s['model']} shape, {result['inputs'].get('n_layer')} layers, random init "
         f"({C.fmt(result['inputs'].get('n_params', 0) / 1e6)} M parameters, lm_head "
         f"{result['inputs'].get('padded_vocab_size')} rows); {s['precision']}; micro-batch {s['micro_batch_size']}"
         f"{' (and ' + str(s['also_micro_batch']) + ')' if s.get('also_micro_batch') else ''} x "
         f"max_seq_length {s['max_seq_length']}, one optimizer step per micro-batch, {s['steps']} steps; data: "
         f"{result['inputs'].get('n_samples')} stdlib instruction samples "
         f"({'up to 1.5k' if result.get('smoke') else '8k-40k'} characters each)."),
        "",
        (f"tok/s = litgpt's logged `tokens` (prompt + response, no padding) / summed `iter_time` over steps "
         f"{s['warmup'] + 1}-{s['steps']}; peak GB = `max_memory_allocated` of the training steps (reset after "
         "the 'Verifying settings' validation); run peak GB = the whole run's."),
        *([f"{s.get('devices', 1)} GPUs per run (litgpt's own strategy for the script: FSDP for full and pretrain, "
           "ModelParallel/FSDP2 for lora); tok/s and peak GB are rank 0's, i.e. per GPU. 'max step loss diff': "
           "largest relative difference of any logged step's loss from --liger false's (target <= 1%).", ""]
          if s.get("devices", 1) > 1 else []),
        C.markdown_table(COLUMNS, _table_rows(result)),
        "",
    ]
    notes = [f"- {m}: {t['tok_per_s']}x tokens/s at <= {t['memory']}x peak memory" for m, t in TARGETS.items()]
    md += ["Targets (issue 7, H100, Llama-3.2-1B):", *notes, ""]
    if s.get("devices", 1) > 1:
        multi = [f"- {m}: >= {t['tok_per_s']}x tokens/s at <= {t['memory']}x peak memory per GPU, or a micro-batch "
                 "at least twice as large at equal memory" for m, t in MULTI_GPU_TARGETS.items()]
        md += ["Targets (issue 6, 2 x H200, Llama-3.1-8B shape):", *multi, ""]
    md += ["## Commands", ""]
    if result.get("argv") is not None:
        md += ["This benchmark:", "", "```", f"{C.PROG} finetune " + " ".join(result["argv"]), "```", ""]
    md += ["Each run (the checkpoint and data are generated under the work folder first):", "", "```",
           *[r["command"] for r in result["rows"] if r.get("command")], "```", ""]
    path = out_dir / "finetune.md"
    path.write_text("\n".join(md))
    written = [path]
    tput, mem = {}, {}
    for r in result["rows"]:
        if r["status"] == "ok":
            panel = f"finetune_{r['method']}"
            label = f"--liger {r['liger']}" + (f" B={r['B']}" if r.get("B") != s["micro_batch_size"] else "")
            tput.setdefault(panel, {})[label] = r["tokens_per_s"]
            if r.get("peak_memory_gb") is not None:
                mem.setdefault(panel, {})[label] = r["peak_memory_gb"]
    title = f"{env['device']} — lit-liger finetune, {s['model']} {result['inputs'].get('n_layer')}L, {s['precision']}"
    return written + C.throughput_memory_charts(out_dir, "finetune", tput, mem, title=title, mem_unit="GB")


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{C.PROG} finetune", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Llama-3.2-1B", help="LitGPT config name whose shape the checkpoint takes")
    p.add_argument("--n_layer", type=int, default=None, help="layers (default: the model's full depth; smoke 2)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--devices", type=int, default=1, help="GPUs per run (stock: litgpt's FSDP / ModelParallel strategies; lit-liger: "
                   "its automatic data-parallel plan, --liger_args '--liger.data_parallel litgpt' for litgpt's)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 30; smoke 2)")
    p.add_argument("--warmup", type=int, default=None,
                   help="first steps left out of tokens/s (default 3; smoke 1)")
    p.add_argument("--micro_batch_size", type=int, default=None, help="samples per step (default 4; smoke 1)")
    p.add_argument("--max_seq_length", type=int, default=None, help="tokens per sample (default 2048; smoke 16)")
    p.add_argument("--also_micro_batch", type=int, default=None,
                   help="then run stock and lit-liger again at this micro-batch (e.g. 2x: does lit-liger fit twice "
                        "the batch in stock's memory?); compared with stock at --micro_batch_size")
    p.add_argument("--precision", default=None, help="Lightning precision (default bf16-true on a GPU, else 32-true)")
    p.add_argument("--liger_args", default="", help="more lit-liger settings for the --liger true runs, e.g. "
                   "'--liger.fp8 tensorwise --liger.fp8_all_gather false'")
    p.add_argument("--work_dir", type=Path, default=WORK_DIR,
                   help=f"checkpoint, data and the runs' folders (default {WORK_DIR}); reused when there")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/<device>-<date>/)")
    p.add_argument("--smoke", action="store_true", help="harness test: tiny model, 2 steps (CPU: Triton interpreter)")
    p.add_argument("--in_process", action="store_true",
                   help="run the finetunes in this process instead of fresh ones (tests; peak memory is shared)")
    return p


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--child"], ["--child-litgpt"]):  # python -m benchmarks.finetune --child STATS_JSON <args...>
        os.environ[_STATS_ENV] = argv[1]
        _child(argv[1], argv[2:], via_litgpt=argv[0] == "--child-litgpt")
        return {}
    if os.environ.get(_STATS_ENV) and argv[:1] and not argv[0].startswith("-"):
        # Lightning's launcher re-runs this module with the lit-liger arguments in ranks > 0
        _child(f"{os.environ[_STATS_ENV]}.rank{os.environ.get('LOCAL_RANK', '?')}", argv)
        return {}
    opts = build_parser().parse_args(argv)
    methods = [m.strip() for m in opts.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        raise SystemExit(f"unknown method(s) {bad}; choose from {list(METHODS)}")
    smoke = opts.smoke
    if not C.CUDA and not smoke:
        print("# no CUDA GPU: running the --smoke sizes (the Triton interpreter shows parity, not speed)", flush=True)
        smoke = True
    from litgpt import Config

    n_layer = opts.n_layer or (2 if smoke else Config.from_name(opts.model).n_layer)
    steps = opts.steps or (2 if smoke else 30)
    warmup = min(steps - 1, opts.warmup if opts.warmup is not None else (1 if smoke else 3))
    B = opts.micro_batch_size or (1 if smoke else 4)
    T = opts.max_seq_length or (16 if smoke else 2048)
    precision = opts.precision or ("bf16-true" if C.CUDA else "32-true")
    out_dir = opts.out or C.default_out_dir(smoke)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = opts.work_dir

    env = C.environment()
    print(f"# lit-liger finetune benchmark on {env['device']} -> {out_dir} (work files: {work})", flush=True)
    t0 = time.perf_counter()
    n_samples = max(64, (steps + 2) * B * 2) if smoke else max(200, 2 * steps * B)
    ckpt, data_path, inputs = build_inputs(work, opts.model, n_layer, smoke=smoke, n_samples=n_samples,
                                           max_seq_length=T)
    inputs["build_s"] = time.perf_counter() - t0
    print(f"# inputs: {ckpt} ({C.fmt(inputs['n_params'] / 1e6)} M parameters), {data_path} "
          f"({inputs['n_samples']} samples), {inputs['build_s']:.1f} s", flush=True)
    result: dict[str, Any] = {
        "kind": "finetune", "environment": env, "smoke": smoke, "inputs": inputs, "rows": [], "argv": argv,
        "settings": {"model": opts.model, "methods": methods, "steps": steps, "warmup": warmup,
                     "micro_batch_size": B, "also_micro_batch": opts.also_micro_batch, "max_seq_length": T, "precision": precision, "devices": opts.devices,
                     "liger_args": opts.liger_args,
                     "in_process": opts.in_process},
        "targets": TARGETS,
    }
    json_path = out_dir / "finetune.json"
    print("  ".join(COLUMNS), flush=True)
    runs = [(False, B), (True, B)] + ([(False, opts.also_micro_batch), (True, opts.also_micro_batch)]
                                      if opts.also_micro_batch and opts.also_micro_batch != B else [])
    for method in methods:
        stock = None
        for liger, b in runs:
            run_dir = work / "runs" / (f"{method}-liger-{str(liger).lower()}" + (f"-B{b}" if b != B else ""))
            args = command(method, ckpt, data_path, run_dir, precision, b, T, steps, liger, opts.devices,
                           opts.liger_args)
            row: dict[str, Any] = {"method": method, "liger": str(liger).lower(), "devices": opts.devices,
                                   "n_layer": n_layer, "B": b, "T": T,
                                   "steps": steps, "command": "lit-liger " + " ".join(args), "run_dir": str(run_dir)}
            try:
                res = run_one(args, run_dir, warmup=warmup, in_process=opts.in_process)
                row["status"] = "ok"
            except Exception as exc:  # noqa: BLE001 - a failed run (OOM included) is recorded, the others go on
                res, row["status"] = None, C.failure_status(exc)
            if res:
                losses = res["losses"]
                row.update(res, first_loss=losses[0] if losses else None, final_loss=losses[-1] if losses else None)
                if b != B:  # --also_micro_batch: memory and speed against stock at the main micro-batch
                    if stock is not None and stock["status"] == "ok" and liger:
                        _compare_larger_batch(row, stock)
                elif not liger:
                    stock = row
                elif stock is not None and stock["status"] == "ok":
                    if stock["tokens_per_s"]:
                        row["speedup_vs_stock"] = row["tokens_per_s"] / stock["tokens_per_s"]
                    if row.get("peak_memory_gb") and stock.get("peak_memory_gb"):
                        row["memory_vs_stock"] = row["peak_memory_gb"] / stock["peak_memory_gb"]
                    a, b = row["first_loss"], stock["first_loss"]
                    if a is not None and b is not None:
                        row["first_loss_rel_diff"] = abs(a - b) / max(abs(b), 1e-12)
                        if not math.isfinite(a) or row["first_loss_rel_diff"] > LOSS_RTOL.get(precision, 2e-2):
                            row["status"] = f"LOSS MISMATCH ({a:.4f} vs stock {b:.4f})"
                    pairs = list(zip(losses, stock["losses"]))
                    if pairs:
                        row["max_step_loss_rel_diff"] = max(abs(x - y) / max(abs(y), 1e-12) for x, y in pairs)
                        if opts.devices > 1 and row["max_step_loss_rel_diff"] > TRACK_RTOL and row["status"] == "ok":
                            row["status"] = f"LOSS DRIFT (max {row['max_step_loss_rel_diff']:.2%} > 1%)"
                    if not smoke:
                        row["target"] = _target(method, row.get("speedup_vs_stock"), row.get("memory_vs_stock"), opts.devices)
                _keep_logs(run_dir, out_dir / "finetune_logs" / run_dir.name)
            C.free_memory()
            result["rows"].append(row)
            C.write_json(json_path, result)  # after every run: a benchmark cut short keeps its numbers
            print("  ".join(C.fmt(v) for v in _table_rows({"rows": [row]})[0]), flush=True)

    print()
    print(C.text_table(COLUMNS, _table_rows(result)))
    C.write_json(json_path, result)
    written = [json_path] + render(result, out_dir)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return result


def _keep_logs(run_dir: Path, dest: Path) -> None:
    """The run's own evidence beside the results (small text files): its stdout and metrics.csv."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in [run_dir / "stdout.txt", run_dir / "lit_liger_stats.json", *sorted(run_dir.glob("logs/csv/version_*/metrics.csv"))[-1:]]:
        if src.is_file():
            shutil.copy(src, dest / src.name)


if __name__ == "__main__":
    main(sys.argv[1:])
