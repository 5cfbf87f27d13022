"""Pieces shared by the device diagnostics (``python -m benchmarks diag NAME``)."""
import math
import statistics

import torch


def cuda_median_ms(fn, n=20, warmup=3):
    """Median milliseconds of ``fn()`` between two CUDA events, after ``warmup`` untimed calls (no L2 clearing:
    back-to-back calls, as a training step runs them)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def recipe_model(name: str = "Llama-3.2-1B", block_size: int = 512, n_layer: int | None = None, lora: bool = True,
                 device: str = "cuda"):
    """A LitGPT model as litgpt's recipes train it (random init, seed 0, bf16 weights, ``n_layer`` None: full depth):
    with ``lora``, the recipe's LoRA (r 8 on query and value, dropout 0.05), only the LoRA parameters trainable; else
    the plain GPT, every parameter trainable. Returns (config, model)."""
    extra = {} if n_layer is None else {"n_layer": n_layer}
    if lora:
        from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

        cfg = Config.from_name(name, block_size=block_size, lora_r=8, lora_alpha=16, lora_query=True,
                               lora_value=True, lora_dropout=0.05, **extra)
    else:
        from litgpt.model import GPT, Config

        cfg = Config.from_name(name, block_size=block_size, **extra)
    torch.manual_seed(0)
    with torch.device(device):
        m = GPT(cfg).to(torch.bfloat16)
    if lora:
        mark_only_lora_as_trainable(m)
    return cfg, m


def gemma2_recipe_model(name: str = "gemma-2-2b", n_layer: int = 26, dropout: float = 0.1, head: bool = True,
                        block_size: int = 512):
    """A random bf16 model of ``name`` with gemma2-2b's shipped LoRA recipe's LoRA (r 8, alpha 16, every projection
    and, with ``head``, the head; ``dropout``), only the LoRA parameters trainable, lit-liger applied with CUDA graphs,
    in training mode, on the GPU. Returns (config, model)."""
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from lit_liger import LigerConfig, apply_liger

    cfg = Config.from_name(name, n_layer=n_layer, block_size=block_size, lora_r=8, lora_alpha=16, lora_dropout=dropout,
                           lora_query=True, lora_key=True, lora_value=True, lora_projection=True, lora_mlp=True,
                           lora_head=head)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(cfg).to(torch.bfloat16)
    mark_only_lora_as_trainable(model)
    apply_liger(model, LigerConfig(cuda_graphs=True))
    model.train()
    return cfg, model


def lora_llama_1b(device="cuda"):
    """Full-depth Llama-3.2-1B with litgpt's recipe LoRA at max_seq_length 512 (:func:`recipe_model`)."""
    return recipe_model("Llama-3.2-1B", 512, device=device)


def alpaca_length(rng, cap: int) -> int:
    """One sample's tokens, Alpaca-shaped: 40 (prompt) plus a lognormal output of median 150 (sigma 0.75), at most
    ``cap`` (``rng``: a ``random.Random``)."""
    return min(cap, 40 + int(rng.lognormvariate(math.log(150), 0.75)))


def live_at_peak(trace):
    """A CUDA memory-history trace (``torch.cuda.memory._snapshot()["device_traces"][0]``) replayed: the bytes live at
    its peak (over the trace's start) and the alloc events of the blocks live then."""
    live, cur, best, at_peak = {}, 0, -1, {}
    for ev in trace:
        a = ev["action"]
        if a == "alloc":
            live[ev["addr"]] = ev
            cur += ev["size"]
            if cur > best:
                best, at_peak = cur, dict(live)
        elif a == "free_requested" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])["size"]
    return best, list(at_peak.values())


def group_at_peak(at_peak, keys=("lit_liger", "kernels/", "litgpt", "checkpoint"), depth=4, top=10):
    """:func:`live_at_peak`'s blocks grouped by their first ``depth`` frames from files matching ``keys``:
    ``[{"MiB", "n", "where"}]``, biggest first (``"?"``: no such frame)."""
    groups: dict[str, list] = {}
    for ev in at_peak:
        frames = [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in ev.get("frames", [])
                  if any(k in f["filename"] for k in keys)][:depth]
        g = groups.setdefault(" <- ".join(frames) or "?", [0, 0])
        g[0] += ev["size"]
        g[1] += 1
    return [{"MiB": round(s / (1 << 20), 1), "n": n, "where": k}
            for k, (s, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]]
