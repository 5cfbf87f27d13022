"""The ``lit-liger`` command line: litgpt's training scripts with ``--liger``, end to end on CPU.

A tiny checkpoint (Llama-3.2-1B's config flags, 2 layers, n_embd 64, a 512-token BPE trained here
on Python's standard library) and a JSON instruction set are made once per module. Each training
script runs in this process through ``lit_liger.cli.main`` (``sys.argv`` set as a shell would), with
the Triton kernels in the interpreter (conftest sets TRITON_INTERPRET=1 without a GPU):

* ``lit-liger demo`` (its two ``finetune_lora`` runs), ``finetune_full``, ``finetune_adapter`` and
  ``pretrain``: ``--liger true`` and ``--liger false`` give the same first-step loss (fp32, 1e-4);
* ``--liger false`` is stock litgpt (same losses bit for bit, same hyperparameters.yaml);
* what they save loads in stock litgpt (``litgpt generate``/``generate_adapter``, ``--config
  hyperparameters.yaml``); the post-training generation example samples the same tokens;
* ``--liger.rope false`` / a ``liger:`` mapping in ``--config`` reach the swap; bad values fail clearly;
* ``doctor``, ``check`` and every YAML under configs/ (``--print_config``) work.

Sizes are the smallest that still exercise everything (2 steps of 2 x 32 tokens): the Triton
interpreter runs one program at a time, so CPU time is dominated by kernel launches.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from litgpt.lora import GPT as LoraGPT

from lit_liger import cli
from lit_liger.demo import (
    make_checkpoint,
    make_instruction_dataset,
    read_metrics,
    source_files,
    tiny_overrides,
    train_tokenizer,
)
from lit_liger.swap import gpt as swap_gpt

ROOT = Path(__file__).resolve().parents[1]
SEQ, MICRO_BATCH, STEPS = 32, 2, 2
LOSS_TOL = 1e-4  # fp32 whole-model parity (lit_liger.doctor.TOLERANCE explains the number)


# ----------------------------------------------------------------------------------------------
# Fixtures: tokenizer, checkpoints, data (made once)
# ----------------------------------------------------------------------------------------------
def tiny_llama(root: Path) -> tuple[Path, list[Path], int]:
    """A 2-layer tiny Llama checkpoint under ``root/checkpoints/tiny-llama`` (BPE trained on the stdlib),
    the stdlib source files (for the instruction data) and the tokenizer's vocabulary size."""
    files = source_files()
    ckpt = root / "checkpoints" / "tiny-llama"
    vocab = train_tokenizer(ckpt, 512, files[:40])
    make_checkpoint(ckpt, "Llama-3.2-1B", vocab_size=vocab, n_layer=2, block_size=256, **tiny_overrides())
    return ckpt, files, vocab


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("lit_liger_cli")
    ckpt, files, vocab = tiny_llama(root)
    # litgpt's adapter starts at layer 2 (adapter_start_layer): it needs a 3rd layer to train anything
    ckpt3 = root / "checkpoints" / "tiny-llama-3L"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (ckpt3 / f).parent.mkdir(parents=True, exist_ok=True)
        (ckpt3 / f).write_bytes((ckpt / f).read_bytes())
    make_checkpoint(ckpt3, "Llama-3.2-1B", vocab_size=vocab, n_layer=3, block_size=256, **tiny_overrides())
    data = root / "data.json"
    make_instruction_dataset(data, files, n=40, max_chars=1500)
    # pretrain takes the architecture as a `model_config` mapping in a config file
    pretrain_cfg = root / "pretrain.yaml"
    mc = yaml.safe_load((ckpt / "model_config.yaml").read_text())
    pretrain_cfg.write_text(yaml.safe_dump({"model_name": "tiny-llama", "model_config": mc}))
    return {"root": root, "ckpt": ckpt, "ckpt3": ckpt3, "data": data, "pretrain_cfg": pretrain_cfg}


def run_cli(monkeypatch, args: list[str], prog: str = "lit-liger") -> None:
    """``lit-liger *args`` in this process (litgpt re-reads sys.argv to save hyperparameters)."""
    monkeypatch.setattr(sys, "argv", [prog, *map(str, args)])
    if prog == "litgpt":
        from litgpt.__main__ import main as litgpt_main

        litgpt_main()
    else:
        cli.main()


def finetune_args(assets, command: str, out_dir: Path, liger: str | None, ckpt: Path | None = None) -> list:
    args = [
        command,
        ckpt or assets["ckpt"],
        "--out_dir",
        out_dir,
        "--precision",
        "32-true",
        "--devices",
        1,
        "--data",
        "JSON",
        "--data.json_path",
        assets["data"],
        "--data.val_split_fraction",
        0.1,
        "--data.num_workers",
        0,
        "--train.micro_batch_size",
        MICRO_BATCH,
        "--train.global_batch_size",
        MICRO_BATCH,
        "--train.max_seq_length",
        SEQ,
        "--train.max_steps",
        STEPS,
        "--train.epochs",
        100,
        "--train.lr_warmup_steps",
        1,
        "--train.save_interval",
        100,
        "--eval.interval",
        100,
        "--eval.final_validation",
        "false",
        "--eval.max_iters",
        1,
        "--eval.max_new_tokens",
        4,
        "--logger_name",
        "csv",
    ]
    return args + (["--liger", liger] if liger is not None else [])


def pretrain_args(assets, out_dir: Path, liger: str) -> list:
    return [
        "pretrain",
        "--config",
        assets["pretrain_cfg"],
        "--out_dir",
        out_dir,
        "--precision",
        "32-true",
        "--devices",
        1,
        "--tokenizer_dir",
        assets["ckpt"],
        "--data",
        "lit_liger.demo.LocalText",
        "--data.max_files",
        3,
        "--train.micro_batch_size",
        MICRO_BATCH,
        "--train.global_batch_size",
        MICRO_BATCH,
        "--train.max_seq_length",
        SEQ,
        "--train.max_tokens",
        STEPS * MICRO_BATCH * SEQ,
        "--train.lr_warmup_steps",
        1,
        "--train.save_interval",
        100,
        "--eval.interval",
        100,
        "--eval.max_iters",
        1,
        "--eval.final_validation",
        "false",
        "--logger_name",
        "csv",
        "--liger",
        liger,
    ]


def losses(out_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(out_dir)]


def assert_first_losses_match(on: list[float], off: list[float]) -> None:
    assert len(on) == len(off) == STEPS
    rel = abs(on[0] - off[0]) / abs(off[0])
    assert rel < LOSS_TOL, (on, off)
    assert all(abs(a - b) / abs(b) < 10 * LOSS_TOL for a, b in zip(on, off)), (on, off)


