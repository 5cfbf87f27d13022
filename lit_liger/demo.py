"""``lit-liger demo``: an offline A/B run of ``litgpt finetune_lora`` with and without lit-liger.

Everything is made on the spot from what the machine already has, so it runs on a fresh box with
no network:

1. a byte-level BPE tokenizer (``tokenizers``) trained on Python's standard-library sources,
   written as ``tokenizer.json`` + ``tokenizer_config.json`` the way ``litgpt.Tokenizer`` reads them;
2. a random-init LitGPT checkpoint (``lit_model.pth`` + ``model_config.yaml``) with a real
   LitGPT config's shape (``--model``, default Llama-3.2-1B) cut to a few layers. On a GPU the
   lm_head keeps the model's real padded vocabulary (128256 rows for Llama-3.2), so the loss costs
   what it costs in the real model; on CPU everything is tiny;
3. an instruction dataset in litgpt's JSON format: "write the standard-library function X"
   -> its source;
4. ``lit-liger finetune_lora`` run twice in fresh processes, ``--liger false`` then ``--liger true``,
   same seed and data; then a table of tokens/s, peak memory, final loss and the loss difference.

Without a GPU the kernels cannot show speed: the demo says so and runs both at a tiny size with
``TRITON_INTERPRET=1`` (the Triton kernels run in Triton's CPU interpreter), which makes it a
parity check of the full training loop, not a benchmark.

:class:`LocalText` (a pretraining data module over local text files) and the builders here are
also what the tests use.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from litgpt.data import DataModule

__all__ = [
    "LocalText",
    "demo",
    "finetune_command",
    "make_checkpoint",
    "make_instruction_dataset",
    "read_metrics",
    "source_files",
    "tiny_overrides",
    "train_tokenizer",
]

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


# ----------------------------------------------------------------------------------------------
# Builders (offline)
# ----------------------------------------------------------------------------------------------
def source_files(limit: int | None = None) -> list[Path]:
    """Python sources this machine has: the standard library (tests excluded), else torch's own.

    Sorted, so every machine with the same Python builds the same tokenizer and dataset.
    """
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(torch.__file__).parent]
    for root in roots:
        files = sorted(
            p
            for p in root.rglob("*.py")
            if not ({"test", "tests", "site-packages", "idlelib"} & set(p.relative_to(root).parts))
        )
        if files:
            return files[:limit] if limit else files
    raise FileNotFoundError("found no Python sources to train a tokenizer on (standard library or torch)")


def train_tokenizer(out_dir: Path, vocab_size: int, files: list[Path]) -> int:
    """Train a byte-level BPE on ``files``; write ``tokenizer.json`` + ``tokenizer_config.json``.

    Returns the vocabulary size (``<= vocab_size``: BPE stops early on a small corpus).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no unknown tokens
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    # what litgpt.Tokenizer reads: bos/eos names, whether to prepend bos, and a tokenizer_class
    cfg = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return tok.get_vocab_size()


def tiny_overrides(n_embd: int = 64, n_head: int = 4, n_query_groups: int = 2) -> dict[str, Any]:
    """Config overrides that shrink a LitGPT config's widths for CPU runs (families keep their flags)."""
    return {
        "n_embd": n_embd,
        "n_head": n_head,
        "n_query_groups": n_query_groups,
        "head_size": n_embd // n_head,
        "intermediate_size": int(n_embd * 2.75),
    }


def make_checkpoint(
    checkpoint_dir: Path,
    model_name: str,
    vocab_size: int,
    padded_vocab_size: int | None = None,
    seed: int = 1234,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    tied_head: bool = False,
    **overrides: Any,
) -> Any:
    """A random-init LitGPT checkpoint: ``lit_model.pth`` + ``model_config.yaml``.

    ``model_name`` is a LitGPT config name; ``overrides`` change its fields (``n_layer``, widths,
    ``block_size``). The tokenizer files must be written to ``checkpoint_dir`` separately.
    ``device``/``dtype``: where the random init runs and the dtype saved (an 8B model inits in
    seconds on a GPU, minutes on a CPU). ``tied_head``: ``lm_head.weight`` is the embedding, as litgpt's
    conversion writes a Hugging Face checkpoint with tied embeddings (Llama-3.2-1B/3B, Qwen2.5 up to 3B ...).
    Returns the ``litgpt.Config``.
    """
    from litgpt import GPT, Config
    from litgpt.utils import save_config

    padded = padded_vocab_size or vocab_size
    config = Config.from_name(model_name, vocab_size=vocab_size, padded_vocab_size=max(padded, vocab_size), **overrides)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = GPT(config)
    if dtype is not None:
        model = model.to(dtype)
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    if tied_head:
        state["lm_head.weight"] = state["transformer.wte.weight"]  # (litgpt's convert_hf_checkpoint does the same)
    torch.save(state, checkpoint_dir / "lit_model.pth")
    del model
    save_config(config, checkpoint_dir)
    return config


