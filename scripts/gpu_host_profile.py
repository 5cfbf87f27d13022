"""Where the host's time goes in a small-batch training step (one device call): per phase (forward,
backward, optimizer) host milliseconds, then cProfile's and torch.profiler's CPU view of the
lit-liger step, for the step benchmark's model (Llama-3.2-1B shapes, B x T = 1 x 512 by default).

    python scripts/gpu_host_profile.py OUT_DIR [B] [T]
"""
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
from litgpt import Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the benchmarks package
from benchmarks import step as S  # noqa: E402

out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
T = int(sys.argv[3]) if len(sys.argv) > 3 else 512
config = Config.from_name("Llama-3.2-1B")
summary = {"B": B, "T": T, "device": torch.cuda.get_device_name()}

for variant in ("eager", "lit-liger"):
    model = S.build_model(config, seq_len=T, dtype=torch.bfloat16, seed=0)
    loss_fn, _ = S.make_loss_fn(variant, model)
    opt = S._optimizer(model)
    x, y = S.make_batch(config, B, T, 0)
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def step(record=False):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if record:
            phases["forward"] += (t1 - t0) * 1e3
            phases["backward"] += (t2 - t1) * 1e3
            phases["optimizer"] += (t3 - t2) * 1e3

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    n = 10
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    s.record()
    for _ in range(n):
        step(record=True)
    e.record()
    host = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    summary[variant] = {"host_issue_ms_per_step": host, "wall_ms_per_step": s.elapsed_time(e) / n,
                        **{f"host_{k}_ms": v / n for k, v in phases.items()}}
    print(variant, summary[variant], flush=True)

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(60)
    (out_dir / f"cprofile_{variant}.txt").write_text(buf.getvalue())

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=45)
    (out_dir / f"torchprof_{variant}.txt").write_text(table)
    print(table[:6000], flush=True)
    del model, opt, loss_fn
    torch.cuda.empty_cache()

(out_dir / "host.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