def hparams(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def stock_loads_hparams(monkeypatch, capsys, command: str, hparams_file: Path) -> None:
    """Stock litgpt parses the saved hyperparameters.yaml (no `liger` key) as a --config."""
    assert "liger" not in hparams(hparams_file)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_cli(monkeypatch, [command, "--config", hparams_file, "--print_config"], prog="litgpt")
    assert e.value.code in (0, None)
    assert "checkpoint_dir" in capsys.readouterr().out or command == "pretrain"


def stock_generates(monkeypatch, capsys, args: list) -> str:
    capsys.readouterr()
    run_cli(monkeypatch, [*args, "--prompt", "def", "--max_new_tokens", 4, "--precision", "32-true"], prog="litgpt")
    return capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# End-to-end training runs
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_finetune_full_liger_matches_stock_and_loads_in_litgpt(assets, tmp_path, monkeypatch, capsys):
    from lit_liger.runtime import optim

    monkeypatch.setattr(optim, "DEVICES", ("cuda", "cpu"))  # (the fused AdamW on CPU too, as on a GPU)
    made = []
    real = optim.fuse_optimizer
    monkeypatch.setattr(optim, "fuse_optimizer", lambda opt, *a, **k: made.append(opt) or real(opt, *a, **k))
    capsys.readouterr()
    run_cli(monkeypatch, finetune_args(assets, "finetune_full", tmp_path / "on", "true"))
    out = capsys.readouterr().out
    assert "AdamW steps with PyTorch's fused kernel" in out
    # finetune_full's fit takes the model in `state`: its batches are prepared on the host too, its log deferred
    assert "keep litgpt's token counts on the host" in out and "one iteration later" in out
    assert len(made) == 1 and made[0].param_groups[0]["fused"] is True
    run_cli(monkeypatch, finetune_args(assets, "finetune_full", tmp_path / "off", "false"))
    assert len(made) == 1  # (--liger false: litgpt's own)
    assert_first_losses_match(losses(tmp_path / "on"), losses(tmp_path / "off"))
    final = tmp_path / "on" / "final"
    stock_loads_hparams(monkeypatch, capsys, "finetune_full", final / "hyperparameters.yaml")
    stock_generates(monkeypatch, capsys, ["generate", final])
    # the weights differ from the start: training happened, through the fused loss's gradients
    sd0 = torch.load(assets["ckpt"] / "lit_model.pth", weights_only=True)
    sd1 = torch.load(final / "lit_model.pth", weights_only=True)["model"]
    assert sd0.keys() == sd1.keys()
    assert not torch.equal(sd0["lm_head.weight"], sd1["lm_head.weight"])


@pytest.mark.slow
def test_finetune_full_recompute_mlp_same_losses(assets, tmp_path, monkeypatch, capsys):
    """``--liger.recompute_mlp true`` through litgpt's full fine-tuning script (every weight trains, so the Blocks'
    MLPs recompute fc_1 / fc_2 in backward): the swap report says so, the Blocks call the recomputing function, and
    the logged losses equal the default run's."""
    from lit_liger.swap import block as swap_block

    calls = []
    real = swap_block.rms_norm_glu_mlp
    monkeypatch.setattr(swap_block, "rms_norm_glu_mlp", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_full", tmp_path / "rec", "true"),
                          "--liger.recompute_mlp", "true"])
    assert "fc_1 and fc_2 outputs recomputed in backward (recompute_mlp)" in capsys.readouterr().out
    assert calls, "the Blocks did not run rms_norm_glu_mlp"
    calls.clear()
    run_cli(monkeypatch, finetune_args(assets, "finetune_full", tmp_path / "plain", "true"))
    assert "(recompute_mlp)" not in capsys.readouterr().out and not calls
    assert_first_losses_match(losses(tmp_path / "rec"), losses(tmp_path / "plain"))


def test_finetune_lora_activation_checkpointing_same_losses(assets, tmp_path, monkeypatch, capsys):
    """``--liger.activation_checkpointing true`` through litgpt's LoRA script (LoRA dropout on): the swap report
    says so, and every logged loss equals the run without it (the recompute restores the RNG state, so the
    dropout masks and every later step are the same)."""
    common = ["--lora_dropout", "0.1"]
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path / "ckpt", "true"), *common,
                          "--liger.activation_checkpointing", "true"])
    out = capsys.readouterr().out
    assert "recomputed in backward, only its input kept" in out
    assert re.search(r"lit-liger: the GPU ran [\d,]+ token positions in training for [\d,]+ real tokens: [\d.]+% padding", out)
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path / "plain", "true"), *common])
    on, off = losses(tmp_path / "ckpt"), losses(tmp_path / "plain")
    assert len(on) == len(off) == STEPS and on == off, (on, off)


def test_finetune_lora_on_a_tied_checkpoint_keeps_one_head_copy(assets, tmp_path, monkeypatch, capsys):
    """A checkpoint whose lm_head equals its embedding (litgpt's conversion of a tied-embedding Hugging Face model):
    the LoRA run says it keeps one copy, and every logged loss equals the run with ``--liger.tied_weights false``."""
    ckpt = tmp_path / "tied"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / f).write_bytes((assets["ckpt"] / f).read_bytes())
    vocab = yaml.safe_load((assets["ckpt"] / "model_config.yaml").read_text())["vocab_size"]
    make_checkpoint(ckpt, "Llama-3.2-1B", vocab_size=vocab, n_layer=2, block_size=256, tied_head=True,
                    **tiny_overrides())
    sd = torch.load(ckpt / "lit_model.pth", weights_only=True)
    assert torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    # (the CLI's announcement is on each model's ModelState.on_share: nothing to clear after the run)
    run_cli(monkeypatch, finetune_args(assets, "finetune_lora", tmp_path / "one", "true", ckpt=ckpt))
    assert "one copy kept" in capsys.readouterr().out
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path / "two", "true", ckpt=ckpt),
                          "--liger.tied_weights", "false"])
    assert "one copy kept" not in capsys.readouterr().out
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(one) == len(two) == STEPS and one == two, (one, two)


@pytest.mark.parametrize("script_name", ["finetune.lora", "finetune.full", "pretrain"])
def test_validation_computes_the_fused_loss(script_name):
    """The CLI's patched litgpt ``validate``: without grad the swapped model returns deferred logits there, so the
    validation loss is the fused one (no ``(B, T, V)`` logits held), equal to stock ``validate``'s on the same
    weights; outside it (generation, a user's own no-grad code) the model returns real logits."""
    import copy
    import importlib

    from litgpt.args import EvalArgs
    from litgpt.model import GPT
    from test_adapter import tiny_config

    from lit_liger import LigerConfig, apply_liger
    from lit_liger.swap.loss import LigerLogits

    script = importlib.import_module(f"litgpt.{script_name}")
    cfg = tiny_config("Llama-3.2-1B")
    torch.manual_seed(0)
    stock = GPT(cfg)
    swapped = copy.deepcopy(stock)
    apply_liger(swapped)
    g = torch.Generator().manual_seed(2)
    if script_name == "pretrain":  # (fabric, model, loader of (B, T + 1) token rows, max_iters)
        batches = [torch.randint(0, cfg.vocab_size, (2, 13), generator=g) for _ in range(2)]
        swapped.max_seq_length = stock.max_seq_length = 12

        class _Fabric:
            def barrier(self):
                pass

        def validate(model):
            return script.validate(_Fabric(), model, batches, 2, verbose=False)
    else:  # (fabric, model, loader of {"input_ids", "labels"}, eval)
        batches = [{"input_ids": torch.randint(0, cfg.vocab_size, (2, 12), generator=g),
                    "labels": torch.randint(0, cfg.vocab_size, (2, 12), generator=g)} for _ in range(2)]
        batches[0]["labels"][0, :4] = -100

        def validate(model):
            return script.validate(None, model, batches, EvalArgs(max_iters=2), verbose=False)
    original = script.validate
    want = validate(stock)
    fused = []
    real_loss = LigerLogits.loss
    with pytest.MonkeyPatch.context() as mp, cli._patched(script, LigerConfig()):
        mp.setattr(LigerLogits, "loss", lambda self, *a, **k: fused.append(1) or real_loss(self, *a, **k))
        got = validate(swapped)
    assert len(fused) == 2  # both batches through the fused loss
    assert abs(float(got) - float(want)) <= 1e-5 * abs(float(want)), (got, want)
    with torch.no_grad():
        assert isinstance(swapped(torch.zeros(2, 12, dtype=torch.long)), torch.Tensor)  # elsewhere: real logits
    assert script.validate is original  # restored after the run


@pytest.mark.slow
def test_finetune_bf16_true_liger_matches_stock(assets, tmp_path, monkeypatch):
    """Every litgpt script runs under Fabric's bf16-true precision on GPUs, which casts the model's
    floating outputs to float32 after forward: the fused loss must survive that cast."""
    for liger in ("true", "false"):
        args = finetune_args(assets, "finetune_full", tmp_path / liger, liger)
        args[args.index("--precision") + 1] = "bf16-true"
        run_cli(monkeypatch, args)
    on, off = losses(tmp_path / "true"), losses(tmp_path / "false")
    assert len(on) == len(off) == STEPS
    assert all(abs(a - b) / abs(b) < 2e-2 for a, b in zip(on, off)), (on, off)  # bf16 weights and activations


