"""Where a training step's GPU sits idle (device diagnostic): the benchmark's step (``benchmarks.step``'s model, loss,
fused AdamW) for one model and variant, warmed up, then 2 steps under torch.profiler with CPU and CUDA activity.
Reports the GPU's idle time per step, the largest gaps (the kernel after each, the CPU op that launched it) and
every host-synchronizing CUDA call with the op it ran under. Writes ``gaps.json`` and the Chrome trace.

    python -m benchmarks diag gaps OUT_DIR [--model gemma-2-2b] [--variant lit-liger+compile] [--B 4] [--T 2048]
"""
import argparse
import json
from bisect import bisect_right
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from .. import step as S

SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="gemma-2-2b")
    ap.add_argument("--variant", default="lit-liger+compile")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--min_gap_us", type=float, default=20.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config, _ = S.model_config(a.model, tiny=False, seq_len=a.T, stock=False)
    model = S.build_model(config, seq_len=a.T, dtype=torch.bfloat16, seed=0)
    loss_fn, _ = S.make_loss_fn(a.variant, model, None)
    opt = S._optimizer(model)
    x, y = S.make_batch(config, a.B, a.T, 0)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(x, y).backward()
        opt.step()

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    ev = json.loads(trace.read_text())["traceEvents"]
    gpu = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e),
                 key=lambda e: e["ts"])
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime" and "args" in e}
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and "dur" in e), key=lambda e: e["ts"])
    op_starts = [e["ts"] for e in ops]

    def enclosing(ts: float, tid) -> str:
        """The innermost CPU op on thread ``tid`` running at ``ts``, with its two outer ops."""
        chain = []
        for e in ops[:bisect_right(op_starts, ts)][::-1][:4000]:
            if e["tid"] == tid and e["ts"] <= ts <= e["ts"] + e["dur"]:
                chain.append(e["name"])
                if len(chain) == 3:
                    break
        return " < ".join(chain) or "?"

    span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]
    busy_end = gpu[0]["ts"]
    gaps = []
    for e in gpu:
        if e["ts"] - busy_end > a.min_gap_us:
            r = runtime.get(e["args"].get("correlation"))
            gaps.append({"us": round(e["ts"] - busy_end, 1), "at_us": round(busy_end - gpu[0]["ts"], 1),
                         "next": e["name"][:90], "launched_under": enclosing(r["ts"], r["tid"]) if r else "?"})
        busy_end = max(busy_end, e["ts"] + e["dur"])
    syncs = {}
    for e in ev:
        if e.get("cat") == "cuda_runtime" and e["name"] in SYNC_CALLS:
            key = f'{e["name"]} under {enclosing(e["ts"], e["tid"])}'
            syncs[key] = syncs.get(key, 0) + 1
    idle = sum(g["us"] for g in gaps)
    res = {"model": a.model, "variant": a.variant, "B": a.B, "T": a.T, "device": torch.cuda.get_device_name(),
           "span_ms_per_step": span / 2e3, "idle_ms_per_step_over_min_gap": idle / 2e3, "n_gaps": len(gaps),
           "largest_gaps": sorted(gaps, key=lambda g: -g["us"])[:25], "sync_calls_2_steps": syncs}
    by_op = {}
    for g in gaps:
        by_op[g["launched_under"]] = by_op.get(g["launched_under"], 0.0) + g["us"]
    res["idle_us_by_launching_op_2_steps"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:25])
    (out / "gaps.json").write_text(json.dumps(res, indent=1))
    trace.unlink()  # large; the summary is what comes back
    print(json.dumps({k: v for k, v in res.items() if k != "largest_gaps"}, indent=1)[:6000])
    for g in res["largest_gaps"][:12]:
        print(g)


if __name__ == "__main__":
    main()
