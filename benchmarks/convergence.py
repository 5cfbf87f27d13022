"""Convergence parity: a small LitGPT model trained on real text, stock LitGPT vs lit-liger, same seed.

    python -m benchmarks convergence [--steps 300] [--batch_size 16] [--seq_len 256] [--out DIR] [--smoke]

The text is Python's standard-library sources (:class:`lit_liger.demo.LocalText`), tokenized with a
byte-level BPE trained on them here (:func:`lit_liger.demo.train_tokenizer`); nothing is downloaded.
The model is a Llama-3-shaped LitGPT config cut small (default: Llama-3.2-1B's flags, 4 layers,
n_embd 256, 4 heads / 2 KV groups, intermediate 688, the tokenizer's vocabulary), built with LitGPT's
init from one seed. Two runs, each from that same init and the same batches in the same order:

* ``eager``     -- ``litgpt.utils.chunked_cross_entropy(model(x), y)``, stock LitGPT;
* ``lit-liger`` -- ``apply_liger(model)``, then ``lit_liger.chunked_cross_entropy(model(x), y)``.

AdamW (linear warm-up, cosine decay, gradient clipping at 1.0), bf16 weights on a GPU, fp32 on CPU.
Per-step losses of both runs are recorded; reported: the largest and the final relative difference
after the warm-up (target <= 1%), and each model's validation perplexity at the end through
``torchmetrics.text.Perplexity`` on held-out stdlib text (real logits, under ``no_grad``).

Output: ``convergence.json`` (both curves), ``convergence.md``, ``convergence_loss.png`` (matplotlib).
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import torch

VARIANTS = ("eager", "lit-liger")
TARGET_REL_DIFF = 1e-2  # issue 7: loss curves within 1% of each other after the warm-up
WORK_DIR = C.SMOKE_DIR / "convergence-work"  # the tokenizer: rebuilt when missing, never under results/
DEFAULTS = {  # full run (GPU) / --smoke (CPU, Triton interpreter: one program at a time, so a few tokens)
    "steps": (300, 30), "warmup": (20, 5), "batch_size": (16, 1), "seq_len": (256, 8), "n_layer": (4, 2),
    "n_embd": (256, 64), "n_head": (4, 4), "n_query_groups": (2, 2), "intermediate_size": (688, 176),
    "vocab_size": (8192, 512), "val_batches": (16, 2), "lr": (1e-3, 1e-3),
}


# ----------------------------------------------------------------------------------------------
# Data and model
# ----------------------------------------------------------------------------------------------
def n_files_for(chars: int) -> int:
    """How many of ``lit_liger.demo.source_files()`` (sorted) hold ``chars`` characters (all if fewer)."""
    from lit_liger.demo import source_files

    total = 0
    files = source_files()
    for i, f in enumerate(files):
        total += f.stat().st_size
        if total >= chars:
            return i + 1
    return len(files)


def prepare_data(work_dir: Path, *, vocab_size: int, n_files: int, batch_size: int, seq_len: int,
                 val_fraction: float = 0.05) -> tuple[Any, Path]:
    """A BPE trained on the first ``n_files`` stdlib sources (cached under ``work_dir``), and a set-up
    :class:`lit_liger.demo.LocalText` over the same files: blocks of ``seq_len + 1`` tokens, the first
    ``val_fraction`` held out for validation, training batches shuffled by a seeded generator (the same
    order on every call of ``train_dataloader()``)."""
    from litgpt import Tokenizer

    from lit_liger.demo import LocalText, source_files, train_tokenizer

    tok_dir = work_dir / f"tokenizer-v{vocab_size}-f{n_files}"
    if not (tok_dir / "tokenizer.json").is_file():
        train_tokenizer(tok_dir, vocab_size, source_files()[:n_files])
    data = LocalText(max_files=n_files, val_fraction=val_fraction)
    data.connect(Tokenizer(tok_dir), batch_size=batch_size, max_seq_length=seq_len)
    data.setup()
    return data, tok_dir


def train_batches(data) -> Iterator[torch.Tensor]:
    """The training blocks, epoch after epoch, in the data module's seeded order: ``(B, T + 1)`` int64."""
    loader = data.train_dataloader()
    while True:
        for block in loader:
            yield block.long()