@pytest.mark.slow
def test_finetune_full_fp8_through_the_cli(assets, tmp_path, monkeypatch, capsys):
    """``--liger.fp8 tensorwise`` through litgpt's full fine-tuning script (bf16-true, CPU: torch's ``_scaled_mm``):
    the report lists the float8 projections, the eager run does not warn (tensorwise runs on lit-liger's own casts,
    fast without torch.compile), the losses stay within float8's error of the 16-bit run's (stock litgpt's: the
    interpreter emulates bf16, a second interpreted run would double the test's minutes; lit-liger's bf16 run equals
    stock's in test_finetune_bf16_true_liger_matches_stock), and differ from them (float8 GEMMs ran), and the
    checkpoint keeps LitGPT's keys and loads in stock litgpt."""
    pytest.importorskip("torchao.float8")
    runs = {}
    for name, extra in (("fp8", ["--liger.fp8", "tensorwise"]), ("bf16", [])):
        args = finetune_args(assets, "finetune_full", tmp_path / name, "true" if name == "fp8" else "false")
        args[args.index("--precision") + 1] = "bf16-true"
        for flag in ("--train.micro_batch_size", "--train.global_batch_size"):  # (one sample a step: the
            args[args.index(flag) + 1] = 1  # interpreter's emulated bf16 is its slowest path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_cli(monkeypatch, [*args, *extra])
        out = capsys.readouterr().out
        runs[name] = losses(tmp_path / name)
        assert not any("fp8 is training without torch.compile" in str(w.message) for w in caught)
        assert ("float8 GEMMs, torchao's 'tensorwise' recipe" in out) is (name == "fp8")
    fp8, bf16 = runs["fp8"], runs["bf16"]
    assert len(fp8) == len(bf16) == STEPS and fp8 != bf16
    assert all(abs(a - b) / abs(b) < 5e-2 for a, b in zip(fp8, bf16)), (fp8, bf16)
    final = tmp_path / "fp8" / "final"
    saved = torch.load(final / "lit_model.pth", weights_only=True)["model"]
    assert saved.keys() == torch.load(assets["ckpt"] / "lit_model.pth", weights_only=True).keys()
    stock_loads_hparams(monkeypatch, capsys, "finetune_full", final / "hyperparameters.yaml")
    stock_generates(monkeypatch, capsys, ["generate", final])


@pytest.mark.slow
def test_finetune_adapter_liger_matches_stock_and_loads_in_litgpt(assets, tmp_path, monkeypatch, capsys):
    ckpt = assets["ckpt3"]
    run_cli(monkeypatch, finetune_args(assets, "finetune_adapter", tmp_path / "on", "true", ckpt=ckpt))
    run_cli(monkeypatch, finetune_args(assets, "finetune_adapter", tmp_path / "off", "false", ckpt=ckpt))
    assert_first_losses_match(losses(tmp_path / "on"), losses(tmp_path / "off"))
    final = tmp_path / "on" / "final"
    stock_loads_hparams(monkeypatch, capsys, "finetune_adapter", final / "hyperparameters.yaml")
    # litgpt's generate_adapter reads the prompt style from the base checkpoint dir and splits its
    # output on the Alpaca "### Response:" marker: give it the finetune's prompt_style.yaml
    base = tmp_path / "base"
    shutil.copytree(ckpt, base)
    shutil.copy(final / "prompt_style.yaml", base)
    stock_generates(monkeypatch, capsys, ["generate_adapter", base, "--adapter_path", final / "lit_model.pth.adapter"])


@pytest.mark.slow
def test_pretrain_liger_matches_stock(assets, tmp_path, monkeypatch, capsys):
    # pretrain wraps the model in torch.compile. Inductor on CPU takes ~40 s per run, so compile with
    # the "eager" backend here: dynamo still traces the swapped model (custom ops, the deferred
    # logits it returns); code generation is tested on the GPU.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    run_cli(monkeypatch, pretrain_args(assets, tmp_path / "on", "true"))
    out = capsys.readouterr().out
    run_cli(monkeypatch, pretrain_args(assets, tmp_path / "off", "false"))
    assert_first_losses_match(losses(tmp_path / "on"), losses(tmp_path / "off"))
    assert any(line.startswith("Measured TFLOPs") for line in out.splitlines())  # the meta-model FLOP count ran
    final = tmp_path / "on" / "final"
    assert (final / "lit_model.pth").is_file()
    stock_loads_hparams(monkeypatch, capsys, "pretrain", final / "hyperparameters.yaml")


@pytest.mark.slow
def test_demo_and_finetune_lora_match_stock_and_load_in_litgpt(tmp_path, monkeypatch, capsys):
    """``lit-liger demo`` end to end (its two ``finetune_lora`` processes run in this one), then the
    LoRA run's outputs: ``--liger false`` equals stock litgpt, the files load in stock litgpt."""
    import lit_liger.demo as demo_mod

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the child entry point sets sys.argv

    def in_process(cmd, env=None, **kwargs):
        assert cmd[:3] == [sys.executable, "-m", "lit_liger.demo"] and env["TRITON_INTERPRET"] == "1"
        demo_mod._run_and_record(cmd[3], cmd[4:])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(demo_mod.subprocess, "run", in_process)
    s = demo_mod.demo(out_dir=tmp_path, steps=STEPS, max_seq_length=SEQ, micro_batch_size=MICRO_BATCH, device="cpu")
    out = capsys.readouterr().out
    assert "no GPU" in out and "tokens/s" in out and "max |loss diff|" in out
    assert "lit-liger:" in out and "fused linear cross-entropy" in out  # the --liger true run's swap report
    assert json.loads((tmp_path / "demo_results.json").read_text())["steps"] == STEPS
    on, off = s["liger_true"]["losses"], s["liger_false"]["losses"]
    assert_first_losses_match(on, off)

    # stock litgpt, the same arguments without --liger: --liger false is exactly stock
    ckpt, data = Path(s["checkpoint_dir"]), Path(s["data_path"])
    args = demo_mod.finetune_command(ckpt, data, tmp_path / "stock", "32-true", MICRO_BATCH, SEQ, STEPS)
    run_cli(monkeypatch, args, prog="litgpt")
    capsys.readouterr()
    assert losses(tmp_path / "stock") == off

    final = tmp_path / "liger-true" / "final"
    h_on, h_stock = (
        hparams(final / "hyperparameters.yaml"),
        hparams(tmp_path / "stock" / "final" / "hyperparameters.yaml"),
    )
    assert (final / "hyperparameters.yaml").read_text().startswith("# lit-liger: trained with liger=true")
    assert {k: v for k, v in h_on.items() if k != "out_dir"} == {k: v for k, v in h_stock.items() if k != "out_dir"}
    stock_loads_hparams(monkeypatch, capsys, "finetune_lora", final / "hyperparameters.yaml")
    # lora's script merged the LoRA weights itself (reading hyperparameters.yaml); stock generate loads them
    assert (final / "lit_model.pth").is_file()
    stock_generates(monkeypatch, capsys, ["generate", final])


def test_pretrain_flop_count_equals_stock():
    """pretrain counts FLOPs on a meta-device model built through its (patched) ``GPT``, with the
    (patched) loss: the swapped model must count what the stock one does (meta tensors take the
    kernels' reference math, whose GEMMs the counter sees), or MFU would be misreported."""
    import litgpt.pretrain as pretrain
    from lightning.fabric.utilities.throughput import measure_flops
    from litgpt import GPT, Config
    from litgpt.utils import chunked_cross_entropy as litgpt_loss

    from lit_liger import LigerConfig
    from lit_liger.swap.adapter import is_swapped

    cfg = Config.from_name("pythia-14m", n_layer=2)
    with cli._patched(pretrain, LigerConfig()), torch.device("meta"):
        x = torch.randint(0, 1, (2, 16))
        meta = pretrain.GPT(cfg)
        assert is_swapped(meta)
        got = pretrain.measure_flops(
            meta, lambda: meta(x), lambda y: pretrain.chunked_cross_entropy(y, x, chunk_size=0)
        )
    with torch.device("meta"):
        ref = GPT(cfg)
        want = measure_flops(ref, lambda: ref(x), lambda y: litgpt_loss(y, x, chunk_size=0))
    assert got == want > 0