def make_instruction_dataset(path: Path, files: list[Path], n: int, min_chars: int = 0, max_chars: int = 6000) -> int:
    """litgpt JSON instruction data: "write the function/class X of module Y" -> its source.

    Entries come from the ``ast`` of ``files`` (definitions with a docstring, ``min_chars`` to
    ``max_chars`` of source). Returns the number of entries written.
    """
    rows: list[dict[str, str]] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = f.stem
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            doc = ast.get_docstring(node)
            src = ast.get_source_segment(text, node)
            if not doc or not src or not (min_chars <= len(src) <= max_chars):
                continue
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            rows.append(
                {
                    "instruction": f"Write the {kind} `{node.name}` of Python's `{module}` module.",
                    "input": doc.strip().split("\n\n")[0],
                    "output": src,
                }
            )
            if len(rows) >= n:
                break
        if len(rows) >= n:
            break
    if not rows:
        raise RuntimeError(f"no definitions of {min_chars}-{max_chars} characters found in {len(files)} files")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return len(rows)


@dataclass
class LocalText(DataModule):
    """Pretraining data from local text files, tokenized in memory (no download, no ``litdata``).

    For demos and tests: ``lit-liger pretrain ... --data lit_liger.demo.LocalText
    --data.text_dir DIR --tokenizer_dir CHECKPOINT``. The files' tokens are concatenated and cut
    into blocks of ``max_seq_length + 1`` (inputs and shifted targets), as litgpt's pretraining
    data modules yield them.
    """

    text_dir: Path | None = None
    """Folder of text files (``glob``). Default: Python's standard-library sources."""
    glob: str = "**/*.py"
    """Which files of ``text_dir`` to read."""
    max_files: int = 20
    """Read at most this many files (sorted by path)."""
    val_fraction: float = 0.1
    """Fraction of the blocks held out for validation."""

    tokenizer: Any = field(default=None, init=False, repr=False)
    batch_size: int = field(default=1, init=False, repr=False)
    max_seq_length: int = field(default=-1, init=False, repr=False)

    def connect(self, tokenizer: Any = None, batch_size: int = 1, max_seq_length: int | None = None) -> None:
        if tokenizer is None:
            raise ValueError(
                "LocalText needs a tokenizer: pass `--tokenizer_dir` (a checkpoint dir with tokenizer files)"
            )
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.max_seq_length = max_seq_length if max_seq_length is not None else 256

    def setup(self, stage: str = "") -> None:
        files = sorted(Path(self.text_dir).glob(self.glob)) if self.text_dir else source_files()
        ids: list[torch.Tensor] = [
            self.tokenizer.encode(f.read_text(encoding="utf-8", errors="replace"), eos=True)
            for f in files[: self.max_files]
        ]
        flat = torch.cat(ids)
        block = self.max_seq_length + 1
        n = flat.numel() // block
        if n < 2:
            raise ValueError(f"LocalText: {flat.numel()} tokens make fewer than 2 blocks of {block}; add files")
        blocks = flat[: n * block].view(n, block)
        n_val = max(1, int(n * self.val_fraction))
        self._train, self._val = blocks[n_val:], blocks[:n_val]

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            self._train, batch_size=self.batch_size, shuffle=True, generator=torch.Generator().manual_seed(42)
        )

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self._val, batch_size=self.batch_size)


# ----------------------------------------------------------------------------------------------
# Reading a run's numbers back
# ----------------------------------------------------------------------------------------------
def read_metrics(out_dir: Path) -> list[dict[str, float]]:
    """Rows of the CSV logger's ``metrics.csv`` under ``out_dir/logs`` that carry a training loss."""
    paths = sorted(Path(out_dir).glob("logs/csv/version_*/metrics.csv"))
    if not paths:
        raise FileNotFoundError(f"no logs/csv/version_*/metrics.csv under {out_dir}")
    with open(paths[-1], newline="", encoding="utf-8") as fp:
        rows = [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(fp)]
    return [r for r in rows if "loss" in r]


