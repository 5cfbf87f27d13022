"""The Lightning Trainer front-end on litgpt's SFT data: a LightningModule written for stock LitGPT (LoRA on a
random-init Llama-3.2-1B, litgpt's JSON data module and SFT collate, micro-batch 4, 4 accumulated batches per
optimizer step, bf16-true), with and without LigerCallback. Tokens/s over real tokens between batch WARM and the end
(one device sync at each end)."""
import json, os, subprocess, sys, time
from pathlib import Path

WORK = Path("/tmp/lit-liger-bench/finetune-work")
WARM = 40


def child(ckpt, data_json, variant, batches):
    import torch, lightning as L
    from litgpt.data import JSON
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.tokenizer import Tokenizer
    from litgpt.utils import chunked_cross_entropy

    class Mod(L.LightningModule):
        def __init__(self):
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
        def __init__(self):
            self.tokens, self.t0, self.t1, self.losses = [], None, None, []

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            if i == WARM - 1:
                torch.cuda.synchronize(); self.t0 = time.perf_counter()
            elif i >= WARM:
                self.tokens.append(batch["token_counts"]["raw_plus_prompt_template"])
            if i == batches - 1:
                torch.cuda.synchronize(); self.t1 = time.perf_counter()

    tok = Tokenizer(Path(ckpt))
    data = JSON(json_path=Path(data_json), val_split_fraction=0.02, num_workers=2)
    data.connect(tok, batch_size=4, max_seq_length=512)
    data.prepare_data(); data.setup()
    timer = Timer()
    callbacks = [timer]
    if variant != "stock":
        from lit_liger import LigerCallback, LigerConfig
        callbacks.append(LigerCallback(LigerConfig(packing=variant != "liger-padded"), log_metrics=False))
    torch.manual_seed(0)
    module = Mod()
    trainer = L.Trainer(accelerator="cuda", devices=1, precision="bf16-true", max_steps=batches // 4,
                        accumulate_grad_batches=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks)
    torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, train_dataloaders=data.train_dataloader())
    toks = int(sum(int(t.sum()) for t in timer.tokens))
    wall = timer.t1 - timer.t0
    print(json.dumps({"variant": variant, "tok_s": round(toks / wall), "ms_per_batch": round(1e3 * wall / (batches - WARM), 2),
                      "mfu": round(4 * 1.236e9 * toks / wall / 989e12, 4), "tokens": toks,
                      "alloc_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
                      "reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 2),
                      "fused_opt": trainer.optimizers[0].param_groups[0].get("fused")}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(*sys.argv[2:5], int(sys.argv[5]))
        sys.exit(0)
    sys.path.insert(0, os.getcwd())
    from benchmarks import finetune as F
    from benchmarks.recipe import make_alpaca_like
    ckpt, _, _ = F.build_inputs(WORK, "Llama-3.2-1B", 16, smoke=False, n_samples=8, max_seq_length=512)
    data = WORK / "data" / f"alpaca-like-{ckpt.name}-4000.json"
    make_alpaca_like(data, ckpt, 4000)
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    for variant in sys.argv[1].split(","):
        out = subprocess.run([sys.executable, __file__, "child", str(ckpt), str(data), variant, str(batches)],
                             capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
        print(lines[-1] if lines else f"{variant}: failed\n{out.stderr[-3000:]}", flush=True)
        if lines:
            with open(os.path.join(os.environ.get("OUT", "."), "trainer.jsonl"), "a") as f:
                f.write(lines[-1] + "\n")