# ----------------------------------------------------------------------------------------------
# --liger parsing (no training: the script's main is replaced by one that only builds the model)
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def built_models(monkeypatch):
    """Replace litgpt.finetune.lora.main (what fabric.launch runs) by a stub that builds the model
    through the script's (patched) ``GPT`` and records it, plus the loss function in use."""
    from litgpt.finetune import lora

    built = []

    def fake_main(fabric, devices, seed, config, *args, **kwargs):
        with fabric.init_module():
            model = lora.GPT(config)
        built.append({"model": model, "loss": lora.chunked_cross_entropy})

    monkeypatch.setattr(lora, "main", fake_main)
    return built


def _record_swapped(monkeypatch) -> list:
    """The models the CLI's patched ``GPT`` builds and swaps (through ``lit_liger.apply_liger``), in order."""
    import lit_liger

    made, real = [], lit_liger.apply_liger
    monkeypatch.setattr(lit_liger, "apply_liger", lambda model, config=None: made.append(model) or real(model, config))
    return made


def _lora_cli(assets, monkeypatch, tmp_path, extra: list) -> None:
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path, None), *extra])  # extra wins


def _parse_and_build(assets, monkeypatch, tmp_path, built, extra: list) -> dict:
    _lora_cli(assets, monkeypatch, tmp_path, extra)
    assert len(built) == 1
    return built.pop()


def test_liger_flag_forms(assets, tmp_path, monkeypatch, capsys, built_models):
    from litgpt.finetune import lora
    from litgpt.utils import chunked_cross_entropy as litgpt_loss

    from lit_liger import chunked_cross_entropy as liger_loss
    from lit_liger.swap.adapter import is_swapped

    def attn_norm_gpt(model):
        blk = model.transformer.h[0]
        return is_swapped(blk.attn), is_swapped(blk.norm_1), is_swapped(model)

    # default (no flag) and --liger true: everything swapped, the fused loss in use
    for extra in ([], ["--liger", "true"], ["--liger=true"]):
        b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, extra)
        assert attn_norm_gpt(b["model"]) == (True, True, True) and b["loss"] is liger_loss
    # the built model is LitGPT's LoRA GPT, swapped as apply_liger swaps any model (and it pickles)
    assert isinstance(b["model"], LoraGPT) and type(b["model"]).__bases__[-1] is LoraGPT
    clone = pickle.loads(pickle.dumps(b["model"]))
    assert type(clone) is type(b["model"]) and is_swapped(clone.transformer.h[0].attn)
    # --liger false: nothing patched, stock classes and loss
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--liger", "false"])
    assert attn_norm_gpt(b["model"]) == (False, False, False) and b["loss"] is litgpt_loss
    assert type(b["model"]) is lora.GPT
    # per kernel on the command line: --liger.rope false leaves RoPE (the attention) unswapped
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--liger.rope", "false"])
    assert attn_norm_gpt(b["model"]) == (False, True, True)
    assert "rope switched off" in capsys.readouterr().out  # in the printed swap report
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--liger.fused_linear_cross_entropy", "false"])
    assert attn_norm_gpt(b["model"]) == (True, True, False)
    # a setting: the small-micro-batch threshold under torch.compile (automatic by default, 0 = never)
    assert b["model"].transformer.h[0]._liger_compile_min_elems > 0
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--liger.compile_min_tokens", "0"])
    assert attn_norm_gpt(b["model"]) == (True, True, True)
    assert not hasattr(b["model"].transformer.h[0], "_liger_compile_min_elems")
    # cuda_graphs: automatic (None) by default, true|false on the command line and in YAML
    assert b["model"]._liger_cuda_graphs is None
    for value, want in (("true", True), ("false", False)):
        b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--liger.cuda_graphs", value])
        assert attn_norm_gpt(b["model"]) == (True, True, True) and b["model"]._liger_cuda_graphs is want
    # activation_checkpointing: automatic by default, on from the command line
    assert b["model"]._liger_activation_checkpointing is None
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--liger.activation_checkpointing", "true"])
    assert attn_norm_gpt(b["model"]) == (True, True, True) and b["model"]._liger_activation_checkpointing is True
    # a `liger:` mapping in a --config file
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"liger": {"cuda_graphs": False}}))
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--config", cfg])
    assert b["model"]._liger_cuda_graphs is False
    cfg.write_text(yaml.safe_dump({"liger": {"rope": False, "rms_norm": False}}))
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--config", cfg])
    assert attn_norm_gpt(b["model"]) == (False, False, True)
    cfg.write_text(yaml.safe_dump({"liger": False}))
    b = _parse_and_build(assets, monkeypatch, tmp_path, built_models, ["--config", cfg])
    assert attn_norm_gpt(b["model"]) == (False, False, False)
    # the script's names are restored after the call
    assert lora.GPT is LoraGPT and lora.chunked_cross_entropy is litgpt_loss
    from litgpt.parser_config import save_hyperparameters

    assert lora.save_hyperparameters is save_hyperparameters


def test_post_training_generate_example_same_with_and_without_liger(assets, tmp_path, monkeypatch, capsys):
    """The finetune scripts' generation example (KV cache, no grad) runs on the swapped, fabric-wrapped
    model and samples the same tokens as stock."""
    from litgpt.finetune import lora
    from litgpt.tokenizer import Tokenizer

    def fake_main(fabric, devices, seed, config, data, checkpoint_dir, out_dir, train, eval, *args, **kwargs):
        tokenizer = Tokenizer(checkpoint_dir)
        data.connect(tokenizer=tokenizer, batch_size=1, max_seq_length=256)
        data.setup()
        fabric.seed_everything(seed)
        with fabric.init_module():
            model = lora.GPT(config)
        lora.load_checkpoint(fabric, model, checkpoint_dir / "lit_model.pth", strict=False)
        model = fabric.setup_module(model)
        model.max_seq_length = 256  # room for the prompt + the new tokens
        torch.manual_seed(0)
        lora.generate_example(fabric, model, tokenizer, eval, data)

    monkeypatch.setattr(lora, "main", fake_main)
    short = tmp_path / "short.json"  # a prompt that fits the tiny model's context
    short.write_text(
        json.dumps([{"instruction": f"Name a number {i}.", "input": "", "output": str(i)} for i in range(8)])
    )
    outputs = {}
    for liger in ("true", "false"):
        capsys.readouterr()
        _lora_cli(
            assets, monkeypatch, tmp_path, ["--liger", liger, "--eval.max_new_tokens", 6, "--data.json_path", short]
        )
        out = capsys.readouterr().out
        assert "Length of encoded instruction" not in out  # generation was not skipped
        outputs[liger] = out.split("### Response:")[-1]
    assert outputs["true"] == outputs["false"] and outputs["true"].strip()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--liger", "maybe"], "liger"),
        (["--liger.bogus", "false"], "bogus"),
        (["--liger.rope", "2"], "rope"),
        (["--liger.flce_mode", "fastest"], "flce_mode"),
        (["--liger.compile_min_tokens", "-5"], "compile_min_tokens"),
    ],
)
def test_bad_liger_values_fail_clearly(assets, tmp_path, monkeypatch, capsys, built_models, extra, needle):
    with pytest.raises(SystemExit) as e:
        _parse_and_build(assets, monkeypatch, tmp_path, built_models, extra)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "error" in err.lower()
    assert not built_models


@pytest.mark.parametrize("extra", [["--liger.sdpa_backend", "bogus"], ["--liger.sdpa_backend=bogus"],
                                   ["--liger.flce_mode", "fastest"]])
def test_bad_liger_choice_names_the_allowed_values(assets, tmp_path, monkeypatch, capsys, built_models, extra):
    """A setting with a fixed set of values: the message names the field and every allowed value (jsonargparse's
    own, through the bool | LigerConfig union, said "Cannot take a Union of no types")."""
    with pytest.raises(SystemExit) as e:
        _parse_and_build(assets, monkeypatch, tmp_path, built_models, extra)
    assert e.value.code == 2
    err = capsys.readouterr().err
    if "sdpa_backend" in extra[0]:
        assert "--liger.sdpa_backend must be one of auto, flash, cudnn, efficient, math, torch; got 'bogus'" in err
    else:
        assert "--liger.flce_mode must be one of fast, lean; got 'fastest'" in err
    assert not built_models


