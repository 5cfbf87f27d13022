"""Padded vs packed, LoRA / full (direct grads): per-iteration wall vs GPU kernel time, top kernels."""
import math, random, sys, time, json, os
import torch
from litgpt.lora import GPT as LGPT, Config as LConfig, mark_only_lora_as_trainable
from litgpt.model import GPT
from litgpt.utils import chunked_cross_entropy
from lit_liger import apply_liger, LigerConfig
from lit_liger import graphs as G
from lit_liger.graphs import runner_for

def batches(n, B, seed=0, vocab=128000):
    rng = random.Random(seed); out = []
    for _ in range(n):
        L = [min(512, 40 + int(rng.lognormvariate(math.log(170), 0.75))) for _ in range(B)]
        T = max(L)
        x = torch.zeros(B, T, dtype=torch.long); y = torch.full((B, T), -100, dtype=torch.long)
        for b, l in enumerate(L):
            t = torch.randint(1, vocab, (l,)); x[b, :l] = t; y[b, :l - 1] = t[1:]; y[b, l-1] = 5
        out.append((x, y, sum(L)))
    return out

def run(mode, B, n_iter=60, prof=False):
    lora = mode.startswith("lora")
    torch.manual_seed(0)
    if lora:
        cfg = LConfig.from_name("Llama-3.2-1B", lora_r=8, lora_alpha=16, lora_query=True, lora_value=True, lora_dropout=0.05, block_size=512)
        with torch.device("cuda"): m = LGPT(cfg).to(torch.bfloat16)
        mark_only_lora_as_trainable(m)
    else:
        cfg = LConfig.from_name("Llama-3.2-1B", block_size=512)
        with torch.device("cuda"): m = GPT(cfg).to(torch.bfloat16)
    G.DIRECT_GRADS = G.CAPTURE_FULL_TRAINING = "nodirect" not in mode
    rep = apply_liger(m, LigerConfig(packing="padded" not in mode))
    m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5, fused=True)
    data = batches(2 * n_iter, B)
    def step(i, x, y):
        x = x.cuda(non_blocking=True); y = y.cuda(non_blocking=True)
        with torch.profiler.record_function("fwd"):
            out = m(x, lm_head_chunk_size=128); out[-1] = out[-1][..., :-1, :]
        with torch.profiler.record_function("loss"):
            loss = chunked_cross_entropy(out, y[..., 1:])
        with torch.profiler.record_function("bwd"):
            (loss / 4).backward()
        if i % 4 == 3:
            with torch.profiler.record_function("opt"):
                opt.step(); opt.zero_grad()
        with torch.profiler.record_function("item"):
            return loss.item()
    for i, (x, y, _) in enumerate(data[:n_iter]):  # captures every shape
        step(i, x, y)
    torch.cuda.synchronize()
    t0 = time.perf_counter(); toks = 0; ts = []
    for i, (x, y, r) in enumerate(data[n_iter:]):
        a = time.perf_counter(); step(i, x, y); ts.append(time.perf_counter() - a); toks += r
    torch.cuda.synchronize(); wall = time.perf_counter() - t0
    r = runner_for(m)
    res = dict(mode=mode, B=B, ms_mean=1e3 * wall / n_iter, ms_p50=1e3 * sorted(ts)[len(ts)//2], tok_s=toks / wall,
               captures=r.captures if r else None, uncaptured=getattr(r, "uncaptured", None) if r else None,
               disabled=getattr(r, "disabled", None) if r else None,
               alloc_gb=torch.cuda.max_memory_allocated() / 1e9, reserved_gb=torch.cuda.max_memory_reserved() / 1e9)
    if prof:
        from torch.profiler import profile, ProfilerActivity
        sub = data[n_iter:n_iter + (6 if os.environ.get('TRACE') else 16)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for i, (x, y, _) in enumerate(sub): step(i, x, y)
            torch.cuda.synchronize()
        ev = p.key_averages()
        gpu = sum(e.self_device_time_total for e in ev if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3 / len(sub)
        res["gpu_ms_per_iter"] = gpu
        res["regions_cpu_ms"] = {e.key: round(e.cpu_time_total / 1e3 / len(sub), 2) for e in ev if e.key in ("fwd", "loss", "bwd", "opt", "item")}
        if os.environ.get("TRACE"):
            import gzip, shutil
            path = os.path.join(os.environ.get("OUT", "."), f"trace-{mode}-B{B}.json")
            p.export_chrome_trace(path)
            with open(path, "rb") as a, gzip.open(path + ".gz", "wb") as b: shutil.copyfileobj(a, b)
            os.remove(path)
        res["top_gpu"] = [(e.key[:60], round(e.self_device_time_total / 1e3 / len(sub), 3)) for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:12]]
    del m, opt; torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    return res

if __name__ == "__main__":
    for spec in sys.argv[1:]:
        mode, B = spec.split(":")
        try:
            r = run(mode, int(B), prof=True)
        except Exception as e:
            import traceback; traceback.print_exc(); r = dict(mode=mode, error=repr(e)[:300])
        print(json.dumps(r), flush=True)
        with open(os.path.join(os.environ.get("OUT", "."), "prof.jsonl"), "a") as f: f.write(json.dumps(r) + "\n")
