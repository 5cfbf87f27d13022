"""Pieces shared by the device diagnostics (``python -m benchmarks diag NAME``)."""
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


def lora_llama_1b(device="cuda"):
    """Full-depth Llama-3.2-1B (random init, seed 0) with litgpt's recipe LoRA (r 8 on query and value, dropout 0.05),
    bf16 weights, max_seq_length 512, only the LoRA parameters trainable. Returns (config, model)."""
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable

    cfg = Config.from_name("Llama-3.2-1B", block_size=512, lora_r=8, lora_alpha=16, lora_query=True, lora_value=True,
                           lora_dropout=0.05)
    torch.manual_seed(0)
    with torch.device(device):
        m = GPT(cfg).to(torch.bfloat16)
    m.max_seq_length = 512
    mark_only_lora_as_trainable(m)
    return cfg, m


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