def test_liger_choice_check_leaves_good_and_other_arguments_alone():
    ok = ["--liger.sdpa_backend", "flash", "--liger.flce_mode=lean", "--liger.rope", "false", "--liger", "true",
          "--data.sdpa_backend", "bogus", "--liger.sdpa_backend"]  # the last: no value (jsonargparse's to report)
    assert cli._liger_choice_errors(ok) == []


def test_help_documents_liger(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, ["finetune_full", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--liger LIGER" in out and "--liger.rope false" in out and "stock litgpt" in out
    assert "fused_linear_cross_entropy" in out and "flce_mode (fast|lean)" in out
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, ["--help"])
    out = capsys.readouterr().out
    for cmd in ("download", "chat", "generate", "merge_lora", "serve", "demo", "doctor", "check"):
        assert cmd in out


def test_every_litgpt_subcommand_passes_through():
    from litgpt.__main__ import PARSER_DATA

    data = cli.parser_data()
    assert set(PARSER_DATA) <= set(data)
    for name, fn in PARSER_DATA.items():
        if name in cli.TRAINING_COMMANDS:
            import inspect

            params = inspect.signature(data[name]).parameters
            assert list(params)[:-1] == list(inspect.signature(fn).parameters) and "liger" in params
        else:
            assert data[name] is fn


def test_python_m_entry_point_as_lightning_relaunches_it():
    # Lightning's subprocess launcher re-executes `python -m <__main__.__spec__.name> argv...`
    proc = subprocess.run(
        [sys.executable, "-m", "lit_liger.__main__", "finetune_lora", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--liger LIGER" in proc.stdout


# ----------------------------------------------------------------------------------------------
# hyperparameters.yaml
# ----------------------------------------------------------------------------------------------
def test_saved_hyperparameters_drop_liger(tmp_path, monkeypatch):
    from litgpt.finetune.full import setup

    monkeypatch.setattr(
        sys, "argv", ["lit-liger", "finetune_full", "ckpt", "--liger.rope", "false", "--train.max_steps", "7"]
    )
    cli.save_hyperparameters(setup, tmp_path)
    text = (tmp_path / "hyperparameters.yaml").read_text()
    assert (
        text.splitlines()[0].startswith("# lit-liger: trained with liger=") and '"rope": false' in text.splitlines()[0]
    )
    h = yaml.safe_load(text)
    assert "liger" not in h and h["train"]["max_steps"] == 7 and h["checkpoint_dir"] == "ckpt"


# ----------------------------------------------------------------------------------------------
# configs/
# ----------------------------------------------------------------------------------------------
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def _command_for(path: Path) -> str:
    name = path.stem
    if "pretrain" in path.parts or name.startswith("pretrain"):
        return "pretrain"
    for kind in ("lora", "full", "adapter_v2", "adapter"):
        if kind in name:
            return f"finetune_{kind}"
    raise AssertionError(f"cannot tell the subcommand of {path}")


def test_configs_exist():
    assert len(CONFIGS) >= 6, CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_config_parses_with_print_config(path, monkeypatch, capsys):
    assert "liger" in yaml.safe_load(path.read_text())
    with pytest.raises(SystemExit) as e:
        run_cli(monkeypatch, [_command_for(path), "--config", path, "--print_config"])
    assert e.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert "liger" in printed


# ----------------------------------------------------------------------------------------------
# doctor, check
# ----------------------------------------------------------------------------------------------
def test_doctor_runs_on_cpu(monkeypatch, capsys):
    run_cli(monkeypatch, ["doctor"])
    out = capsys.readouterr().out
    from lit_liger.doctor import _KERNELS

    for needle in ("torch", "triton", "lightning", "litgpt", *_KERNELS):
        assert needle in out
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "1":
        assert "interpreter" in out and "MISMATCH" not in out and "FAILED" not in out
        assert out.count("ok (rel err") == len(_KERNELS) == 7  # one checked row per kernel, softcap_attention too


def test_doctor_reports_missing_optional_pieces_with_the_install_line(monkeypatch, capsys):
    import importlib.util

    from lit_liger import doctor as doctor_mod

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    rows = {r["package"]: r for r in doctor_mod.optional_pieces()}
    assert set(rows) == {"liger-kernel", "matplotlib", "deepspeed", "bitsandbytes", "torchao"}
    assert rows["matplotlib"]["status"] == "missing" and "[bench]" in rows["matplotlib"]["fix"]
    assert rows["matplotlib"]["fix"].startswith("pip install")
    run_cli(monkeypatch, ["doctor", "--run", "false"])
    out = capsys.readouterr().out
    assert "optional pieces" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("matplotlib"))
    assert "missing" in line and "pip install" in line and "[bench]" in line


def test_check_on_cpu_passes_and_fails_on_parity(assets, monkeypatch, capsys):
    args = ["check", "--checkpoint_dir", assets["ckpt"], "--seq_len", 16, "--batch_size", 1]
    run_cli(monkeypatch, args)
    out = capsys.readouterr().out
    assert "PASS" in out and "worst rel err" in out and "lit-liger:" in out
    with pytest.raises(SystemExit) as e:  # an impossible tolerance: parity "fails", non-zero exit
        run_cli(monkeypatch, [*args, "--tolerance", 1e-30, "--liger.rope", "false"])
    assert e.value.code == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "rope switched off" in out


def test_check_random_init_by_name(monkeypatch, capsys):
    from lit_liger.doctor import check

    r = check(model="pythia-14m", n_layer=1, seq_len=8, batch_size=1, device="cpu")
    assert r["ok"] and r["worst_grad_rel_err"] < r["tolerance"]
    assert "layer_norm" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# GPU (skipped without CUDA)
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_demo_on_gpu(tmp_path):
    from lit_liger.demo import demo

    s = demo(out_dir=tmp_path, n_layer=2, steps=8, max_seq_length=512)
    assert s["max_loss_diff"] < 5e-2  # bf16 over 8 steps
    assert s["liger_true"]["peak_memory_gb"] < s["liger_false"]["peak_memory_gb"]


@pytest.mark.gpu
@pytest.mark.parametrize("command", ["finetune_full", "finetune_lora"])
def test_finetune_two_gpus(assets, tmp_path, command):
    """``--liger false``: litgpt's FSDPStrategy (FSDP1, finetune_full) / ModelParallelStrategy (FSDP2, finetune_lora);
    ``--liger true``: the automatic data-parallel plan (a replica per GPU for this tiny model). The same first losses."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    outs = {}
    for liger in ("true", "false"):
        args = finetune_args(assets, command, tmp_path / liger, liger)
        args[args.index("--devices") + 1] = 2
        gbs = args.index("--train.global_batch_size") + 1
        args[gbs] = 2 * int(args[gbs])  # one micro-batch per device per step
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run(
            [sys.executable, "-m", "lit_liger", *map(str, args)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[liger] = losses(tmp_path / liger)
    assert_first_losses_match(outs["true"], outs["false"])


def _two_process_run(assets, tmp_path, command: str, name: str, liger: list, steps: int = 3,
                     interpret: bool = True, **given: Any) -> tuple[list, str]:
    """``lit-liger COMMAND`` on 2 CPU processes (gloo), one micro-batch per device per step, no dropout, a learning
    rate that moves the weights visibly: (losses, stdout). ``interpret`` false: without TRITON_INTERPRET (CPU tensors
    take the reference PyTorch path). ``given``: arguments' values in place of :func:`finetune_args`' (``train__x``
    for ``--train.x``)."""
    args = finetune_args(assets, command, tmp_path / name, None)
    args[args.index("--devices") + 1] = 2
    args[args.index("--train.max_steps") + 1] = steps
    gbs = args.index("--train.global_batch_size") + 1
    args[gbs] = 2 * int(args[gbs])
    for key, value in given.items():
        args[args.index("--" + key.replace("__", ".")) + 1] = value
    args += ["--optimizer", json.dumps({"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.02}})]
    if command == "finetune_lora":
        # (litgpt's FSDP2 recomputes each Block without restoring the random state: no dropout, to compare)
        args += ["--lora_dropout", "0"]
    env = {k: v for k, v in os.environ.items() if interpret or k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "lit_liger", *map(str, args), *liger], capture_output=True, text=True,
                          timeout=600, check=False, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return losses(tmp_path / name), proc.stdout


@pytest.mark.parametrize("command", ["finetune_lora", "finetune_full"])
def test_data_parallel_replica_two_processes(assets, tmp_path, command):
    """``--devices 2`` with the defaults (``data_parallel`` auto: the tiny model fits, so a replica per device,
    lit-liger's ReplicaStrategy) on 2 CPU processes (gloo), said once in the log. Against the same plan with every
    kernel switched off (LitGPT's own code on replicas) and against a replicated run where Lightning's own DDP
    reduces (``lit_liger.parallel.dataparallel`` off: every kernel off and ``--liger.data_parallel litgpt`` would be litgpt's
    FSDP, so DDP is forced through the strategy's name): the same loss at every iteration and the same weights
    saved. Against stock litgpt's sharded run (LoRA: FSDP2; litgpt's FSDP1 of full fine-tuning needs a GPU,
    ``test_gpu_data_parallel_matches_stock``): the same first losses. The reduction itself against DDP:
    tests/test_distributed.py."""
    from lit_liger import LigerConfig

    off = [a for s in LigerConfig.switches() if s != "embedding" for a in (f"--liger.{s}", "false")]
    variants = [("kernels-off", off), ("liger", [])]
    if command == "finetune_lora":
        variants.append(("stock", ["--liger", "false"]))
    runs = {name: _two_process_run(assets, tmp_path, command, name, liger) for name, liger in variants}
    recipe = command.split("_")[-1]
    said = f"lit-liger: data parallel on 2 devices, {command}: the whole model on every device"
    assert runs["liger"][1].count(said) == runs["kernels-off"][1].count(said) == 1, runs["liger"][1][-3000:]
    (plain, _), (ours, out) = runs["kernels-off"], runs["liger"]
    assert len(ours) == len(plain) == 3 and ours[-1] != ours[0]
    assert all(abs(a - b) / abs(b) < LOSS_TOL for a, b in zip(ours, plain)), (ours, plain)
    if "stock" in runs:  # (FSDP2 initializes the LoRA A matrices in another random order: until the first step)
        stock, stock_out = runs["stock"]
        assert "lit-liger: data parallel" not in stock_out
        assert all(abs(a - b) / abs(b) < LOSS_TOL for a, b in zip(ours[:2], stock[:2])), (ours, stock)
    # the single-process machinery on each replica: the deferred log; the collector's objects frozen for the loop
    assert "one iteration later" in out
    assert "objects alive at the start frozen (gc.freeze); the longest full collection of any process" in out
    name = "lit_model.pth.lora" if recipe == "lora" else "lit_model.pth"
    saved = {n: torch.load(tmp_path / n / "final" / name, weights_only=True) for n in runs}
    saved = {n: v.get("model", v) for n, v in saved.items()}
    assert saved["kernels-off"].keys() == saved["liger"].keys() and saved["liger"]
    if "stock" in saved:
        assert saved["stock"].keys() == saved["liger"].keys()
    for k, v in saved["kernels-off"].items():  # (fp32; Adam's steps magnify a last-bit difference of a tiny gradient)
        assert torch.linalg.vector_norm(saved["liger"][k] - v) <= 1e-4 * torch.linalg.vector_norm(v) + 1e-7, k


def test_data_parallel_zero1_two_processes(assets, tmp_path):
    """``--liger.data_parallel zero1`` (full fine-tuning, 2 CPU processes): the replica with the optimizer's state
    sharded gives the replica's losses and weights, and its mid-run checkpoint holds the whole optimizer state, equal
    to the replica's."""
    runs = {}
    for name, liger in (("replicate", ["--liger.data_parallel", "replicate"]),
                        ("zero1", ["--liger.data_parallel", "zero1"])):
        runs[name] = _two_process_run(assets, tmp_path, "finetune_full", name, [*liger, "--train.save_interval", "2"])
    (ref, _), (ours, out) = runs["replicate"], runs["zero1"]
    assert out.count("the optimizer's state sharded across them") == 1, out[-3000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("lit-liger: zero1: "))
    shares = [int(x.rstrip("%")) for x in line.split("elements per device ")[1].split(" of ")[0].split(", ")]
    assert len(shares) == 2 and min(shares) >= 40, line  # (both devices step a share, near half)
    assert len(ours) == len(ref) == 3 and all(abs(a - b) / abs(b) < LOSS_TOL for a, b in zip(ours, ref)), (ours, ref)
    saved = {n: torch.load(tmp_path / n / "step-000002" / "lit_model.pth", weights_only=True) for n in runs}
    for k, v in saved["replicate"]["model"].items():
        assert torch.linalg.vector_norm(saved["zero1"]["model"][k] - v) <= 1e-4 * torch.linalg.vector_norm(v) + 1e-7, k
    opt = {n: s["optimizer"]["state"] for n, s in saved.items()}
    n_params = len(saved["replicate"]["model"])
    assert len(opt["zero1"]) == len(opt["replicate"]) == n_params
    for i, entry in opt["replicate"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = opt["zero1"][i][key].float(), entry[key].float()
            assert torch.linalg.vector_norm(a - b) <= 1e-3 * torch.linalg.vector_norm(b) + 1e-9, (i, key)
        assert float(opt["zero1"][i]["step"]) == float(entry["step"]) == 2.0


def test_data_parallel_deals_micro_batches_by_length(assets, tmp_path):
    """``--liger.balance_ranks`` (default on) under the replica plan, 2 CPU processes, two micro-batches per device and
    optimizer step, lengths up to 256 tokens: the log says the micro-batches were dealt and how even the devices'
    positions per step came out against litgpt's order (better); each step trains on the same micro-batches as
    litgpt's order (the weights saved after 4 steps equal the run with the deal off, to float rounding), and the first
    iteration's is litgpt's (its logged loss equal; later ones are litgpt's running mean over the step's iterations,
    which takes in the dealt ones)."""
    data = tmp_path / "short.json"  # (short instructions: 178-304 tokens with the prompt, one per micro-batch)
    make_instruction_dataset(data, source_files(), n=40, max_chars=250)
    runs = {name: _two_process_run(assets, tmp_path, "finetune_full", name, flag, steps=4, interpret=False,
                                   data__json_path=data, train__max_seq_length=256, train__micro_batch_size=1,
                                   train__global_batch_size=4)
            for name, flag in (("dealt", []), ("litgpt", ["--liger.balance_ranks", "false"]))}
    (ours, out), (ref, ref_out) = runs["dealt"], runs["litgpt"]
    assert "dealt to the devices by their estimated length" in out and "dealt" not in ref_out
    line = next(ln for ln in out.splitlines() if "micro-batches were dealt by length" in ln)
    changed = int(line.split("(")[1].split(" of ")[0])
    dealt = float(line.split("busiest device ran ")[1].split("%")[0])
    litgpt = float(line.split("against ")[1].split("%")[0])
    assert changed >= 1 and dealt < litgpt, line
    assert len(ours) == len(ref) == 8 and ours[1:] != ref[1:]  # (rank 0 logged other micro-batches)
    assert abs(ours[0] - ref[0]) / abs(ref[0]) < LOSS_TOL, (ours, ref)
    saved = {n: torch.load(tmp_path / n / "final" / "lit_model.pth", weights_only=True) for n in runs}
    saved = {n: v.get("model", v) for n, v in saved.items()}
    for k, v in saved["litgpt"].items():
        assert torch.linalg.vector_norm(saved["dealt"][k] - v) <= 1e-4 * torch.linalg.vector_norm(v) + 1e-7, k


def test_data_parallel_litgpt_keeps_litgpt_strategy(assets, tmp_path):
    """``--liger.data_parallel litgpt``: litgpt's own strategy (FSDP2 for LoRA; said in the log)."""
    _, out = _two_process_run(assets, tmp_path, "finetune_lora", "litgpt", ["--liger.data_parallel", "litgpt"],
                              steps=2)
    assert "finetune_lora: litgpt's own strategy; as asked (--liger.data_parallel litgpt)" in out


def test_data_parallel_patches_each_recipe(capsys):
    """Each recipe's strategy name points, for the run, to a class whose construction gives the plan's strategy
    and against which ``isinstance`` still means litgpt's class; put back after."""
    import importlib

    from lit_liger import LigerConfig
    from lit_liger.parallel.dataparallel import STRATEGY_NAMES, Plan, replica_class

    for module_name, class_name in STRATEGY_NAMES.items():
        module = importlib.import_module(module_name)
        original = getattr(module, class_name)
        for plan, expect in ((Plan("replicate", ""), "ReplicaStrategy"), (Plan("shard", ""), "FSDPStrategy")):
            if plan.name == "shard" and class_name != "FSDPStrategy":
                continue
            with cli._patched(module, LigerConfig(), plan):
                strategy = getattr(module, class_name)(auto_wrap_policy=None)
                assert type(strategy).__name__ == expect
                assert isinstance(strategy, replica_class()) == (expect == "ReplicaStrategy")
                if expect == "FSDPStrategy":
                    assert isinstance(strategy, getattr(module, class_name))
                    assert str(strategy.sharding_strategy).endswith("SHARD_GRAD_OP")
            assert getattr(module, class_name) is original
        with cli._patched(module, LigerConfig(), Plan("litgpt", "")):
            assert getattr(module, class_name) is original


def test_selfcheck_module_on_cpu():
    # what the README tells a newcomer to run: `python -m lit_liger.selfcheck`, with TRITON_INTERPRET
    # unset (the package is imported before the self-check can switch the interpreter on)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-m", "lit_liger.selfcheck"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "triton (interpreter)" in proc.stdout and "all kernels match their references" in proc.stdout
    for op in ("rms_norm_linear", "rope_qkv", "fused_linear_cross_entropy"):
        assert op in proc.stdout


def test_padding_report_counts():
    """The run's padding line from litgpt's token counts and the swapped model's own: real 600 of 1,000 positions
    run, 800 collated (litgpt's padding) plus 200 from lit-liger's buckets."""
    from lit_liger.cli import padding_report

    line = padding_report({"raw_tokens_plus_prompt_template": torch.tensor(600)}, {"collated": 800, "processed": 1000})
    assert line == ("lit-liger: the GPU ran 1,000 token positions in training for 600 real tokens: 40.0% padding "
                    "(litgpt's collate padded to 800, 25.0%; lit-liger's length buckets added 200)")
    assert padding_report(None, {"collated": 8, "processed": 8}) is None  # pretrain's fit returns nothing
    assert padding_report({"raw_tokens_plus_prompt_template": 5}, {"collated": 0, "processed": 0}) is None


@pytest.mark.slow
def test_finetune_lora_packed_by_the_data_loader_matches_stock(assets, tmp_path, monkeypatch, capsys):
    """``--liger.packing true`` through the CLI: the data loader lays each batch out packed on the host
    (``batches.LigerCollate``), so the forward reads no lengths back from the device and the loss checks the left-out
    targets from the loader's finding; litgpt's token counts stay on the host. Losses equal stock's, and so does
    every token count litgpt reports."""
    from lit_liger.swap import adapter as adapter_mod
    from lit_liger.swap import packing
    from lit_liger.swap.state import states_in

    monkeypatch.setattr(swap_gpt, "_PACK_ON_CPU", True)
    rng = random.Random(0)  # short samples of different lengths: batches with padding to pack
    words = "def return value list self model data index tensor shape".split()
    data = tmp_path / "short.json"
    data.write_text(json.dumps([{"instruction": "Write it.", "input": "",
                                 "output": " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))}
                                for _ in range(40)]))
    longer = ["--train.max_seq_length", 128, "--data.json_path", data]  # (the last value wins)
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path / "off", "false"), *longer])
    off = capsys.readouterr().out
    planned, plan = [], packing.plan
    monkeypatch.setattr(packing, "plan", lambda *a, **k: planned.append(plan(*a, **k)) or planned[-1])
    swapped = _record_swapped(monkeypatch)  # (the packed run's models: their loss checks start at 0)
    run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path / "on", "true"), *longer,
                          "--liger.packing", "true"])
    on = capsys.readouterr().out
    assert_first_losses_match(losses(tmp_path / "on"), losses(tmp_path / "off"))
    assert "lay each batch out packed, so that the step reads nothing back from the GPU" in on
    assert "lit-liger packed the batches of" in on  # (the padding line: packing happened)
    assert all(p is None for p in planned)  # every batch with padding came planned by the loader
    states = [st for m in swapped for st in states_in(m)]
    assert states
    assert sum(st.loss_checks["host"] for st in states) > 0
    assert sum(st.loss_checks["device"] for st in states) == 0
    counts = [re.findall(r"(Tokens w/ Prompt|Total Tokens \(w/ Padding\)|Raw Tokens)\s*:\s*(\d+)", out)
              for out in (on, off)]
    assert counts[0] == counts[1] and len(counts[0]) >= 2, counts


