"""litgpt's config hub, end to end: every ``config_hub/finetune/<model>/<method>.yaml`` through the ``litgpt`` console
script, ``--liger true`` against ``--liger false``.

The recipes are litgpt 0.5.13's own files, copied verbatim into ``tests/litgpt_config_hub/finetune/`` (litgpt's wheel
has none; README.md there says where they come from). Each recipe found there is one test
(``test_recipe[<model>/<method>]``):

* the model is the recipe's ``checkpoint_dir``, resolved by litgpt's own config lookup (``Config.from_name``), cut to
  a tiny checkpoint that keeps the family's flags (norm, MLP class, parallel residual, rotary fraction, query groups
  = 1 / some / all heads, softcaps, sliding window, biases): 2 layers, n_embd 64, 4 heads of 16, MLP width 192, a
  512-token BPE trained on Python's standard library (``lit_liger.demo``), a tied head where the model ties it
  (``TIED``). It is written under ``<tmp>/checkpoints/<org>/<name>``, the recipe's own ``checkpoint_dir``, and the
  runs start in ``<tmp>``: the recipe's path is used as it is written. One tokenizer, dataset and checkpoint per
  model are made per test process and shared by the model's lora / qlora / full recipes;
* the recipe's command (the hub README's: ``finetune_lora`` for ``lora.yaml`` and ``qlora.yaml``, ``finetune_full``
  for ``full.yaml``) runs as ``litgpt <command> --config <recipe.yaml> <overrides>`` in a fresh process, twice:
  ``--liger true`` and ``--liger false``. The recipe's LoRA settings (r, alpha, dropout, which layers, lora_head),
  ``quantize``, optimizer and seed stand; the overrides (``OVERRIDES``) only make it a 2-step CPU run: litgpt's JSON
  data module on a local file (the recipes download Alpaca2k), micro- and global batch 1 (one 32-token sample a
  step: the samples are longer, so a second row would add no padding, only interpreter time), warm-up 1 step
  (litgpt's cosine schedule divides by ``max_steps - lr_warmup_steps``), no evaluation but the sanity check litgpt
  always runs, one device (the full recipes ask for 2 or 4), and ``--precision 32-true``: the recipes' ``bf16-true``
  would compare bf16 rounding, not lit-liger's arithmetic; in float32 the two runs must agree to ``LOSS_TOL``;
* the prompt style is phi-2's (``Instruct: ...\\nOutput:``) instead of the JSON module's default, Alpaca's: Alpaca's
  template alone is ~150 tokens of this BPE, so at 32 tokens every sample would be the same 32 template tokens;
* QLoRA: litgpt hands Fabric Lightning's ``BitsandbytesPrecision``, which Lightning allows on CUDA only, at any
  precision ("Bitsandbytes is only supported on CUDA GPUs.", then "Unexpected device type: cpu" when it quantizes),
  while bitsandbytes itself quantizes and multiplies 4-bit weights on CPU. The closest setting that runs here is the
  recipe as it is (``quantize: bnb.nf4``, 32-true: fp32 compute) with those two CUDA checks lifted for both runs by
  ``tests/litgpt_config_hub/cpu_qlora/sitecustomize.py`` (on ``PYTHONPATH``; its docstring says what it changes).
  The layers are Lightning's own nf4 layers, quantized by its own hooks. Stock bitsandbytes decodes the 4-bit
  weight to float16 before its fp32 matmul, lit-liger's LoRA layers decode their base weight straight to fp32: the
  runs differ by that rounding (~5e-6 relative in the loss, up to ~1.3e-3 in a trained LoRA B: ``QLORA_WEIGHT_TOL``).

What each test checks:

1. the per-iteration losses of litgpt's CSV log agree within ``LOSS_TOL`` (fp32 whole-model parity, as in
   tests/test_cli.py);
2. the weights the run saved (``final/lit_model.pth.lora``, or ``final/lit_model.pth`` of a full fine-tune, as the
   change from the checkpoint) agree within ``WEIGHT_TOL``, tensor by tensor. litgpt's warm-up makes the first step's
   learning rate 0, so the second logged loss still comes before any update; the saved weights are where the
   gradients show (AdamW's second step holds both steps' gradients and divides by their own scale: hence 1e-3).
   LoRA starts with B = 0, so dropout cannot move the losses; it moves B's gradient: equal saved weights are what
   show that with ``lora_dropout`` > 0 both runs drew the same masks (consumed the RNG identically), and that
   lora_A, which does not train in two steps, was initialized from the same RNG state;
3. ``apply_liger``'s report (printed by the ``--liger true`` run) lists nothing left to LitGPT but the KV-cache path,
   MoE routing and latent attention (``ALLOWED_LEFT_ALONE``), and a QLoRA run reports every 4-bit Linear swapped.
   A recipe whose only failure is this is marked ``xfail(strict=True, raises=ReportViolation)`` with the lines it
   reports (``KNOWN_VIOLATIONS``): it stays so until lit-liger fixes them, then fails until its mark is removed.

``test_hub_is_complete`` holds the list of the 42 recipes (so none silently disappears); a recipe added to the
folder is tested without a change here. Time: ~20 CPU-seconds per recipe (two process start-ups of ~5 s each, the
Triton interpreter's kernel launches in the ``--liger true`` run, RoPE's most of all); docs/testing.md has the
file's measured total.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lit_liger.demo import make_checkpoint, make_instruction_dataset, read_metrics, source_files, train_tokenizer

HUB = Path(__file__).resolve().parent / "litgpt_config_hub"
CPU_QLORA = HUB / "cpu_qlora"  # sitecustomize.py: Lightning's bitsandbytes precision allowed on CPU
RECIPES = sorted(p.relative_to(HUB / "finetune").as_posix() for p in (HUB / "finetune").glob("*/*.yaml"))

#: litgpt 0.5.13's config_hub/finetune (its repository at the release tag)
HUB_0_5_13 = [
    f"{model}/{method}.yaml"
    for model, methods in {
        "falcon-7b": "lora qlora",
        "gemma-2b": "full lora qlora",
        "gemma-7b": "lora qlora",
        "gemma2-2b": "lora qlora",
        "gemma2-9b": "lora qlora",
        "llama-2-7b": "full lora qlora",
        "llama-3-8b": "full lora qlora",
        "llama-3.1-8b": "full lora qlora",
        "llama-3.2-1B": "full lora qlora",
        "llama-3.2-3B": "full lora qlora",
        "mistral-7b": "lora qlora",
        "mistral-7b-v0.2": "lora qlora",
        "phi-2": "full lora qlora",
        "phi-3": "full lora qlora",
        "stablelm-base-alpha-3b": "full lora qlora",
        "tiny-llama": "full lora qlora",
    }.items()
    for method in methods.split()
]

#: the hub README's command per recipe file name
COMMANDS = {"lora.yaml": "finetune_lora", "qlora.yaml": "finetune_lora", "full.yaml": "finetune_full"}

SEQ, MICRO_BATCH, STEPS = 32, 1, 2
LOSS_TOL = 1e-4  # fp32 whole-model parity (lit_liger.doctor.TOLERANCE explains the number; tests/test_cli.py)
WEIGHT_TOL = 1e-3  # one AdamW update after two steps' gradients (see the module docstring)
#: QLoRA: stock decodes every 4-bit weight to float16 before its fp32 matmul (a rounding of ~2^-11 per weight), lit-liger
#: decodes the LoRA layers' bases and the other 4-bit Linears straight to fp32, so the two runs' gradients differ by
#: that rounding through every layer; measured up to 1.3e-3 in a LoRA B after the update (llama-3-8b, CI 2026-12-01),
#: where a wrong gradient moves it by O(1)
QLORA_WEIGHT_TOL = 5e-3

#: the tiny model: widths every family accepts. MLP width 192 and n_embd 64: bitsandbytes' CPU 4-bit layers need
#: rows in multiples of 32 and columns in multiples of its 64-wide blocks
TINY = dict(n_layer=2, n_embd=64, n_head=4, head_size=16, intermediate_size=192, block_size=256)
VOCAB = 512

#: models whose Hugging Face checkpoint ties the head to the embedding: litgpt's conversion writes lm_head.weight
#: equal to transformer.wte.weight, as make_checkpoint(tied_head=True) does
TIED = {"Llama-3.2-1B", "Llama-3.2-3B", "Gemma-2b", "Gemma-7b", "Gemma-2-2b", "Gemma-2-9b"}

#: what apply_liger may report as left to LitGPT (the issue: the KV-cache path, MoE routing, latent attention)
ALLOWED_LEFT_ALONE = (
    "KV-cache (input_pos) and no-grad calls return LitGPT's real logits",
    "router/dispatch stays LitGPT's",
    "latent attention (MLA)",
)

#: the overrides that make a recipe a 2-step CPU run (besides --data.json_path, --out_dir and --liger)
OVERRIDES = [
    "--precision", "32-true",
    "--devices", "1",
    "--data", "JSON",
    "--data.val_split_fraction", "0.1",
    "--data.num_workers", "0",
    "--data.prompt_style", "phi-2",
    "--train.max_steps", str(STEPS),
    "--train.lr_warmup_steps", "1",
    "--train.micro_batch_size", str(MICRO_BATCH),
    "--train.global_batch_size", str(MICRO_BATCH),
    "--train.max_seq_length", str(SEQ),
    "--train.save_interval", "1000",
    "--eval.interval", "1000",
    "--eval.max_iters", "1",
    "--eval.max_new_tokens", "4",
    "--eval.final_validation", "false",
    "--logger_name", "csv",
]  # fmt: skip


class ReportViolation(AssertionError):
    """apply_liger's report lists something left to LitGPT outside ``ALLOWED_LEFT_ALONE`` (or misses a swap)."""