def model_config(model: str, vocab_size: int, *, n_layer: int, n_embd: int, n_head: int, n_query_groups: int,
                 intermediate_size: int, block_size: int, sliding_window: int | None = None):
    """``model``'s LitGPT config (its flags: norm, MLP class, RoPE, ...) at the given widths; the
    vocabulary is the tokenizer's, padded up to a multiple of 64 as LitGPT pads its own. ``sliding_window``
    shortens the window of a config that has one (gemma-2's 4096 would never bite at a short ``seq_len``)."""
    from litgpt import Config

    from lit_liger.demo import tiny_overrides

    widths = dict(tiny_overrides(n_embd, n_head, n_query_groups), intermediate_size=intermediate_size)
    padded = 64 * math.ceil(vocab_size / 64)
    if sliding_window is not None:
        if not Config.from_name(model).sliding_window_size:
            raise ValueError(f"--sliding_window: {model}'s config has no sliding window")
        widths["sliding_window_size"] = sliding_window
    return Config.from_name(model, n_layer=n_layer, vocab_size=vocab_size, padded_vocab_size=padded,
                            block_size=block_size, **widths)


def lr_factor(step: int, *, warmup: int, steps: int, min_factor: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_factor`` at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ----------------------------------------------------------------------------------------------
# Training and evaluation
# ----------------------------------------------------------------------------------------------
def train(config, data, variant: str, *, steps: int, seq_len: int, dtype: torch.dtype, lr: float, warmup: int,
          seed: int, val_batches: int) -> dict[str, Any]:
    """Train a fresh model (LitGPT's init from ``seed``) for ``steps`` steps; per-step loss and grad
    norm, then the validation perplexity. Same init, data order and optimizer for every variant."""
    from .step import build_model

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    model = build_model(config, seq_len=seq_len, dtype=dtype, seed=seed)
    notes = ""
    if variant == "lit-liger":
        from lit_liger import apply_liger
        from lit_liger import chunked_cross_entropy as loss_fn

        notes = str(apply_liger(model))
    else:
        from litgpt.utils import chunked_cross_entropy as loss_fn
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=C.CUDA)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup=warmup, steps=steps))
    batches = train_batches(data)
    losses: list[float] = []
    grad_norms: list[float] = []
    C.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        block = next(batches).to(C.device())
        x, y = block[:, :-1], block[:, 1:]  # (B, T) inputs and next-token targets
        loss = loss_fn(model(x), y)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(float(loss.detach()))
        grad_norms.append(float(grad_norm))
    C.sync()
    train_s = time.perf_counter() - t0
    tokens = steps * x.numel()
    ppl, val_tokens = perplexity(model, data, val_batches)
    del model, optimizer
    C.free_memory()
    return {"losses": losses, "grad_norms": grad_norms, "val_ppl": ppl, "val_tokens": val_tokens,
            "train_s": train_s, "tok_per_s": tokens / train_s, "notes": notes}


@torch.no_grad()
def perplexity(model, data, n_batches: int) -> tuple[float, int]:
    """``torchmetrics.text.Perplexity`` over the first ``n_batches`` held-out batches: the model's real
    ``(B, T, V)`` logits (under ``no_grad`` a swapped model returns them too), in fp32."""
    from torchmetrics.text import Perplexity

    metric = Perplexity().to(C.device())
    was_training = model.training
    model.eval()
    n_tokens = 0
    for i, block in enumerate(data.val_dataloader()):
        if i >= n_batches:
            break
        block = block.long().to(C.device())
        logits = model(block[:, :-1])  # (B, T, padded V)
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"validation expected real logits, got {type(logits).__name__}")
        metric.update(logits.float(), block[:, 1:])
        n_tokens += block[:, 1:].numel()
    model.train(was_training)
    return float(metric.compute()), n_tokens