@pytest.mark.slow
def test_finetune_ending_by_epochs_with_saves_leaves_no_worker_to_the_collector(assets, tmp_path, monkeypatch,
                                                                              terminated):
    """litgpt's ``fit`` that ends by its epochs has started the training loader's workers again (the ``next()`` that
    found the epochs done), and its saves leave its frame in a reference cycle. Collected, such an iterator makes
    PyTorch wait 5 s for each worker and terminate it; the ``lit-liger`` command stops them as ``fit`` returns
    (``lit_liger.runtime.loaders``), so none is terminated and none is left running."""
    import gc
    import multiprocessing

    data = tmp_path / "few.json"  # (an epoch of 5 steps: the assets' 36 training samples are 18 interpreted steps)
    data.write_text(json.dumps(json.loads(Path(assets["data"]).read_text())[:11]))
    args = [*finetune_args(assets, "finetune_lora", tmp_path / "out", "true"), "--data.num_workers", 2,
            "--train.max_steps", 1000, "--train.epochs", 1, "--train.save_interval", 4,
            "--data.json_path", data]  # (the last value wins)
    enabled = gc.isenabled()
    gc.disable()  # (the cycle then lives until the collection below)
    try:
        run_cli(monkeypatch, args)
        gc.collect()
    finally:
        if enabled:
            gc.enable()
    assert (tmp_path / "out" / "step-000004").is_dir()  # (a save ran)
    assert terminated == []
    assert multiprocessing.active_children() == []


