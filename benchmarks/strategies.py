"""Lightning Trainer + ``LigerCallback`` under Lightning's distributed strategies, ``--liger`` on vs off.

    python -m benchmarks.strategies --strategy fsdp|modelparallel|deepspeed2|deepspeed3 --liger true|false
                                    [--variant bf16|fp8|fp8-float8-gather|fp8-bf16-gather|bf16-foreach-adam] [--init configure_model|meta]
                                    [--devices 2] [--steps 20] [--model Llama-3.2-1B] [--n_layer N]
                                    [--micro_batch_size 2] [--seq 1024] --json RESULT.json

One training run (Lightning launches one process per device and re-runs this command line in each).
The model is a random-init LitGPT ``GPT`` of the named config's shape, built in ``configure_model``
(under ZeRO-3 that is DeepSpeed's sharded init; for ``modelparallel`` it is FSDP2 ``fully_shard`` on
each ``Block`` and the root, done there too). Every rank draws its own batches of random tokens from a
seeded generator, so a ``--liger true`` and a ``--liger false`` run see the same data. Rank 0 writes
its per-step losses, step times and peak memory to ``--json``.

``python -m benchmarks strategies [--strategies fsdp,modelparallel,deepspeed2,deepspeed3] [--devices 2]
[--steps 20] [--variants bf16,fp8,fp8-float8-gather,fp8-bf16-gather] [--init meta] [--out DIR]`` runs it for each strategy with
``--liger false`` (stock LitGPT in bf16) and then ``--liger true`` once per variant (fresh processes), and writes
``strategies.json`` / ``strategies.md``: per strategy and variant, whether both ran, the largest relative loss
difference over the steps (target <= 1%), step time, tokens/s, MFU and peak memory per GPU.

Variants of the lit-liger run (``LigerCallback``'s ``LigerConfig``): ``bf16`` (the default config), ``fp8``
(``fp8="tensorwise"``: float8 GEMMs in the Block projections, ``fp8_all_gather`` automatic), ``fp8-float8-gather``
(``fp8_all_gather=True``: under ``modelparallel`` FSDP2 gathers the projections' weights in float8, where the callback
swaps the model before ``configure_model`` shards it, i.e. with ``--init meta``) and ``fp8-bf16-gather``
(``fp8_all_gather=False``: 16-bit all-gather, cast after), ``bf16-foreach-adam`` (``fused_optimizer=False``: the
module's AdamW as built, torch's foreach, as every FSDP2 run stepped before the switch to PyTorch's fused kernel took
DTensors). ``--init meta`` (FSDP2 only) builds the GPT on the meta device in the module's ``__init__``, as litgpt's FSDP2 recipe does: the callback
swaps it in ``setup``, ``configure_model`` shards it and Lightning materializes it (``reset_parameters``); the
default builds and shards it in ``configure_model`` (the callback swaps it after).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import lightning as L
import torch

STRATEGIES = ("fsdp", "modelparallel", "deepspeed2", "deepspeed3")
#: the lit-liger run's LigerConfig per variant (the stock run is always LitGPT in bf16)
VARIANTS = {"bf16": {}, "fp8": {"fp8": "tensorwise"},
            "fp8-float8-gather": {"fp8": "tensorwise", "fp8_all_gather": True},
            "fp8-bf16-gather": {"fp8": "tensorwise", "fp8_all_gather": False},
            "bf16-foreach-adam": {"fused_optimizer": False}}


class Module(L.LightningModule):
    def __init__(self, model_name: str, n_layer: int | None, vocab_size: int | None, init: str = "configure_model"
                 ) -> None:
        super().__init__()
        self.model_name, self.n_layer, self.vocab_size = model_name, n_layer, vocab_size
        self.model = None
        if init == "meta":  # as litgpt's FSDP2 recipe: built empty, swapped by the callback, sharded, materialized
            with torch.device("meta"):
                self.model = self._gpt()
        self.losses: list[float] = []
        self.step_times: list[float] = []
        self._t = 0.0

    def _gpt(self):
        from litgpt import GPT, Config

        over = {"n_layer": self.n_layer} if self.n_layer else {}
        if self.vocab_size:
            over.update(vocab_size=self.vocab_size, padded_vocab_size=self.vocab_size)
        torch.manual_seed(0)
        return GPT(Config.from_name(self.model_name, **over))

    def configure_model(self) -> None:
        from torch.distributed.fsdp import FSDPModule

        if self.model is None:
            self.model = self._gpt()
        elif not isinstance(self.trainer.strategy, L.pytorch.strategies.ModelParallelStrategy) or any(
                isinstance(m, FSDPModule) for m in self.model.modules()):
            return  # built already (and sharded, where this shards it)
        if isinstance(self.trainer.strategy, L.pytorch.strategies.ModelParallelStrategy):
            from litgpt.model import Block
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for m in self.model.modules():
                if isinstance(m, Block):
                    fully_shard(m, mesh=mesh)
            fully_shard(self.model, mesh=mesh)

    def training_step(self, batch, batch_idx):
        from lit_liger import chunked_cross_entropy

        x, y = batch
        out = self.model(x)
        loss = chunked_cross_entropy(out, y)  # LitGPT's own function when the model returns logits
        return loss

    def on_train_batch_start(self, batch, batch_idx):
        torch.cuda.synchronize()
        self._t = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        torch.cuda.synchronize()
        self.step_times.append(time.perf_counter() - self._t)
        self.losses.append(float(outputs["loss"].detach()))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.0)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int, seed: int = 7) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq + 1), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i, :-1], self.data[i, 1:]


def _median_ms(run: dict) -> float:
    times = run["step_s"][3:] or run["step_s"]
    return 1e3 * sorted(times)[len(times) // 2]


def strategy_for(name: str, devices: int):
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
    from litgpt.model import Block

    if name == "fsdp":
        return FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block},
                            state_dict_type="full", sharding_strategy="FULL_SHARD")
    if name == "modelparallel":
        return ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    if name == "deepspeed2":
        return DeepSpeedStrategy(stage=2)
    if name == "deepspeed3":
        return DeepSpeedStrategy(stage=3)
    raise ValueError(f"unknown strategy {name!r}; choose from {STRATEGIES}")


def _run_options(p: argparse.ArgumentParser) -> None:
    """The options one run takes (and ``compare`` passes on to each run)."""
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", default="Llama-3.2-1B")
    p.add_argument("--n_layer", type=int, default=None)
    p.add_argument("--micro_batch_size", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--init", choices=("configure_model", "meta"), default="configure_model",
                   help="meta: the GPT built on the meta device in __init__, swapped before sharding (modelparallel)")


def compare(argv: list[str]) -> dict:
    """Both runs of each strategy, in fresh processes; the comparison table."""
    from . import _common as C

    p = argparse.ArgumentParser(prog=f"{C.PROG} strategies")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--variants", default="bf16", help=f"lit-liger runs, comma-separated: {', '.join(VARIANTS)}")
    _run_options(p)
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    out = a.out or C.default_out_dir(False)
    out.mkdir(parents=True, exist_ok=True)
    result = {"kind": "strategies", "environment": C.environment(), "settings": vars(a) | {"out": str(out)},
              "rows": []}
    cols = ["strategy", "variant", "GPUs", "stock", "liger", "swapped", "max step loss diff", "final loss",
            "stock ms/step", "liger ms/step", "x speed", "liger tok/s", "liger MFU", "stock GB", "liger GB", "x mem",
            "status"]
    for strat in [x for x in a.strategies.split(",") if x]:
        runs = {}
        for liger, variant in (("false", "bf16"), *(("true", v) for v in variants)):
            name = f"{strat}-{liger}" + ("" if variant == "bf16" else f"-{variant}")
            path = out / "strategies_runs" / f"{name}.json"
            path.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", f"{C.PACKAGE}.strategies", "--strategy", strat, "--liger", liger,
                   "--variant", variant, "--init", a.init,
                   "--devices", str(a.devices), "--steps", str(a.steps), "--model", a.model,
                   "--micro_batch_size", str(a.micro_batch_size), "--seq", str(a.seq), "--json", str(path)]
            if a.n_layer:
                cmd += ["--n_layer", str(a.n_layer)]
            t0 = time.perf_counter()
            rc, text, err = C.run_with_timeout(cmd, a.timeout, cwd=C.REPO_ROOT if C.PACKAGE == "benchmarks" else None)
            text += err
            (out / "strategies_runs").mkdir(parents=True, exist_ok=True)
            keep = text if len(text) < 40000 else text[:20000] + "\n[...]\n" + text[-20000:]
            (out / "strategies_runs" / f"{name}.log").write_text(keep)
            r = json.loads(path.read_text()) if path.is_file() else {}
            r.update(rc=rc, process_s=time.perf_counter() - t0)
            if rc != 0 and not r.get("error"):
                tail = [ln for ln in str(text).strip().splitlines() if ln.strip()][-1:] or [""]
                r["error"] = tail[0][:300]
            runs[variant if liger == "true" else "stock"] = r
            print(f"# {name}: rc={rc} steps={len(r.get('losses', []))} {r.get('error') or ''}", flush=True)
        off = runs["stock"]
        for variant in variants:
            on = runs[variant]
            row = {"strategy": strat, "variant": variant, "devices": a.devices, "runs": {"false": off, "true": on},
                   "stock": "ok" if off.get("rc") == 0 else "FAILED", "liger": "ok" if on.get("rc") == 0 else "FAILED",
                   "swapped": on.get("swapped"), "liger_report": on.get("liger_report")}
            if off.get("rc") == 0 and on.get("rc") == 0 and off.get("losses") and on.get("losses"):
                pairs = list(zip(on["losses"], off["losses"]))
                row["max_step_loss_rel_diff"] = max(abs(x - y) / abs(y) for x, y in pairs)
                row["final_loss"] = on["losses"][-1]
                row["stock_ms"], row["liger_ms"] = _median_ms(off), _median_ms(on)
                row["speedup"] = row["stock_ms"] / row["liger_ms"]
                row["liger_tokens_per_s"] = a.devices * a.micro_batch_size * a.seq / (row["liger_ms"] / 1e3)
                if on.get("flops_per_step") and C.nominal_bf16_TFLOPs(result["environment"]["device"]):
                    per_gpu = on["flops_per_step"] / (row["liger_ms"] / 1e3) / 1e12  # (one GPU's batch per step)
                    row["liger_mfu_bf16"] = per_gpu / C.nominal_bf16_TFLOPs(result["environment"]["device"])
                row["stock_gb"], row["liger_gb"] = off["peak_memory_gb"], on["peak_memory_gb"]
                row["memory_ratio"] = row["liger_gb"] / row["stock_gb"]
                wrong = [why for why, bad in (("LOSS DRIFT", row["max_step_loss_rel_diff"] > 0.01),
                                              ("STEPS MISSING", len(pairs) != a.steps),
                                              ("NOT SWAPPED", not row["swapped"])) if bad]
                row["status"] = " / ".join(wrong) or "ok"
            else:
                row["status"] = "FAILED: " + (on.get("error") or off.get("error") or "?")
            result["rows"].append(row)
        C.write_json(out / "strategies.json", result)
    table = [[r["strategy"], r["variant"], r["devices"], r["stock"], r["liger"], r.get("swapped"),
              r.get("max_step_loss_rel_diff"), r.get("final_loss"), r.get("stock_ms"), r.get("liger_ms"),
              r.get("speedup"), r.get("liger_tokens_per_s"), r.get("liger_mfu_bf16"), r.get("stock_gb"),
              r.get("liger_gb"), r.get("memory_ratio"), r["status"]] for r in result["rows"]]
    print(C.text_table(cols, table))
    env = result["environment"]
    md = [f"# Lightning Trainer + LigerCallback under distributed strategies: {env['device']}, {env['date']}", "",
          f"{a.model} shape{f' ({a.n_layer} layers)' if a.n_layer else ''}, random init "
          f"({'on the meta device in `__init__`, materialized after sharding' if a.init == 'meta' else 'in `configure_model`'}), "
          f"bf16-true, micro-batch {a.micro_batch_size} x {a.seq} tokens per GPU, {a.steps} steps, AdamW; "
          f"torch {env['torch']}, lightning {env.get('lightning')}, torchao {env.get('torchao', '-')}, "
          f"lit-liger {env['lit_liger']} ({env.get('lit_liger_commit')}). ms/step: median after 3 steps, rank 0; "
          "tok/s: all GPUs; MFU: one GPU's training FLOPs per step (6 x non-embedding parameters + attention, per "
          "token) over the GPU's nominal dense bf16 FLOP/s, float8 runs included; GB: rank 0's peak allocated.", "",
          f"Command: `{C.PROG} strategies " + " ".join(argv) + "`", "",
          C.markdown_table(cols, table), ""]
    for r in result["rows"]:
        if r.get("liger_report"):
            md += [f"{r['strategy']} / {r['variant']}: lit-liger's float8 line: {r['liger_report']}", ""]
    (out / "strategies.md").write_text("\n".join(md))
    C.write_json(out / "strategies.json", result)
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.strategies", description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", required=True, choices=STRATEGIES)
    p.add_argument("--liger", required=True, choices=("true", "false"))
    p.add_argument("--variant", choices=tuple(VARIANTS), default="bf16", help="the lit-liger run's LigerConfig")
    _run_options(p)
    p.add_argument("--json", type=Path, required=True, help="where rank 0 writes its results")
    a = p.parse_args(argv)

    from litgpt import Config

    from lit_liger import LigerCallback, LigerConfig

    if a.init == "meta" and a.strategy != "modelparallel":
        p.error("--init meta: FSDP2 (modelparallel) only; the other strategies build the model in configure_model")
    config = Config.from_name(a.model, **({"n_layer": a.n_layer} if a.n_layer else {}))
    vocab = config.padded_vocab_size
    module = Module(a.model, a.n_layer, None, a.init)
    callbacks = [LigerCallback(LigerConfig(**VARIANTS[a.variant]))] if a.liger == "true" else []
    precision = "bf16-true"
    trainer = L.Trainer(
        accelerator="cuda", devices=a.devices, strategy=strategy_for(a.strategy, a.devices), precision=precision,
        max_steps=a.steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        use_distributed_sampler=True,
    )
    data = RandomTokens(a.steps * a.micro_batch_size * a.devices, a.seq, vocab)
    loader = torch.utils.data.DataLoader(data, batch_size=a.micro_batch_size, shuffle=False)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    error = tb = None
    res: dict = {}
    try:
        trainer.fit(module, loader)
    except Exception as exc:  # noqa: BLE001 - recorded for the comparison table, then re-raised
        import traceback

        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        tb = traceback.format_exc()[-4000:]
        raise
    finally:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            from . import _common as C
            from .step import flops_per_step

            report = str(callbacks[0].report) if callbacks and callbacks[0].report is not None else ""
            res = {
                "strategy": a.strategy, "liger": a.liger, "variant": a.variant, "init": a.init, "devices": a.devices,
                "model": a.model,
                "n_layer": a.n_layer, "B": a.micro_batch_size, "T": a.seq, "steps": a.steps,
                "precision": precision, "losses": module.losses, "step_s": module.step_times,
                "peak_memory_gb": torch.cuda.max_memory_allocated() / 1e9, "wall_s": time.perf_counter() - t0,
                "swapped": bool(a.liger == "true" and module.model is not None
                                and type(module.model).__name__.startswith("Liger")),
                "error": error, "traceback": tb,
                "liger_report": next((ln.strip() for ln in report.splitlines() if "float8" in ln), None),
                "flops_per_step": flops_per_step(config, C.n_params(config), config.padded_vocab_size * config.n_embd,
                                                 a.micro_batch_size, a.seq),
            }
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