def _summarize(out_dir: Path, stats_path: Path, warmup: int) -> dict[str, Any]:
    rows = read_metrics(out_dir)
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    timed = rows[warmup:] if len(rows) > warmup else rows
    prev = [0.0] + [r["tokens"] for r in rows]
    tokens = [rows[i]["tokens"] - prev[i] for i in range(len(rows))][len(rows) - len(timed) :]
    seconds = sum(r["iter_time"] for r in timed)
    return {
        "losses": [r["loss"] for r in rows],
        "tokens_per_s": sum(tokens) / seconds if seconds > 0 else float("nan"),
        "peak_memory_gb": stats["peak_memory_bytes"] / 1e9 if stats.get("peak_memory_bytes") else None,
        "peak_reserved_gb": stats["peak_reserved_bytes"] / 1e9 if stats.get("peak_reserved_bytes") else None,
        "peak_memory_run_gb": stats["peak_memory_run_bytes"] / 1e9 if stats.get("peak_memory_run_bytes") else None,
        "wall_s": stats.get("wall_s"),
    }


# ----------------------------------------------------------------------------------------------
# The demo
# ----------------------------------------------------------------------------------------------
def demo(
    out_dir: Path = Path("out/lit-liger-demo"),
    model: str = "Llama-3.2-1B",
    n_layer: int | None = None,
    steps: int | None = None,
    micro_batch_size: int | None = None,
    max_seq_length: int | None = None,
    precision: str | None = None,
    device: Literal["auto", "cuda", "cpu"] = "auto",
) -> dict[str, Any]:
    """Offline A/B run of ``finetune_lora`` with ``--liger false`` and ``--liger true``.

    Builds a tokenizer, a random-init checkpoint shaped like ``model`` (a LitGPT config name) and an
    instruction dataset from Python's standard library, trains LoRA twice in fresh processes and
    prints tokens/s, peak memory, final loss and the loss difference side by side.

    Args:
        out_dir: Where the checkpoint, data and both runs go.
        model: LitGPT config name whose shape the random checkpoint takes.
        n_layer: Layers to keep (default: 4 on a GPU, 2 on CPU).
        steps: Optimizer steps per run (default: 30 on a GPU, 3 on CPU).
        micro_batch_size: Samples per step (default: 4 on a GPU, 2 on CPU).
        max_seq_length: Tokens per sample (default: 1024 on a GPU, 32 on CPU).
        precision: Lightning precision (default: bf16-true on a GPU, 32-true on CPU).
        device: ``cuda``, ``cpu`` or ``auto`` (a GPU when there is one).
    """
    on_gpu = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no GPU")
    n_layer = n_layer or (4 if on_gpu else 2)
    steps = steps or (30 if on_gpu else 3)
    micro_batch_size = micro_batch_size or (4 if on_gpu else 2)
    max_seq_length = max_seq_length or (1024 if on_gpu else 32)
    precision = precision or ("bf16-true" if on_gpu else "32-true")
    out_dir = Path(out_dir)
    env = dict(os.environ)
    if not on_gpu:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        print(
            "lit-liger demo: no GPU, so no speed to show: lit-liger's kernels need a CUDA/ROCm GPU to be fast.\n"
            "Running a tiny parity check instead: the same LoRA finetune with --liger false and --liger true,\n"
            "the Triton kernels executing in Triton's CPU interpreter (TRITON_INTERPRET=1). Timings below are\n"
            "the interpreter's, not performance.\n",
            flush=True,
        )

    # 1-3: tokenizer, checkpoint, data
    t0 = time.perf_counter()
    from litgpt import Config

    ckpt = out_dir / "checkpoints" / f"random-{model}-{n_layer}L"
    data_path = out_dir / "data" / "stdlib_instructions.json"
    files = source_files()
    if not (ckpt / "lit_model.pth").is_file():
        vocab = train_tokenizer(ckpt, 8192 if on_gpu else 512, files if on_gpu else files[:40])
        real = Config.from_name(model)
        overrides: dict[str, Any] = {"n_layer": n_layer, "block_size": max(max_seq_length, 256)}
        if on_gpu:  # real widths; lm_head keeps the real (padded) vocabulary
            padded = real.padded_vocab_size
        else:
            overrides.update(tiny_overrides())
            padded = vocab
        make_checkpoint(ckpt, model, vocab_size=vocab, padded_vocab_size=padded, **overrides)
    if not data_path.is_file():
        n = 64 * max(steps, 8) * micro_batch_size // 8
        make_instruction_dataset(
            data_path, files, n=n, min_chars=2000 if on_gpu else 0, max_chars=20000 if on_gpu else 1500
        )
    print(f"built checkpoint {ckpt} and data {data_path} in {time.perf_counter() - t0:.1f} s", flush=True)

    # 4: the two runs, each in a fresh process
    results: dict[str, dict[str, Any]] = {}
    for liger in ("false", "true"):
        run_dir = out_dir / f"liger-{liger}"
        stats = run_dir / "lit_liger_stats.json"
        args = finetune_command(ckpt, data_path, run_dir, precision, micro_batch_size, max_seq_length, steps) + [
            "--liger",
            liger,
        ]
        cmd = [sys.executable, "-m", "lit_liger.demo", str(stats), *args]
        print(f"$ lit-liger {' '.join(args)}", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        (run_dir / "stdout.txt").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        if proc.returncode != 0:
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
            raise RuntimeError(
                f"the --liger {liger} run failed (exit {proc.returncode}); log: {run_dir / 'stdout.txt'}"
            )
        results[liger] = _summarize(run_dir, stats, warmup=min(3, steps - 1))

    off, on = results["false"], results["true"]
    n = min(len(off["losses"]), len(on["losses"]))
    diffs = [abs(a - b) for a, b in zip(off["losses"][:n], on["losses"][:n])]
    summary = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu (Triton interpreter)",
        "model": f"{model} shape, {n_layer} layers, random init",
        "precision": precision,
        "micro_batch_size": micro_batch_size,
        "max_seq_length": max_seq_length,
        "steps": steps,
        "checkpoint_dir": str(ckpt),
        "data_path": str(data_path),
        "liger_false": off,
        "liger_true": on,
        "first_loss_diff": diffs[0] if diffs else float("nan"),
        "max_loss_diff": max(diffs) if diffs else float("nan"),
    }
    print(_table(summary, on_gpu))
    (out_dir / "demo_results.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def finetune_command(
    checkpoint_dir: Path,
    data_path: Path,
    out_dir: Path,
    precision: str,
    micro_batch_size: int,
    max_seq_length: int,
    steps: int,
) -> list[str]:
    """The demo's ``finetune_lora`` arguments (without ``--liger``): one optimizer step per micro-batch
    (so each logged loss is one batch's), no periodic evaluation or checkpoints, CSV logs."""
    return [
        "finetune_lora",
        str(checkpoint_dir),
        "--out_dir",
        str(out_dir),
        "--precision",
        precision,
        "--devices",
        "1",
        "--data",
        "JSON",
        "--data.json_path",
        str(data_path),
        "--data.val_split_fraction",
        "0.05",
        "--data.num_workers",
        "0",
        "--train.micro_batch_size",
        str(micro_batch_size),
        "--train.global_batch_size",
        str(micro_batch_size),
        "--train.max_seq_length",
        str(max_seq_length),
        "--train.max_steps",
        str(steps),
        "--train.epochs",
        "1000",
        "--train.lr_warmup_steps",
        "1",
        "--train.save_interval",
        str(10**9),
        "--eval.interval",
        str(10**9),
        "--eval.final_validation",
        "false",
        "--eval.max_iters",
        "2",
        "--eval.max_new_tokens",
        "8",
        "--logger_name",
        "csv",
    ]