def compare(ref: list[float], other: list[float], warmup: int) -> dict[str, Any]:
    """Per-step relative difference ``|other - ref| / |ref|`` and its summary after ``warmup`` steps.
    A NaN/inf loss anywhere makes the difference inf (never passes)."""
    rel = []
    for a, b in zip(ref, other):
        rel.append(abs(b - a) / max(abs(a), 1e-12) if math.isfinite(a) and math.isfinite(b) else math.inf)
    start = warmup if len(rel) > warmup else 0
    tail = rel[start:]
    k = min(10, len(ref))
    mean_ref, mean_other = statistics.fmean(ref[-k:]), statistics.fmean(other[-k:])
    out = {
        "rel_diff": rel,
        "warmup": warmup,
        "max_rel_diff": max(tail),
        "max_rel_diff_step": start + tail.index(max(tail)) + 1,  # 1-based, as the curves are plotted
        "mean_rel_diff": statistics.fmean(tail),
        "final_rel_diff": rel[-1],
        "final_mean10_rel_diff": abs(mean_other - mean_ref) / max(abs(mean_ref), 1e-12)
        if math.isfinite(mean_ref) and math.isfinite(mean_other) else math.inf,
        "max_rel_diff_all_steps": max(rel),
    }
    out["target"] = TARGET_REL_DIFF
    out["target_met"] = bool(out["max_rel_diff"] <= TARGET_REL_DIFF and out["final_rel_diff"] <= TARGET_REL_DIFF)
    return out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def render(result: dict, out_dir: Path) -> list[Path]:
    env, s, cmp = result["environment"], result["settings"], result.get("comparison")
    runs = result["runs"]
    met = None if not cmp else "met" if cmp["target_met"] else "missed"
    md = [
        f"# Convergence parity: {env['device']}, {env['date']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, litgpt {env['litgpt']}, lit-liger {env['lit_liger']} "
        f"({env.get('lit_liger_commit')})" + (" — SMOKE RUN (tiny, Triton interpreter)" if result.get("smoke") else ""),
        "",
        (f"Model: {s['model']} flags, {s['n_layer']} layers, n_embd {s['n_embd']}, {s['n_head']} heads / "
         f"{s['n_query_groups']} KV groups, intermediate {s['intermediate_size']}, vocabulary {s['vocab_size']} "
         f"(padded {s['padded_vocab_size']}), {C.fmt(result['n_params'] / 1e6)} M parameters, {s['dtype']} weights. "
         f"Data: {result['data']['n_files']} standard-library files, byte-level BPE trained on them; "
         f"{result['data']['n_train_blocks']} training blocks of {s['seq_len']} + 1 tokens, batch {s['batch_size']}, "
         f"seeded shuffle (the same order for both). AdamW lr {s['lr']} (warm-up {s['warmup']} steps, cosine to 10%), "
         f"betas (0.9, 0.95), weight decay 0.1, clip 1.0; {s['steps']} steps; seed {s['seed']}."),
        "",
        "| | eager (LitGPT) | lit-liger | relative difference |",
        "|---|---|---|---|",
    ]
    e, lg = runs.get("eager", {}), runs.get("lit-liger", {})

    def first(r: dict) -> Any:
        return r.get("losses", [None])[0]

    def last(r: dict) -> Any:
        return r.get("losses", [None])[-1]

    def rd(a: Any, b: Any) -> str:
        return C.fmt(abs(b - a) / abs(a)) if isinstance(a, float) and isinstance(b, float) and a else "-"

    md += [
        f"| loss at step 1 | {C.fmt(first(e))} | {C.fmt(first(lg))} | {rd(first(e), first(lg))} |",
        f"| loss at step {s['steps']} | {C.fmt(last(e))} | {C.fmt(last(lg))} | {rd(last(e), last(lg))} |",
        (f"| validation perplexity ({e.get('val_tokens', '-')} held-out tokens, torchmetrics) | "
         f"{C.fmt(e.get('val_ppl'))} | {C.fmt(lg.get('val_ppl'))} | {rd(e.get('val_ppl'), lg.get('val_ppl'))} |"),
        f"| training tokens/s (this run; not a benchmark) | {C.fmt(e.get('tok_per_s'))} | {C.fmt(lg.get('tok_per_s'))} | |",
    ]
    if cmp:
        md += [
            "",
            (f"After the {cmp['warmup']}-step warm-up: largest relative loss difference "
             f"**{C.fmt(cmp['max_rel_diff'])}** (step {cmp['max_rel_diff_step']}), mean {C.fmt(cmp['mean_rel_diff'])}, "
             f"final step **{C.fmt(cmp['final_rel_diff'])}**, mean of the last 10 steps "
             f"{C.fmt(cmp['final_mean10_rel_diff'])}."),
            "",
            f"Target: largest and final relative difference after the warm-up <= {C.fmt(cmp['target'])}: **{met}**.",
        ]
        if s["dtype"] != "float32":
            md += ["", (f"In {s['dtype']}, eager's loss is itself a {s['dtype']} number (LitGPT's cross-entropy on "
                        f"{s['dtype']} logits; bfloat16 keeps 8 significant bits, so about ±0.2%), while lit-liger's "
                        "fused loss accumulates in fp32; the weights of the two runs drift apart by rounding from "
                        "step 1 on.")]
    for v in VARIANTS:
        if runs.get(v, {}).get("status", "ok") != "ok":
            md += ["", f"{v}: {runs[v]['status']}"]
    if lg.get("notes"):
        md += ["", "What `apply_liger` swapped:", "", "```", lg["notes"], "```"]
    path = out_dir / "convergence.md"
    path.write_text("\n".join(md) + "\n")
    written = [path]
    if loss_plot(out_dir / "convergence_loss.png", result):
        written.append(out_dir / "convergence_loss.png")
    return written