# What the reports say today that breaks the rule: nothing. (Measured while the suite was written, 2026-12-01: every
# recipe's report listed the SDPA backend choice and compile_min_tokens as "left alone" (now reported as what lit-liger
# does), Gemma-2's "packing off: attention logit softcapping" (packed since 96fc018), and under `--quantize bnb.*` no
# 4-bit Linear was swapped: the CLI swaps inside fabric.init_module, where Lightning's BitsandbytesPrecision had
# replaced torch.nn.Linear (fixed: apply_liger runs with PyTorch's own class).) A phrase of report_violations' line
# with its reason goes here when a known violation must be tolerated; the recipe is then xfail(strict=True).
_REASONS: dict[str, str] = {}


def known_violations(recipe: str) -> list[str]:
    """The phrases of the report lines that break the rule for ``recipe`` today (see ``_REASONS``)."""
    return []


#: recipe -> what breaks the rule in its report today. Such a recipe is xfail(strict=True) on ReportViolation only: a
#: loss or weight mismatch, or a report line that breaks the rule and is not in this list, still fails it.
KNOWN_VIOLATIONS: dict[str, list[str]] = {r: known_violations(r) for r in HUB_0_5_13}


def _params() -> list:
    out = []
    for recipe in RECIPES:
        known = KNOWN_VIOLATIONS.get(recipe)
        marks = [pytest.mark.slow]
        if known:
            reason = "lit-liger's report: " + "; ".join(_REASONS[k] for k in known)
            marks.append(pytest.mark.xfail(strict=True, raises=ReportViolation, reason=reason))
        out.append(pytest.param(recipe, marks=marks, id=recipe.removesuffix(".yaml")))
    return out