def _fmt(v: Any, spec: str) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _table(s: dict[str, Any], on_gpu: bool) -> str:
    off, on = s["liger_false"], s["liger_true"]

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if (a is None or b is None or not a or math.isnan(a) or math.isnan(b)) else f"{b / a:.3g}x"

    rows = [
        (
            "tokens/s",
            _fmt(off["tokens_per_s"], ",.0f"),
            _fmt(on["tokens_per_s"], ",.0f"),
            ratio(off["tokens_per_s"], on["tokens_per_s"]),
        ),
        (
            "peak GPU memory, training (GB)",
            _fmt(off["peak_memory_gb"], ".2f"),
            _fmt(on["peak_memory_gb"], ".2f"),
            ratio(off["peak_memory_gb"], on["peak_memory_gb"]),
        ),
        (
            "peak GPU memory, whole run (GB)",
            _fmt(off["peak_memory_run_gb"], ".2f"),
            _fmt(on["peak_memory_run_gb"], ".2f"),
            ratio(off["peak_memory_run_gb"], on["peak_memory_run_gb"]),
        ),
        (
            "first loss",
            _fmt(off["losses"][0], ".4f"),
            _fmt(on["losses"][0], ".4f"),
            "diff " + _fmt(s["first_loss_diff"], ".2e"),
        ),
        (
            "final loss",
            _fmt(off["losses"][-1], ".4f"),
            _fmt(on["losses"][-1], ".4f"),
            "diff " + _fmt(abs(off["losses"][-1] - on["losses"][-1]), ".2e"),
        ),
        ("max |loss diff| over steps", "", "", _fmt(s["max_loss_diff"], ".2e")),
    ]
    head = ("", "--liger false", "--liger true", "liger / stock")
    w = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    lines = [
        (
            f"\nlit-liger demo: finetune_lora on {s['device']}, {s['model']}, {s['precision']}, "
            f"{s['micro_batch_size']} x {s['max_seq_length']} tokens, {s['steps']} steps"
        ),
        "  ".join(h.ljust(x) for h, x in zip(head, w)),
        "  ".join("-" * x for x in w),
    ]
    lines += ["  ".join(c.ljust(x) for c, x in zip(r, w)) for r in rows]
    if not on_gpu:
        lines.append("(CPU: Triton interpreter; the numbers to look at are the losses, not the speed)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Child process: `python -m lit_liger.demo STATS_JSON <lit-liger args...>`
# ----------------------------------------------------------------------------------------------
def _run_and_record(stats_path: str, argv: list[str], via_litgpt: bool = False) -> None:
    """Run ``lit-liger *argv`` in this process (as ``python -m lit_liger *argv``), then write its peak GPU memory and
    wall time. ``via_litgpt``: ``litgpt *argv`` instead: litgpt's console script run as a ``litgpt`` process runs it
    once lit-liger's plugin has booted (``lit_liger._litgpt_boot``, what the plugin's ``.pth`` line executes at start-up).

    Two peaks: the whole run, and the training steps alone. The finetune and pretrain scripts start with a
    validation pass ("Verifying settings": real logits under ``no_grad``, the same with or without
    lit-liger); the peak counter is reset after each validation, so the second number is what the
    training steps needed.
    """
    import runpy

    import litgpt.finetune.full
    import litgpt.finetune.lora
    import litgpt.pretrain

    sys.argv = ["litgpt" if via_litgpt else "lit-liger", *argv]  # litgpt re-parses sys.argv when it saves hyperparameters
    cuda = torch.cuda.is_available()
    run_peak = [0]
    scripts = (litgpt.finetune.lora, litgpt.finetune.full, litgpt.pretrain)
    originals = [m.validate for m in scripts]

    def resetting(validate: Any) -> Any:
        def validate_then_reset_peak(*args: Any, **kwargs: Any) -> Any:
            out = validate(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
                run_peak[0] = max(run_peak[0], torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            return out

        return validate_then_reset_peak

    for m, v in zip(scripts, originals):
        m.validate = resetting(v)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        # the command's entry point, as a user runs it: the CLI imports this module (its `demo` subcommand), this
        # module runs the CLI only as a program, so the import goes one way
        if via_litgpt:
            import shutil

            from ._litgpt_boot import boot

            script = shutil.which("litgpt")
            if script is None:
                raise RuntimeError("no `litgpt` console script on PATH")
            sys.argv[0] = script
            if not boot():
                raise RuntimeError(f"the litgpt plugin's boot does not route {argv[:1]} (no --liger?)")
            sys.modules.pop("litgpt.__main__", None)
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
        else:
            runpy.run_module("lit_liger", run_name="__main__")
    finally:
        for m, v in zip(scripts, originals):
            m.validate = v
    stats = {
        "wall_s": time.perf_counter() - t0,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        # what the allocator held (CUDA graphs' pools included: their freed-at-capture blocks are not "allocated")
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "peak_memory_run_bytes": max(run_peak[0], torch.cuda.max_memory_allocated()) if cuda else None,
    }
    Path(stats_path).write_text(json.dumps(stats), encoding="utf-8")


if __name__ == "__main__":
    _run_and_record(sys.argv[1], sys.argv[2:])
