"""Full fine-tuning, litgpt-shaped loop (Llama-3.2-1B, 16 layers, mb 4, grad accumulation 4, AdamW, .item() per
iteration), packed batches planned on the host: ms/iteration, and a profile's GPU kernel time per category."""
import json, math, os, random, sys, time
import torch
from litgpt.model import GPT, Config
from litgpt.lora import GPT as LGPT, Config as LConfig, mark_only_lora_as_trainable
from litgpt.utils import chunked_cross_entropy
from lit_liger import apply_liger, LigerConfig
from lit_liger import graphs as G
from lit_liger.batches import HostPrep
from lit_liger.packing import BATCH_KEY, register
from lit_liger.optim import fuse_optimizer

N_MATMUL = 1.236e9


def batches(n, B, seed=0, vocab=128000):
    rng = random.Random(seed); out = []
    for _ in range(n):
        L = [min(512, 40 + int(rng.lognormvariate(math.log(170), 0.75))) for _ in range(B)]
        T = max(L)
        x = torch.zeros(B, T, dtype=torch.long); y = torch.full((B, T), -100, dtype=torch.long)
        for b, l in enumerate(L):
            t = torch.randint(1, vocab, (l,)); x[b, :l] = t; y[b, :l - 1] = t[1:]; y[b, l - 1] = 5
        batch = HostPrep(True, True)({"input_ids": x, "labels": y})
        out.append((batch, sum(L)))
    return out


SKIP = {"fwd", "loss", "bwd", "opt", "item", "_Replay", "_ReplayBackward"}


def kernel(e):
    return (e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0 and e.key not in SKIP
            and not e.key.startswith(("Optimizer.", "aten::", "autograd::", "cuda")))


def category(name):
    n = name.lower()
    if "memcpy" in n or "memset" in n: return "copy/set"
    if "adam" in n: return "adamw (fused)"
    if "fp8" in n or "amax" in n: return "float8 casts"
    if "multi_tensor_apply" in n: return "foreach (grad add / zero / optimizer)"
    if any(k in n for k in ("flash", "fmha", "cudnn", "sdpa", "attention")): return "attention"
    if any(k in n for k in ("nvjet", "gemm", "cutlass", "xmma", "kernel2", "sm90")): return "gemm"
    if "embedding" in n or "indexing" in n or "index_" in n: return "embedding"
    if name.startswith("_") or "triton" in n: return "triton (norm/rope/glu/loss)"
    if "reduce" in n: return "reduce"
    if "elementwise" in n: return "elementwise"
    return "other"


def run(mode, B=4, n_iter=60, accum=4):
    torch.manual_seed(0)
    lora = mode.startswith("lora")
    if lora:
        cfg = LConfig.from_name("Llama-3.2-1B", lora_r=8, lora_alpha=16, lora_query=True, lora_value=True, lora_dropout=0.05, block_size=512)
        with torch.device("cuda"): m = LGPT(cfg).to(torch.bfloat16)
        mark_only_lora_as_trainable(m)
    else:
        cfg = Config.from_name("Llama-3.2-1B", block_size=512)
        with torch.device("cuda"): m = GPT(cfg).to(torch.bfloat16)
    G.GEMM_INTO_GRAD = "after" not in mode
    apply_liger(m, LigerConfig(fp8="tensorwise" if "fp8" in mode else "off")); m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.02)
    if "fused" in mode:
        assert fuse_optimizer(opt) is None
    data = batches(2 * n_iter + 16, B)

    def step(i, batch):
        x = batch["input_ids"].pin_memory().cuda(non_blocking=True); y = batch["labels"].pin_memory().cuda(non_blocking=True)
        b = dict(batch, input_ids=x, labels=y)
        ent = batch.get(BATCH_KEY)
        if ent is not None:
            b[BATCH_KEY] = (ent[0].pin_memory().cuda(non_blocking=True), ent[1])
        register(b)
        with torch.profiler.record_function("fwd"):
            out = m(x, lm_head_chunk_size=128); out[-1] = out[-1][..., :-1, :]
        with torch.profiler.record_function("loss"):
            loss = chunked_cross_entropy(out, y[..., 1:])
        with torch.profiler.record_function("bwd"):
            (loss / accum).backward()
        if i % accum == accum - 1:
            with torch.profiler.record_function("opt"):
                opt.step(); opt.zero_grad()
        if "noitem" in mode:
            return loss.detach()
        with torch.profiler.record_function("item"):
            return loss.item()

    for i, (b, _) in enumerate(data[:n_iter]):
        step(i, b)
    torch.cuda.synchronize()
    if "syncdebug" in mode:
        import traceback, warnings
        stacks = {}
        def show(msg, cat, fn, ln, file=None, line=None):
            st = "".join(traceback.format_stack(limit=9)[:-2])
            stacks[st] = stacks.get(st, 0) + 1
        old = warnings.showwarning; warnings.showwarning = show; warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        for i, (b, _) in enumerate(data[n_iter:n_iter + 8]):
            step(i, b)
        torch.cuda.set_sync_debug_mode(0); warnings.showwarning = old
        for st, n in stacks.items():
            print(f"=== sync x{n}\n{st}", flush=True)
    t0 = time.perf_counter(); toks = 0; losses = []
    for i, (b, r) in enumerate(data[n_iter:2 * n_iter]):
        losses.append(step(i, b)); toks += r
    torch.cuda.synchronize(); wall = time.perf_counter() - t0
    flops = (4 if lora else 6) * N_MATMUL
    res = dict(mode=mode, ms_per_iter=round(1e3 * wall / n_iter, 2), tok_s=round(toks / wall), mfu=round(flops * toks / wall / 989e12, 4),
               captures=G.runner_for(m).captures, alloc_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2),
               reserved_gb=round(torch.cuda.max_memory_reserved() / 1e9, 2), loss_mean=round(float(sum(losses)) / len(losses), 4))
    from torch.profiler import profile, ProfilerActivity
    sub = data[2 * n_iter:]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        for i, (b, _) in enumerate(sub): step(i, b)
        torch.cuda.synchronize(); pwall = time.perf_counter() - t0
    cats = {}
    for e in p.key_averages():
        if not kernel(e):
            continue
        c = category(e.key)
        cats[c] = cats.get(c, 0) + e.self_device_time_total / 1e3 / len(sub)
    res["profiled_ms_per_iter"] = round(1e3 * pwall / len(sub), 2)
    res["gpu_kernel_ms_per_iter"] = round(sum(cats.values()), 2)
    res["by_category_ms"] = {k: round(v, 2) for k, v in sorted(cats.items(), key=lambda kv: -kv[1])}
    top = sorted((e for e in p.key_averages() if kernel(e)), key=lambda e: -e.self_device_time_total)[:10]
    res["top"] = [(e.key[:70], round(e.self_device_time_total / 1e3 / len(sub), 3)) for e in top]
    del m, opt; torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    return res


if __name__ == "__main__":
    for mode in sys.argv[1:]:
        try:
            r = run(mode)
        except Exception as e:
            import traceback; traceback.print_exc(); r = dict(mode=mode, error=repr(e)[:300])
        print(json.dumps(r), flush=True)
        with open(os.path.join(os.environ.get("OUT", "."), "prof2.jsonl"), "a") as f:
            f.write(json.dumps(r) + "\n")