# ----------------------------------------------------------------------------------------------
# The console script, the recipe's model, the assets
# ----------------------------------------------------------------------------------------------
def _console(command: str) -> list[str]:
    """The console script that runs ``command`` with ``--liger``: stock ``litgpt`` with lit-liger's plugin
    (tests/conftest.py installs it for the session)."""
    from lit_liger import litgpt_plugin

    assert litgpt_plugin.status() == "installed", "tests/conftest.py installs lit-liger's litgpt plugin for the session"
    return [str(Path(sys.executable).parent / "litgpt"), command]


def recipe_config(recipe: str) -> dict:
    return yaml.safe_load((HUB / "finetune" / recipe).read_text(encoding="utf-8"))


def model_name(recipe: str) -> str:
    """litgpt's config name of the recipe's ``checkpoint_dir`` (``checkpoints/google/gemma-2-2b`` -> ``Gemma-2-2b``):
    litgpt's own lookup, by Hugging Face ``org/name``."""
    from litgpt.config import Config, name_to_config

    ckpt = str(recipe_config(recipe)["checkpoint_dir"])
    name = Config.from_name(ckpt.removeprefix("checkpoints/")).name
    assert name in name_to_config, (recipe, ckpt, name)
    return name


def tiny_overrides(name: str) -> dict:
    """``TINY`` with the family's attention layout kept: one key/value head (MQA), some (GQA) or all (MHA); a
    sliding window, where the family has one, shorter than the 32-token samples so that it masks something."""
    from litgpt.config import Config

    full = Config.from_name(name)
    n_head = TINY["n_head"]
    groups = 1 if full.n_query_groups == 1 else n_head if full.n_query_groups == full.n_head else 2
    extra = {"sliding_window_size": SEQ // 2} if full.sliding_window_size is not None else {}
    return {**TINY, "n_query_groups": groups, **extra}


@pytest.fixture(scope="session")
def hub_root(tmp_path_factory) -> Path:
    """The runs' working directory: a tokenizer (one per test process) and the instruction data."""
    root = tmp_path_factory.mktemp("config_hub")
    files = source_files()
    vocab = train_tokenizer(root / "tokenizer", VOCAB, files[:40])
    assert vocab == VOCAB
    make_instruction_dataset(root / "data.json", files, n=40, max_chars=1500)
    return root


@functools.cache
def _checkpoint(root: Path, ckpt: str, name: str) -> Path:
    """The tiny checkpoint of ``name`` at the recipe's ``checkpoint_dir`` under ``root`` (made once per process)."""
    out = root / ckpt
    for f in ("tokenizer.json", "tokenizer_config.json"):
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "tokenizer" / f, out / f)
    make_checkpoint(out, name, vocab_size=VOCAB, tied_head=name in TIED, **tiny_overrides(name))
    return out