def test_batches_off_the_host_puts_litgpt_collate_back():
    """The training DataLoader gets ``LigerCollate`` for the run and litgpt's own collate back after it."""
    from litgpt.data.base import get_sft_collate_fn
    from torch.utils.data import DataLoader

    from lit_liger.runtime.batches import AfterMove, LigerCollate
    from lit_liger.cli import _batches_off_the_host

    gpt = torch.nn.Linear(2, 2)
    gpt._liger_packing, gpt._liger_pack_why, gpt._liger_seq_buckets = True, None, True
    collate = get_sft_collate_fn()
    loader = DataLoader([{"input_ids": torch.arange(1, 4), "labels": torch.arange(1, 4),
                          "token_counts": {"raw": 3, "raw_plus_prompt_template": 3}}], collate_fn=collate)
    wrapped, restore, packed = _batches_off_the_host(gpt, loader, rank0=False)
    assert isinstance(wrapped, AfterMove) and isinstance(loader.collate_fn, LigerCollate) and len(wrapped) == 1
    assert packed
    (batch,) = list(wrapped)
    assert torch.is_tensor(batch["token_counts"]["raw"])
    restore()
    assert loader.collate_fn is collate
    assert _batches_off_the_host(torch.nn.Linear(2, 2), loader, rank0=False) is None  # no swapped GPT: unchanged
    assert _batches_off_the_host(gpt, DataLoader([1, 2]), rank0=False) is None  # not litgpt's collate