def loss_plot(path: Path, result: dict) -> bool:
    """Both loss curves overlaid, and their relative difference per step (log scale) against the 1%
    target. Returns False (writes nothing) without matplotlib or curves."""
    curves = {v: r["losses"] for v, r in result["runs"].items() if r.get("losses")}
    if not curves:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cmp = result.get("comparison")
    fig, axes = plt.subplots(2 if cmp else 1, 1, figsize=(7.5, 6.5 if cmp else 4), squeeze=False, sharex=True)
    ax = axes[0, 0]
    styles = {"eager": {"color": "tab:blue", "linewidth": 2.0},
              "lit-liger": {"color": "tab:orange", "linewidth": 1.0, "linestyle": "--"}}
    for v, losses in curves.items():
        label = f"{v} (val ppl {C.fmt(result['runs'][v].get('val_ppl'))})"
        ax.plot(range(1, len(losses) + 1), losses, label=label, **styles.get(v, {}))
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    s, env = result["settings"], result["environment"]
    ax.set_title(f"{env['device']}: {s['model']}-shaped {s['n_layer']}L x {s['n_embd']}, {s['dtype']}, "
                 f"stdlib text — eager vs lit-liger", fontsize=9)
    if cmp:
        ax2 = axes[1, 0]
        floor = 1e-9  # an exact match (difference 0) is drawn here, on the log scale
        rel = [max(r, floor) for r in cmp["rel_diff"]]
        ax2.semilogy(range(1, len(rel) + 1), rel, color="tab:green", linewidth=0.8,
                     label=f"|lit-liger − eager| / eager (0 drawn at {floor:g})")
        ax2.axhline(cmp["target"], color="k", linestyle="--", linewidth=0.8, label=f"target {C.fmt(cmp['target'])}")
        ax2.axvline(cmp["warmup"] + 0.5, color="grey", linestyle=":", linewidth=0.8, label="end of warm-up")
        ax2.set_ylabel("relative loss difference")
        ax2.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{C.PROG} convergence", description=__doc__.split("\n\n")[0])
    for name, (full, smoke) in DEFAULTS.items():
        p.add_argument(f"--{name}", type=type(full), default=None, help=f"default {full}; smoke {smoke}")
    p.add_argument("--model", default="Llama-3.2-1B", help="LitGPT config name whose flags the small model keeps")
    p.add_argument("--sliding_window", type=int, default=None,
                   help="window of the model's sliding-window layers (only for configs that have one)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="weights, activations and optimizer state (default bfloat16 on a GPU, float32 on CPU)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--work_dir", type=Path, default=WORK_DIR, help=f"tokenizer cache (default {WORK_DIR})")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/<device>-<date>/)")
    p.add_argument("--smoke", action="store_true", help="tiny model, 30 steps of a few tokens (CPU: interpreter)")
    return p


