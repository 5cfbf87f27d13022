"""Where CUDA graphs stop paying, and what a Block keeps per token (issue 47): one GPU, LoRA (r 8 on query and value,
dropout 0.05), bf16, one micro-batch of ``T`` tokens (B = 1), fused AdamW, lit-liger's defaults.

usage: python -m benchmarks diag graph-gain [OUT.json]   (env: MODELS=Llama-3.2-1B:16,Llama-3.1-8B:8 (name:layers),
                                                          TOKENS=1024,2048,4096,8192,16384, STEPS=8)

Per model and length: the median step time (CUDA events around forward, backward and optimizer) uncaptured and
captured (``cuda_graphs_max_tokens`` lifted), their ratio, the tokens x Block-parameters product that
``lit_liger.runtime.graphs.CAPTURE_MAX_WORK`` compares; and, uncaptured with ``activation_checkpointing=False``, the step's
peak allocated memory above the weights per token and layer next to ``lit_liger.runtime.memplan.kept_bytes_per_token``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from ._common import recipe_model


def _time(model, x, steps: int) -> tuple[float, float]:
    from lit_liger import chunked_cross_entropy

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    times = []
    for i in range(steps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if i == 3:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        a.record()
        loss = chunked_cross_entropy(model(x), x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        b.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b))
    return statistics.median(times), torch.cuda.max_memory_allocated() - base


def main() -> None:
    from lit_liger import LigerConfig, apply_liger
    from lit_liger.runtime import graphs
    from lit_liger.runtime import memplan

    steps = int(os.environ.get("STEPS", 8))
    tokens = [int(t) for t in os.environ.get("TOKENS", "1024,2048,4096,8192,16384").split(",")]
    rows = []
    for spec in os.environ.get("MODELS", "Llama-3.2-1B:16,Llama-3.1-8B:8").split(","):
        name, n_layer = spec.split(":")
        for T in tokens:
            cfg, model = recipe_model(name, max(T, 512), int(n_layer))
            block = sum(p.numel() for p in model.transformer.h[0].parameters())
            x = torch.randint(0, 8192, (1, T), device="cuda")
            row = {"model": name, "n_layer": cfg.n_layer, "tokens": T, "block_params": block,
                   "tokens_x_block_params": T * block}
            try:
                apply_liger(model, LigerConfig(cuda_graphs=False, activation_checkpointing=False, packing=False))
                row["eager_ms"], peak = _time(model, x, steps)
                row["kept_bytes_per_token_layer"] = peak / T / cfg.n_layer
                row["estimate_bytes_per_token_layer"] = memplan.kept_bytes_per_token(cfg)
                apply_liger(model, LigerConfig(cuda_graphs=True, cuda_graphs_max_tokens=10**9,
                                               activation_checkpointing=False, packing=False))
                row["graphs_ms"], _ = _time(model, x, steps)
                row["graphs_speedup"] = row["eager_ms"] / row["graphs_ms"]
                row["captured"] = graphs.runner_for(model).captures
            except torch.cuda.OutOfMemoryError as e:
                row["error"] = str(e).splitlines()[0][:160]
            rows.append(row)
            print(json.dumps(row), flush=True)
            graphs.release(model)
            del model
            torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "capture_max_work": graphs.CAPTURE_MAX_WORK, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