# ----------------------------------------------------------------------------------------------
# One run, its report, its numbers
# ----------------------------------------------------------------------------------------------
def run_recipe(root: Path, recipe: str, liger: str, out_dir: Path) -> str:
    """``litgpt <command> --config <recipe> <overrides> --liger <liger>`` in a fresh process in ``root``; its stdout."""
    command = COMMANDS[Path(recipe).name]
    argv = [
        *_console(command),
        "--config", str(HUB / "finetune" / recipe),
        *OVERRIDES,
        "--data.json_path", str(root / "data.json"),
        "--out_dir", str(out_dir),
        "--liger", liger,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # (2 workers on 2 cores)
    if recipe_config(recipe).get("quantize"):
        env["PYTHONPATH"] = os.pathsep.join([str(CPU_QLORA), *filter(None, [env.get("PYTHONPATH")])])
        env["LIT_LIGER_TEST_CPU_QLORA"] = "1"
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)}\n(cwd {root}) exited with {proc.returncode}:\n--- stdout (end)\n{proc.stdout[-3000:]}"
            f"\n--- stderr (end)\n{proc.stderr[-6000:]}",
            pytrace=False,
        )
    return proc.stdout


_ROW = re.compile(r"^(swapped|left alone)\s{2,}(?P<what>.+?)\s{2,}(?P<n>\d+)(?:\s{2,}(?P<where>.*))?$")


def parse_report(stdout: str) -> list[dict]:
    """The rows of ``apply_liger``'s report (``LigerReport.__str__``) in a run's output: action, module class, what
    (kernel or reason), count, where."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"lit-liger: \d+ modules swapped, \d+ left alone$", line)]
    assert starts, "the --liger true run printed no apply_liger report"
    rows = []
    for line in lines[starts[0] + 2 :]:  # (after the header line)
        m = _ROW.match(line)
        if m is None:
            break
        cls, _, what = m["what"].partition(": ") if m[1] == "left alone" else m["what"].partition(" -> ")
        rows.append({"action": m[1], "class": cls, "what": what, "n": int(m["n"]), "where": m["where"] or ""})
    return rows


def report_violations(rows: list[dict], recipe: str) -> list[str]:
    """What the report should not say (or should and does not), one line each."""
    out = [
        f"left alone: {r['class']}: {r['what']} ({r['where']})"
        for r in rows
        if r["action"] == "left alone"
        and not (r["what"] == ALLOWED_LEFT_ALONE[0] or r["what"].startswith(ALLOWED_LEFT_ALONE[1:]))
    ]
    if recipe_config(recipe).get("quantize"):
        n = sum(r["n"] for r in rows if r["action"] == "swapped" and r["what"].startswith("4-bit (bitsandbytes)"))
        want = _n_linear(recipe)
        if n != want:
            out.append(f"swapped: {n} 4-bit (bitsandbytes) Linear of the {want} that Lightning's plugin quantized")
    return out


def _n_linear(recipe: str) -> int:
    """How many ``nn.Linear`` the recipe's tiny LoRA model has (``--quantize bnb.*`` makes each a 4-bit layer)."""
    from litgpt.lora import GPT, Config

    cfg = recipe_config(recipe)
    lora = {k: v for k, v in cfg.items() if k.startswith("lora_")}
    name = model_name(recipe)
    with torch.device("meta"):
        model = GPT(Config.from_name(name, vocab_size=VOCAB, **tiny_overrides(name), **lora))
    return sum(isinstance(m, torch.nn.Linear) for m in model.modules())