def main(argv: list[str] | None = None) -> dict:
    opts = build_parser().parse_args(argv)
    smoke = opts.smoke
    if not C.CUDA and not smoke:
        print("# no CUDA GPU: running the --smoke sizes (Triton interpreter)", flush=True)
        smoke = True
    for name, (full, small) in DEFAULTS.items():
        if getattr(opts, name) is None:
            setattr(opts, name, small if smoke else full)
    dtype = getattr(torch, opts.dtype or ("bfloat16" if C.CUDA else "float32"))
    out_dir = opts.out or C.default_out_dir(smoke)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = C.environment()
    print(f"# lit-liger convergence parity on {env['device']} -> {out_dir}", flush=True)

    t0 = time.perf_counter()
    train_tokens = opts.steps * opts.batch_size * (opts.seq_len + 1)
    val_tokens = opts.val_batches * opts.batch_size * (opts.seq_len + 1)
    # ~3 characters per token for code under a small BPE; val blocks come out of the first 5% of the text
    n_files = 12 if smoke else n_files_for(int(4 * max(train_tokens * 1.05, 20 * val_tokens)))
    data, tok_dir = prepare_data(opts.work_dir, vocab_size=opts.vocab_size, n_files=n_files,
                                 batch_size=opts.batch_size, seq_len=opts.seq_len)
    vocab = data.tokenizer.vocab_size
    config = model_config(opts.model, vocab, n_layer=opts.n_layer, n_embd=opts.n_embd, n_head=opts.n_head,
                          n_query_groups=opts.n_query_groups, intermediate_size=opts.intermediate_size,
                          block_size=max(opts.seq_len, 64), sliding_window=opts.sliding_window)
    n_train, n_val = len(data._train), len(data._val)
    print(f"# data: {n_files} stdlib files, BPE vocabulary {vocab} ({tok_dir}), {n_train} training / {n_val} "
          f"validation blocks of {opts.seq_len}+1 tokens ({time.perf_counter() - t0:.1f} s)", flush=True)
    if n_train < opts.steps * opts.batch_size:
        print(f"# note: {opts.steps * opts.batch_size} training blocks needed, {n_train} there: epochs repeat",
              flush=True)
    with torch.device("meta"):
        from litgpt import GPT

        n_params = sum(p.numel() for p in GPT(config).parameters())
    settings = {k: getattr(opts, k) for k in DEFAULTS} | {
        "model": opts.model, "dtype": str(dtype).replace("torch.", ""), "seed": opts.seed,
        "vocab_size": vocab, "padded_vocab_size": config.padded_vocab_size}
    result: dict[str, Any] = {
        "kind": "convergence", "environment": env, "smoke": smoke, "settings": settings,
        "config": dataclasses.asdict(config), "n_params": n_params,
        "data": {"n_files": n_files, "tokenizer_dir": str(tok_dir), "n_train_blocks": n_train, "n_val_blocks": n_val,
                 "block_tokens": opts.seq_len + 1, "shuffle_seed": 42},
        "runs": {}, "comparison": None,
    }
    json_path = out_dir / "convergence.json"
    for variant in VARIANTS:
        print(f"# {variant}: {opts.steps} steps ...", flush=True)
        try:
            run = train(config, data, variant, steps=opts.steps, seq_len=opts.seq_len, dtype=dtype, lr=opts.lr,
                        warmup=opts.warmup, seed=opts.seed, val_batches=opts.val_batches)
            run["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded; the other variant still runs
            run = {"status": C.failure_status(exc)}
        C.free_memory()
        result["runs"][variant] = run
        C.write_json(json_path, result)
        if run["status"] == "ok":
            print(f"#   loss {run['losses'][0]:.4f} -> {run['losses'][-1]:.4f}, val ppl {run['val_ppl']:.3f}, "
                  f"{run['train_s']:.1f} s", flush=True)
        else:
            print(f"#   {run['status']}", flush=True)
    e, lg = result["runs"]["eager"], result["runs"]["lit-liger"]
    if e["status"] == "ok" and lg["status"] == "ok":
        cmp = compare(e["losses"], lg["losses"], opts.warmup)
        cmp["val_ppl_rel_diff"] = abs(lg["val_ppl"] - e["val_ppl"]) / e["val_ppl"]
        result["comparison"] = cmp
        rows = [["loss@1", e["losses"][0], lg["losses"][0], cmp["rel_diff"][0]],
                [f"loss@{opts.steps}", e["losses"][-1], lg["losses"][-1], cmp["final_rel_diff"]],
                ["val ppl", e["val_ppl"], lg["val_ppl"], cmp["val_ppl_rel_diff"]],
                [f"max rel diff after step {opts.warmup}", None, None, cmp["max_rel_diff"]]]
        print()
        print(C.text_table(["", "eager", "lit-liger", "rel diff"], rows))
        print(f"target <= {C.fmt(TARGET_REL_DIFF)} after warm-up: {'met' if cmp['target_met'] else 'MISSED'}")
    C.write_json(json_path, result)
    written = [json_path] + render(result, out_dir)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