def test_liger_collate_travels_to_workers_and_back():
    """``LigerCollate`` pickles (data loader workers started with spawn / forkserver), keeps litgpt's batch, adds the
    packed layout, and the token counts come back as host tensors after the move (``AfterMove``)."""
    from litgpt.data.base import get_sft_collate_fn

    from lit_liger.runtime.batches import AfterMove, LigerCollate
    from lit_liger.swap.packing import BATCH_KEY, ready_plan

    samples = [{"input_ids": torch.arange(1, L + 1), "labels": torch.arange(1, L + 1),
                "token_counts": {"raw": L - 2, "raw_plus_prompt_template": L}} for L in (5, 9, 7)]
    collate = pickle.loads(pickle.dumps(LigerCollate(get_sft_collate_fn(ignore_index=-7), pack=True, bucketed=False)))
    assert collate.ignore_index == -7
    batch = pickle.loads(pickle.dumps(collate(samples)))  # (a worker's batch reaches the main process pickled)
    stock = get_sft_collate_fn(ignore_index=-7)(samples)
    assert torch.equal(batch["input_ids"], stock["input_ids"]) and torch.equal(batch["labels"], stock["labels"])
    assert BATCH_KEY in batch
    (out,) = list(AfterMove([batch]))
    assert BATCH_KEY not in out and out["token_counts"].keys() == stock["token_counts"].keys()
    for k, v in stock["token_counts"].items():
        assert torch.equal(out["token_counts"][k], v) and out["token_counts"][k].device.type == "cpu"
    plan = ready_plan(out["input_ids"], False, 64)
    assert plan is not None and plan.real == 21 and plan.check.ignore_index == -7
    no_pack = LigerCollate(get_sft_collate_fn(), pack=False, bucketed=False)(samples)
    assert BATCH_KEY not in no_pack


@pytest.mark.parametrize("by_value", [1 << 20, 0])
def test_liger_collate_batches_reach_the_loop_by_value_from_workers(monkeypatch, by_value):
    """``batches.BY_VALUE_BYTES``: a batch from a DataLoader's worker processes (2 workers) reaches the loop as a plain
    dict of the same tensors as litgpt's collate in the loop's process makes, its small tensors sent as bytes (not
    through shared memory: they arrive as tensors of the loop's own memory), and with 0 through shared memory."""
    from litgpt.data.base import get_sft_collate_fn
    from torch.utils.data import DataLoader

    from lit_liger.runtime import batches as batches_mod
    from lit_liger.runtime.batches import AfterMove, LigerCollate
    from lit_liger.swap.packing import BATCH_KEY

    monkeypatch.setattr(batches_mod, "BY_VALUE_BYTES", by_value)
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(1, 99, (L,), generator=g), "labels": torch.randint(1, 99, (L,), generator=g),
                "token_counts": {"raw": L - 2, "raw_plus_prompt_template": L}} for L in (5, 9, 7, 3, 8, 6, 12, 4)]
    collate = LigerCollate(get_sft_collate_fn(ignore_index=-100), pack=True, bucketed=True)
    got = list(DataLoader(samples, batch_size=4, num_workers=2, collate_fn=collate, multiprocessing_context="fork"))
    want = [collate(samples[:4]), collate(samples[4:])]
    assert len(got) == 2
    for b, w in zip(got, want):
        assert type(b) is dict and b.keys() == w.keys()
        for k in ("input_ids", "labels"):
            assert type(b[k]) is torch.Tensor and b[k].dtype == w[k].dtype and torch.equal(b[k], w[k])
        assert torch.equal(b[BATCH_KEY][0], w[BATCH_KEY][0]) and b[BATCH_KEY][1] == w[BATCH_KEY][1]
        # (the fork-started workers see the patched module)
        assert all(t.is_shared() is not bool(by_value) for t in (b["input_ids"], b["labels"], b[BATCH_KEY][0]))
        (out,) = list(AfterMove([b]))
        for k, v in get_sft_collate_fn()(samples[:4] if b is got[0] else samples[4:])["token_counts"].items():
            assert torch.equal(out["token_counts"][k], v)
    # a tensor of every dtype and shape, large and empty ones included, round-trips by value
    for t in (torch.randn(3, 4).to(torch.bfloat16), torch.tensor(True), torch.zeros(0, 5), torch.arange(7.0)[::2]):
        back = pickle.loads(pickle.dumps(batches_mod._Batch({"t": t})))["t"]
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)


@pytest.mark.gpu
def test_gpu_liger_collate_batches_arrive_pinned():
    """In a process that uses CUDA a batch from the loader's workers arrives in pinned memory (batches.BY_VALUE_BYTES):
    its move to the device does not wait for the GPU's queued work."""
    from litgpt.data.base import get_sft_collate_fn
    from torch.utils.data import DataLoader

    from lit_liger.runtime.batches import LigerCollate
    from lit_liger.swap.packing import BATCH_KEY

    torch.zeros(1, device="cuda")  # (CUDA in use in this process)
    samples = [{"input_ids": torch.arange(1, L + 1), "labels": torch.arange(1, L + 1),
                "token_counts": {"raw": L - 2, "raw_plus_prompt_template": L}} for L in (5, 9, 7, 3)]
    collate = LigerCollate(get_sft_collate_fn(), pack=True, bucketed=True)
    (b,) = list(DataLoader(samples, batch_size=4, num_workers=1, collate_fn=collate, multiprocessing_context="fork"))
    want = collate(samples)
    for k in ("input_ids", "labels", BATCH_KEY):
        t, w = (b[k], want[k]) if k != BATCH_KEY else (b[k][0], want[k][0])
        assert t.is_pinned() and torch.equal(t, w)


def _csv_rows(out_dir: Path) -> list[dict]:
    import csv

    rows = []
    for f in sorted(out_dir.rglob("metrics.csv")):
        rows += list(csv.DictReader(open(f)))
    return rows


_TIMED = re.compile(r"(iter|val) time: [0-9.]+ ms")


@pytest.mark.slow
def test_deferred_loss_sync_logs_the_same_values(assets, tmp_path, monkeypatch, capsys):
    """``defer_loss_sync`` (lit_liger.runtime.lazylog): litgpt's LoRA loop with gradient accumulation (a running-loss window
    of 2), validation and its log lines in between; every value in metrics.csv and every printed line equal those of
    the run without it, timings aside, in the same order."""
    from lit_liger.runtime import lazylog

    made = []
    real = lazylog.RunningMean.__init__
    monkeypatch.setattr(lazylog.RunningMean, "__init__", lambda self, *a, **k: made.append(self) or real(self, *a, **k))
    extra = ["--train.global_batch_size", 2 * MICRO_BATCH, "--train.max_steps", 3, "--eval.interval", 2]
    outs = {}
    for name, flag in (("sync", "false"), ("deferred", "true")):
        capsys.readouterr()
        run_cli(monkeypatch, [*finetune_args(assets, "finetune_lora", tmp_path / name, "true"), *extra,
                              "--liger.defer_loss_sync", flag])
        outs[name] = capsys.readouterr().out
    assert len(made) == 1  # (the deferred run's, window 2)
    assert made[0].window == 2 and made[0].seen == 6
    assert "reads each logged loss and token count one iteration later" in outs["deferred"]
    lines = {k: [_TIMED.sub(r"\1 time: - ms", line) for line in v.splitlines()
                 if line.startswith(("Epoch", "iter ")) or "val loss" in line] for k, v in outs.items()}
    assert len(lines["sync"]) == 6 + 1 and lines["deferred"] == lines["sync"], lines
    rows = {k: _csv_rows(tmp_path / k) for k in outs}
    timed = ("iter_time", "time", "/sec", "_per_sec", "throughput", "val_time")
    assert len(rows["sync"]) >= 6 and len(rows["deferred"]) == len(rows["sync"])
    for a, b in zip(rows["deferred"], rows["sync"]):
        assert a.keys() == b.keys()
        assert {k: v for k, v in a.items() if not any(t in k for t in timed)} == \
               {k: v for k, v in b.items() if not any(t in k for t in timed)}
    assert any(r.get("loss") for r in rows["deferred"]) and any(r.get("val_loss") for r in rows["deferred"])