def losses(out_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(out_dir)]


def trained(recipe: str, out_dir: Path, ckpt: Path) -> dict[str, torch.Tensor]:
    """What the run trained: the LoRA tensors it saved, or a full fine-tune's change of every weight.

    A full fine-tune's key bias (the middle slice of ``attn.qkv.bias``, litgpt's q | k | v layout) is left out: its
    gradient is 0 in exact arithmetic (adding a constant to every key of a query's row shifts all its scores alike, and
    softmax ignores that), so what a run computes for it is rounding noise, which AdamW scales up to a full ±lr step
    (measured: 0.6-0.8% apart between the runs, the rest of the weights 1e-5)."""
    if COMMANDS[Path(recipe).name] == "finetune_lora":
        return torch.load(out_dir / "final" / "lit_model.pth.lora", weights_only=True)["model"]
    start = torch.load(ckpt / "lit_model.pth", weights_only=True)
    final = torch.load(out_dir / "final" / "lit_model.pth", weights_only=True)["model"]
    assert final.keys() == start.keys()
    out = {k: final[k] - start[k] for k in final}
    c = tiny_overrides(model_name(recipe))
    q, kv = c["n_head"] * c["head_size"], c["n_query_groups"] * c["head_size"]
    for k in [k for k in out if k.endswith("attn.qkv.bias")]:
        assert out[k].shape == (q + 2 * kv,)
        out[k] = torch.cat([out[k][:q], out[k][q + kv :]])  # (q and v)
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    d = (a - b).norm().item()
    return d / b.norm().item() if d else 0.0


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------
def test_hub_is_complete():
    """All of litgpt 0.5.13's finetune recipes are here (tests/litgpt_config_hub/README.md), with the hub's license."""
    assert RECIPES == sorted(HUB_0_5_13)
    assert "Apache License" in (HUB / "LICENSE.md").read_text(encoding="utf-8")
    for recipe in RECIPES:
        assert model_name(recipe)  # each checkpoint_dir is a litgpt config
        assert bool(recipe_config(recipe).get("quantize")) == recipe.endswith("qlora.yaml")


@pytest.mark.parametrize("recipe", _params())
def test_recipe(recipe, hub_root, tmp_path):
    """``litgpt <command> --config <recipe>``, 2 steps on CPU at 32-true: ``--liger true`` equals ``--liger false``
    (losses, saved weights) and its report leaves nothing to LitGPT but the KV-cache path, MoE routing and MLA."""
    cfg = recipe_config(recipe)
    name = model_name(recipe)
    ckpt = _checkpoint(hub_root, str(cfg["checkpoint_dir"]), name)
    out_on = run_recipe(hub_root, recipe, "true", tmp_path / "on")
    out_off = run_recipe(hub_root, recipe, "false", tmp_path / "off")
    assert "modules swapped" not in out_off  # (--liger false: stock litgpt)

    on, off = losses(tmp_path / "on"), losses(tmp_path / "off")
    assert len(on) == len(off) == STEPS, (on, off)
    bad = [(a, b) for a, b in zip(on, off) if not abs(a - b) <= LOSS_TOL * abs(b)]
    assert not bad, f"{recipe}: losses --liger true {on} vs --liger false {off} (relative tolerance {LOSS_TOL})"

    w_on, w_off = trained(recipe, tmp_path / "on", ckpt), trained(recipe, tmp_path / "off", ckpt)
    assert w_on.keys() == w_off.keys() and w_on
    errs = {k: rel(w_on[k], w_off[k]) for k in w_off}
    worst = sorted(errs.items(), key=lambda kv: -kv[1])[:3]
    tol = QLORA_WEIGHT_TOL if cfg.get("quantize") else WEIGHT_TOL
    assert worst[0][1] <= tol, f"{recipe}: trained weights differ, worst {worst} (tolerance {tol})"

    violations = report_violations(parse_report(out_on), recipe)
    known = KNOWN_VIOLATIONS.get(recipe, [])
    new = [v for v in violations if not any(k in v for k in known)]
    assert not new, f"{recipe}: apply_liger's report, not in KNOWN_VIOLATIONS:\n" + "\n".join(new)
    if violations:
        raise ReportViolation(f"{recipe}: apply_liger's report:\n" + "\n".join(violations))
