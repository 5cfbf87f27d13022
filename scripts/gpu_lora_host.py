"""Issue 16 probe (one device call): where the host's time goes in an uncaptured LoRA micro-batch, and which
SDPA backend to use per device once lengths are bucketed.

    python scripts/gpu_lora_host.py OUT_DIR [--parts host,sdpa] [--variants stock,liger]

host: Llama-3.2-1B LoRA (r 8, query+value, dropout 0.05; litgpt's defaults), bf16, B4 x T512, fwd + loss + bwd +
      AdamW step, uncaptured (``cuda_graphs=False``): host issue time and wall time per step (median of 20), and
      torch.profiler's CPU table (self CPU time per op over 3 steps) for each variant.
sdpa: one attention call (32 q heads, 8 kv heads, hs 64: Llama-3.2-1B), fwd + bwd, per backend (cuDNN, flash,
      efficient) and (B, T) bucket: the first call's wall time (plan build) and the repeat's GPU time (CUDA events,
      median of 20), then a whole LoRA model step (uncaptured) per backend on bucketed random lengths.
"""
import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
from litgpt.utils import chunked_cross_entropy as litgpt_ce
from torch.nn.attention import SDPBackend, sdpa_kernel

from _diag_common import cuda_median_ms
from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy

p = argparse.ArgumentParser()
p.add_argument("out", type=Path)
p.add_argument("--parts", default="host,sdpa")
p.add_argument("--variants", default="stock,liger")
p.add_argument("--liger_config", default="{}")
opts = p.parse_args()
opts.out.mkdir(parents=True, exist_ok=True)
res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}


def build(variant: str):
    cfg = Config.from_name("Llama-3.2-1B", lora_r=8, lora_alpha=16, lora_query=True, lora_value=True,
                           lora_dropout=0.05, block_size=512)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = GPT(cfg).to(torch.bfloat16)
    mark_only_lora_as_trainable(m)
    if variant != "stock":
        apply_liger(m, LigerConfig(**{"cuda_graphs": False, **json.loads(opts.liger_config)}))
    opt = torch.optim.AdamW([q for q in m.parameters() if q.requires_grad], lr=1e-4)
    fn = litgpt_ce if variant == "stock" else chunked_cross_entropy
    return m, opt, fn, cfg


def step(m, opt, fn, x):
    out = m(x, lm_head_chunk_size=128)
    out[-1] = out[-1][..., :-1, :]
    loss = fn(out, x[..., 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


if "host" in opts.parts:
    from torch.profiler import ProfilerActivity, profile

    for variant in opts.variants.split(","):
        # "-st": autograd's backward on the calling thread (torch.autograd.set_multithreading_enabled(False)) instead
        # of its CUDA device thread, where each Python autograd node's backward has to take the GIL from a waiting thread
        torch.autograd.set_multithreading_enabled(not variant.endswith("-st"))
        m, opt, fn, cfg = build(variant.removesuffix("-st"))
        x = torch.randint(0, cfg.vocab_size, (4, 512), device="cuda")
        host, wall = [], []
        for i in range(25):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(m, opt, fn, x)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= 5:
                host.append((t1 - t0) * 1e3)
                wall.append((t2 - t0) * 1e3)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step(m, opt, fn, x)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45)
        (opts.out / f"host_{variant}.txt").write_text(table)
        ev = prof.key_averages()
        launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                         "cudaLaunchKernelExC"))
        gpu_us = sum(e.self_device_time_total for e in ev if e.device_type == torch.autograd.DeviceType.CUDA) \
            if hasattr(ev[0], "self_device_time_total") else None
        r = {"host_ms_p50": statistics.median(host), "wall_ms_p50": statistics.median(wall),
             "launches_per_step": launches / 3, "gpu_ms_per_step": gpu_us / 3e3 if gpu_us else None}
        res.setdefault("host", {})[variant] = r
        print("host", variant, json.dumps(r), flush=True)
        print(table[:6000], flush=True)
        del m, opt
        torch.cuda.empty_cache()
    torch.autograd.set_multithreading_enabled(True)

if "sdpa" in opts.parts:
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows = []
    for name, be in backends.items():
        for B in (4, 1):
            for T in range(64, 513, 64):
                q = torch.randn(B, 32, T, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(B, 8, T, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn(B, 8, T, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                g = torch.randn(B, 32, T, 64, device="cuda", dtype=torch.bfloat16)

                def call():
                    with sdpa_kernel(be):
                        if name == "flash":
                            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        else:
                            kk, vv = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
                            y = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True)
                    y.backward(g)

                try:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    call()
                    torch.cuda.synchronize()
                    first = (time.perf_counter() - t0) * 1e3
                    repeat_gpu_ms = cuda_median_ms(call, n=20, warmup=3)
                    host_t = []
                    for _ in range(10):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        call()
                        host_t.append((time.perf_counter() - t0) * 1e3)
                    rows.append({"backend": name, "B": B, "T": T, "first_ms": first,
                                 "repeat_gpu_ms": repeat_gpu_ms, "host_ms": statistics.median(host_t)})
                except Exception as e:  # noqa: BLE001
                    rows.append({"backend": name, "B": B, "T": T, "error": str(e)[:200]})
                print("sdpa", json.dumps(rows[-1]), flush=True)
    res["sdpa_layer"] = rows
    # whole model, uncaptured, bucketed random lengths, per backend (lit-liger's model: buckets on)
    rng = random.Random(0)
    lengths = [min(512, max(40, int(rng.lognormvariate(5.35, 0.6)))) for _ in range(40)]
    for name, be in [("default", None), *backends.items()]:
        m, opt, fn, cfg = build("liger")
        wall = []
        with sdpa_kernel(be) if be is not None else torch.autograd.profiler.record_function("default"):
            for i, T in enumerate(lengths):
                x = torch.randint(0, cfg.vocab_size, (4, T), device="cuda")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(m, opt, fn, x)
                torch.cuda.synchronize()
                wall.append((time.perf_counter() - t0) * 1e3)
        r = {"first10_ms_mean": statistics.fmean(wall[:10]), "last30_ms_p50": statistics.median(wall[10:]),
             "last30_ms_mean": statistics.fmean(wall[10:])}
        res.setdefault("sdpa_model", {})[name] = r
        print("model", name, json.dumps(r), flush=True)
        del m, opt
        torch.cuda.empty_cache()
    torch.autograd.set_multithreading_enabled(True)

(opts.out / "lora_host.json").write_text(json.dumps(res, indent=1))
