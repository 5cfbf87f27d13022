"""Scaling run (issue 8): ``lit-liger finetune_full`` with FSDP on 2, 4 and 8 GPUs, ``--liger`` off vs on (lit-liger's
runs take its automatic data-parallel plan since issue 46: a replica per GPU where the model fits one, else litgpt's
FSDP; ``lit_liger.parallel.dataparallel``).

    python -m benchmarks scaling [--devices 2,4,8] [--model Llama-3.1-8B] [--seq 4096] [--steps 8]
                                 [--batches 1,2,4,8,16,32] [--contexts 4096,8192,16384,32768,65536,131072]
                                 [--out DIR] [--smoke]

For every device count (those above the machine's GPU count are skipped and listed) and both
settings of ``--liger``:

1. the largest micro-batch that fits at ``--seq`` tokens: ``--batches`` are tried in increasing order
   (each a full run of ``--steps`` steps) until one fails; the largest that ran gives tokens/s per GPU
   and peak memory per GPU;
2. the largest context length that fits at micro-batch 1: ``--contexts`` in increasing order, 2 steps
   each, on samples long enough to fill them (Python's standard-library sources concatenated).

Then per variant: tokens/s per GPU (liger vs stock), scaling efficiency from the smallest to the
largest device count (tokens/s per GPU there / tokens/s per GPU at the smallest), and the context
ratio. Every run is one ``python -m benchmarks.finetune --child ...`` process (see
:mod:`benchmarks.finetune`), its command line recorded. Results: ``scaling.json``, ``scaling.md``.

Targets (issue 8, 8 x H200): >= 1.25x tokens/s per GPU, >= 2x the trainable context, and a scaling
efficiency no worse than ``--liger false``'s.
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from . import finetune as F


def long_samples_dataset(path: Path, n: int, min_chars: int) -> int:
    """litgpt JSON instruction data whose outputs each hold >= ``min_chars`` characters of Python source
    (standard-library files concatenated in path order), so a run at a long context is filled."""
    from lit_liger.demo import source_files

    files, rows, buf, i = source_files(), [], [], 0
    while len(rows) < n and files:
        buf.append(files[i % len(files)].read_text(encoding="utf-8", errors="replace"))
        i += 1
        if sum(map(len, buf)) >= min_chars:
            rows.append({"instruction": "Continue this Python source.", "input": "", "output": "\n".join(buf)})
            buf = []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows), encoding="utf-8")
    return len(rows)


def _run(args: list[str], run_dir: Path, warmup: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        res = F.run_one(args, run_dir, warmup=warmup)
        res["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - an OOM ends the search; it is recorded
        res = {"status": C.failure_status(exc)}
    res["command"] = "lit-liger " + " ".join(args)
    res["process_s"] = time.perf_counter() - t0
    C.free_memory()
    return res


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"{C.PROG} scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="2,4,8")
    p.add_argument("--model", default="Llama-3.1-8B")
    p.add_argument("--n_layer", type=int, default=None, help="layers (default: the model's; smoke 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sample for the micro-batch search (default 4096)")
    p.add_argument("--steps", type=int, default=None, help="steps per throughput run (default 8; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="steps left out of tokens/s (default 3; smoke 1)")
    p.add_argument("--batches", default=None, help="micro-batches to try (default 1,2,4,8,16,32)")
    p.add_argument("--contexts", default=None, help="context lengths to try at micro-batch 1 (default 4096..131072)")
    p.add_argument("--work_dir", type=Path, default=F.WORK_DIR)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="harness test: tiny model, 1 device, CPU allowed")
    a = p.parse_args(argv)
    smoke = a.smoke or not C.CUDA
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    devices = [1] if smoke else ints(a.devices)
    batches = ints(a.batches or ("1,2" if smoke else "1,2,4,8,16,32"))
    contexts = ints(a.contexts or ("16,32" if smoke else "4096,8192,16384,32768,65536,131072"))
    seq = a.seq or (16 if smoke else 4096)
    steps = a.steps or (2 if smoke else 8)
    warmup = min(steps - 1, a.warmup if a.warmup is not None else (1 if smoke else 3))
    precision = "bf16-true" if C.CUDA else "32-true"
    out = a.out or C.default_out_dir(smoke)
    out.mkdir(parents=True, exist_ok=True)
    from litgpt import Config

    n_layer = a.n_layer or (2 if smoke else Config.from_name(a.model).n_layer)
    have = torch.cuda.device_count() if C.CUDA else 1
    skipped = [n for n in devices if n > have]
    devices = [n for n in devices if n <= have]
    env = C.environment()
    print(f"# scaling on {env['device']} x{have}: devices {devices} (skipped, not on this machine: {skipped})",
          flush=True)
    ckpt, data_path, inputs = F.build_inputs(a.work_dir, a.model, n_layer, smoke=smoke,
                                            n_samples=max(200, 2 * steps * max(batches) * max(devices)),
                                            max_seq_length=max([seq, *contexts]))
    long_path = a.work_dir / "data" / f"long-{max(contexts)}.json"
    if not long_path.is_file():
        long_samples_dataset(long_path, n=16 * max(devices), min_chars=5 * max(contexts))
    result: dict[str, Any] = {"kind": "scaling", "environment": env, "smoke": smoke, "inputs": inputs,
                              "settings": {"devices": devices, "skipped_devices": skipped, "model": a.model,
                                           "n_layer": n_layer, "seq": seq, "steps": steps, "warmup": warmup,
                                           "batches": batches, "contexts": contexts, "precision": precision},
                              "runs": [], "summary": []}
    json_path = out / "scaling.json"
    for n in devices:
        for liger in (False, True):
            name = f"{n}gpu-liger-{str(liger).lower()}"
            best = None
            for B in batches:
                args = F.command("full", ckpt, data_path, a.work_dir / "runs" / f"scaling-{name}-B{B}", precision,
                                 B, seq, steps, liger, n)
                r = _run(args, a.work_dir / "runs" / f"scaling-{name}-B{B}", warmup)
                r.update(kind="batch", devices=n, liger=liger, B=B, T=seq)
                result["runs"].append(r)
                C.write_json(json_path, result)
                print(f"# {name} B={B} T={seq}: {r['status']} {C.fmt(r.get('tokens_per_s'))} tok/s/GPU "
                      f"{C.fmt(r.get('peak_memory_gb'))} GB", flush=True)
                if r["status"] != "ok":
                    break
                best = r
            max_ctx = None
            for T in contexts:
                args = F.command("full", ckpt, long_path, a.work_dir / "runs" / f"scaling-{name}-T{T}", precision,
                                 1, T, 2, liger, n)
                r = _run(args, a.work_dir / "runs" / f"scaling-{name}-T{T}", 0)
                r.update(kind="context", devices=n, liger=liger, B=1, T=T)
                result["runs"].append(r)
                C.write_json(json_path, result)
                print(f"# {name} B=1 T={T}: {r['status']} {C.fmt(r.get('peak_memory_gb'))} GB", flush=True)
                if r["status"] != "ok":
                    break
                max_ctx = T
            result["summary"].append({
                "devices": n, "liger": liger, "max_micro_batch": best["B"] if best else None,
                "tokens_per_s_per_gpu": best.get("tokens_per_s") if best else None,
                "peak_memory_gb": best.get("peak_memory_gb") if best else None, "max_context_b1": max_ctx,
            })
    _derive(result)
    C.write_json(json_path, result)
    md = render(result, out)
    print(md)
    return result


def _derive(result: dict) -> None:
    rows = result["summary"]
    by = {(r["devices"], r["liger"]): r for r in rows}
    devs = sorted({r["devices"] for r in rows})
    for r in rows:
        stock = by.get((r["devices"], False))
        if r["liger"] and stock:
            if r["tokens_per_s_per_gpu"] and stock["tokens_per_s_per_gpu"]:
                r["x_tokens_per_s"] = r["tokens_per_s_per_gpu"] / stock["tokens_per_s_per_gpu"]
            if r["max_context_b1"] and stock["max_context_b1"]:
                r["x_context"] = r["max_context_b1"] / stock["max_context_b1"]
        first = by.get((devs[0], r["liger"]))
        if first and first["tokens_per_s_per_gpu"] and r["tokens_per_s_per_gpu"]:
            r["scaling_efficiency"] = r["tokens_per_s_per_gpu"] / first["tokens_per_s_per_gpu"]


COLUMNS = ["GPUs", "liger", "max micro-batch", "tok/s per GPU", "x stock tok/s", "peak GB per GPU",
           "max context (B=1)", "x stock context", "scaling eff. vs fewest GPUs"]


def render(result: dict, out: Path) -> str:
    env, s = result["environment"], result["settings"]
    rows = [[r["devices"], str(r["liger"]).lower(), r["max_micro_batch"], r["tokens_per_s_per_gpu"],
             r.get("x_tokens_per_s"), r["peak_memory_gb"], r["max_context_b1"], r.get("x_context"),
             r.get("scaling_efficiency")] for r in result["summary"]]
    md = "\n".join([
        f"# Scaling: lit-liger finetune_full (FSDP), {env['device']}, {env['date']}"
        + (" — SMOKE RUN (tiny, not a measurement)" if result.get("smoke") else ""), "",
        f"{s['model']} shape ({s['n_layer']} layers), {s['precision']}, {s['steps']} steps per throughput run "
        f"(first {s['warmup']} left out), sequence {s['seq']}; micro-batches tried {s['batches']}, contexts tried "
        f"{s['contexts']}; device counts {s['devices']} (not on this machine: {s['skipped_devices'] or 'none'}). "
        f"torch {env['torch']}, lit-liger {env['lit_liger']} ({env.get('lit_liger_commit')}).", "",
        C.markdown_table(COLUMNS, rows), "",
        "Every run's command line, status and numbers: `scaling.json` (`runs`).", "",
    ])
    (out / "scaling.md").write_text(md)
    return md


if __name__ == "__main__":
    main(sys.argv[1:])
