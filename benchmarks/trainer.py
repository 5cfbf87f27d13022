"""The Lightning Trainer front-end on 1 and N GPUs: a LightningModule written for stock LitGPT, with and without
``LigerCallback``.

    python -m benchmarks trainer [--devices 1,2] [--variants stock,liger] [--batches 300] [--warm 40] [--out DIR]
                                 [--cprofile DIR,FIRST,COUNT]

LoRA (q, v; r 8, dropout 0.05) on a random-init Llama-3.2-1B (all 16 layers, its real widths), litgpt's ``JSON`` data
module and SFT collate over Alpaca-shaped samples (``benchmarks.recipe.make_alpaca_like``), micro-batch 4,
``accumulate_grad_batches=4``, ``AdamW`` from ``configure_optimizers``, bf16-true, no logger or progress bar. With
``--devices N`` > 1 the Trainer runs ``strategy="ddp"`` (Lightning launches the processes; Lightning's
``DistributedSampler`` gives each rank its share). As in any Lightning run, ``accumulate_grad_batches`` counts each
rank's own micro-batches: on N GPUs an optimizer step takes N times the samples.

Each (devices, variant) runs in fresh processes: ``--batches`` training micro-batches per rank, timed from batch
``--warm`` to the end with one device sync at each end; tokens are the real tokens of the timed batches (litgpt's
``token_counts``), summed over the ranks. MFU: ``4 N`` FLOPs per token (frozen base; N the matmul parameters) over the
GPUs' nominal bf16 FLOP/s. Rows go to ``trainer.jsonl`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import _common as C

WORK = C.SMOKE_DIR / "finetune-work"
VARIANTS = ("stock", "liger", "liger-padded")


def child(ckpt: str, data_json: str, variant: str, batches: int, warm: int, devices: int, cprofile: str = "") -> None:
    import lightning as L
    import torch
    from litgpt.data import JSON
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.tokenizer import Tokenizer
    from litgpt.utils import chunked_cross_entropy

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            cfg = Config.from_file(Path(ckpt) / "model_config.yaml", lora_r=8, lora_alpha=16, lora_dropout=0.05,
                                   lora_query=True, lora_value=True)
            self.model = GPT(cfg)
            mark_only_lora_as_trainable(self.model)

        def training_step(self, batch, i):
            logits = self.model(batch["input_ids"], lm_head_chunk_size=128)
            logits[-1] = logits[-1][..., :-1, :]
            return chunked_cross_entropy(logits, batch["labels"][..., 1:])

        def configure_optimizers(self):
            return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=2e-4, weight_decay=0.0)

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.tokens, self.t0, self.t1, self.start = 0, None, None, time.perf_counter()
            # LIT_LIGER_PROFILE=DIR,FIRST,COUNT: a per-rank profile of those batches (counted here: a hook on the GPT
            # would turn its CUDA graphs off)
            from lit_liger.runtime import profiling

            self.profile = profiling.window_from_env(int(os.environ.get("LOCAL_RANK", "0")))
            # --cprofile DIR,FIRST,COUNT: the host's Python (cProfile) over those batches, per rank:
            # DIR/cprofile-{devices}gpu-rank{R}.txt (where a host-bound step's time goes; it slows that window)
            spec = cprofile.split(",")
            self.cprof = (Path(spec[0]), int(spec[1]), int(spec[2])) if len(spec) == 3 else None
            self.seen = 0

        def on_train_batch_start(self, trainer, module, batch, i):
            if self.profile is not None:
                self.profile.tick()
            if self.cprof is not None:
                import cProfile

                out, first, count = self.cprof
                if self.seen == first:
                    self.prof = cProfile.Profile()
                    self.prof.enable()
                elif self.seen == first + count:
                    self.prof.disable()
                    _dump_cprofile(self.prof, out, devices, count)
            self.seen += 1

        def on_train_batch_end(self, trainer, module, outputs, batch, _i):
            # (counted over epochs: under DDP each rank's epoch holds 1 / N of the data set)
            i = self.n = getattr(self, "n", -1) + 1
            if i == warm - 1:
                torch.cuda.synchronize()
                self.t0 = time.perf_counter()
            elif i >= warm:
                self.tokens += int(batch["token_counts"]["raw_plus_prompt_template"].sum())
            if i == batches - 1:
                torch.cuda.synchronize()
                self.t1 = time.perf_counter()
            if i % 100 == 0 and trainer.global_rank == 0:  # (a run stopped at its timeout says how far it got)
                print(f"batch {i} at {time.perf_counter() - self.start:.1f} s", flush=True)

    tok = Tokenizer(Path(ckpt))
    data = JSON(json_path=Path(data_json), val_split_fraction=0.02, num_workers=2)
    data.connect(tok, batch_size=4, max_seq_length=512)
    data.prepare_data()
    data.setup()
    timer = Timer()
    callbacks: list = [timer]
    if variant != "stock":
        from lit_liger import LigerCallback, LigerConfig

        callbacks.append(LigerCallback(LigerConfig(packing=variant != "liger-padded"), log_metrics=False))
    torch.manual_seed(0)
    module = Module()
    trainer = L.Trainer(accelerator="cuda", devices=devices, strategy="ddp" if devices > 1 else "auto",
                        precision="bf16-true", max_epochs=-1, accumulate_grad_batches=4, logger=False,
                        max_steps=batches // 4 + 4,  # (an epoch's end steps a partial accumulation: a few to spare)
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks)
    torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, train_dataloaders=data.train_dataloader())
    if timer.profile is not None:
        timer.profile.close()
    wall = timer.t1 - timer.t0
    tokens = trainer.strategy.reduce(torch.tensor(float(timer.tokens), device=trainer.strategy.root_device),
                                     reduce_op="sum")
    wall = float(trainer.strategy.reduce(torch.tensor(wall, device=trainer.strategy.root_device), reduce_op="max"))
    if trainer.global_rank != 0:
        return
    n = sum(p.numel() for name, p in module.model.named_parameters() if p.dim() == 2 and "wte" not in name)
    peak = C.nominal_bf16_TFLOPs(torch.cuda.get_device_name()) or 989.4
    tok_s = float(tokens) / wall
    row = {"devices": devices, "variant": variant, "tok_s": round(tok_s),
           "ms_per_batch": round(1e3 * wall / (batches - warm), 2),
           "mfu_per_gpu": round(4 * n * tok_s / devices / (peak * 1e12), 4), "tokens": int(tokens),
           "alloc_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
           "reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 2),
           "fused_opt": trainer.optimizers[0].param_groups[0].get("fused"), "device": torch.cuda.get_device_name()}
    if variant != "stock":
        from lit_liger.swap.state import state_of

        counts = state_of(module.model).captures
        row.update({f"graphs_{k}": counts[k] for k in ("captures", "precaptured", "replays")})
    print("ROW " + json.dumps(row), flush=True)


def _dump_cprofile(prof, out: Path, devices: int, count: int) -> None:
    """``prof``'s top functions by own time and by cumulative time, per batch, to ``out``."""
    import io
    import pstats

    out.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    text.write(f"cProfile over {count} training batches ({devices} GPU(s)); divide times by {count} for per batch\n")
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(60)
    rank = os.environ.get("LOCAL_RANK", "0")
    (out / f"cprofile-{devices}gpu-rank{rank}.txt").write_text(text.getvalue())


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog=f"{C.PROG} trainer", description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="1", help="comma-separated GPU counts, e.g. 1,2")
    p.add_argument("--variants", default="stock,liger", help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--batches", type=int, default=300, help="training micro-batches per rank")
    p.add_argument("--warm", type=int, default=40, help="untimed micro-batches first")
    p.add_argument("--samples", type=int, default=4000, help="samples in the data set")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--cprofile", default="", metavar="DIR,FIRST,COUNT",
                   help="the host's Python under cProfile over batches FIRST..FIRST+COUNT-1 of each run, per rank: "
                        "DIR/cprofile-{devices}gpu-rank{R}.txt (it slows that window)")
    opts = p.parse_args(argv)
    from . import finetune as F
    from .recipe import make_alpaca_like

    ckpt, _, _ = F.build_inputs(WORK, "Llama-3.2-1B", 16, smoke=False, n_samples=8, max_seq_length=512)
    data = WORK / "data" / f"alpaca-like-{ckpt.name}-{opts.samples}.json"
    if not data.exists():
        make_alpaca_like(data, ckpt, opts.samples)
    opts.out.mkdir(parents=True, exist_ok=True)
    for devices in (int(d) for d in opts.devices.split(",")):
        for variant in opts.variants.split(","):
            cmd = [sys.executable, "-m", "benchmarks.trainer", "child", str(ckpt), str(data), variant,
                   str(opts.batches), str(opts.warm), str(devices), opts.cprofile]
            _, text, err = C.run_with_timeout(cmd, opts.timeout)  # (a timeout: what it printed, progress included)
            rows = [line[4:] for line in text.splitlines() if line.startswith("ROW ")]
            if rows:
                row = json.loads(rows[-1])
                print(json.dumps(row), flush=True)
                with open(opts.out / "trainer.jsonl", "a") as f:
                    f.write(json.dumps({**row, "env": C.environment()}) + "\n")
            else:
                print(f"{devices} GPU(s) {variant}: failed\n{(err or '')[-3000:]}", flush=True)
            lines = [line for line in (text + "\n" + (err or "")).splitlines()
                     if "lit-liger" in line and ("graph" in line.lower() or "warn" in line.lower())]
            with open(opts.out / f"trainer-{devices}gpu-{variant}.log", "w") as f:
                f.write(text + "\n--- stderr\n" + (err or ""))
            for line in lines[:4]:
                print("   " + line[:240], flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        a = sys.argv[2:]
        child(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]), *a[6:7])
    else:
        main(sys.argv[1:])
