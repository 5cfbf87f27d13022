"""One variant of the 8B-widths step (8 layers, B2 x T4096): step time, peak memory, which allocations are live at
the peak of a step (allocator history replayed), and a kernel profile by category. Usage: mem8b.py VARIANT OUTJSON"""
import collections, linecache, json, statistics, sys, time
import torch
from benchmarks import _common as C
from benchmarks import step as S

variant, out = sys.argv[1], sys.argv[2]
B, T = 2, 4096
NL = int(sys.argv[3]) if len(sys.argv) > 3 else 8
config, _ = S.model_config("Llama-3.1-8B", tiny=False, seq_len=T, stock=False, n_layer=NL)
torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
model = S.build_model(config, seq_len=T, dtype=torch.bfloat16, seed=1234)
loss_fn, notes = S.make_loss_fn(variant, model, None)
opt = S._optimizer(model)
x, y = S.make_batch(config, B, T, 1234)


def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(x, y)
    loss.backward()
    opt.step()
    return loss.detach()


for _ in range(3):
    step()
torch.cuda.synchronize()
n0 = len(torch.cuda.memory._snapshot()["device_traces"][0])
torch.cuda.reset_peak_memory_stats()
step()
torch.cuda.synchronize()
peak = torch.cuda.max_memory_allocated()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
tr = snap["device_traces"][0]
live, cur, best, best_i = {}, 0, -1, 0
for i, e in enumerate(tr):
    a = e["action"]
    if a == "alloc":
        live[e["addr"]] = e; cur += e["size"]
    elif a == "free_completed":
        ev = live.pop(e["addr"], None)
        if ev is not None:
            cur -= ev["size"]
    if i >= n0 and cur > best:
        best, best_i = cur, i
# live set at the peak
live, cur = {}, 0
for i, e in enumerate(tr[:best_i + 1]):
    if e["action"] == "alloc":
        live[e["addr"]] = e
    elif e["action"] == "free_completed":
        live.pop(e["addr"], None)


def where(ev):
    fr = ev.get("frames", [])
    keep = [f for f in fr if any(k in f["filename"] for k in ("lit_liger", "litgpt", "torchinductor", "torchao",
                                                               "benchmarks", "torch/optim", "_functorch"))]
    f = keep[0] if keep else (fr[0] if fr else {"filename": "?", "line": 0, "name": "?"})
    fn = f["filename"].split("/")[-1]
    src = linecache.getline(f["filename"], f["line"]).strip()[:60] if "torchinductor" in f["filename"] else ""
    return f"{fn[:8]}:{f['line']} {f['name']} {src}"


groups = collections.defaultdict(lambda: [0, 0, set()])
for ev in live.values():
    g = groups[where(ev)]
    g[0] += ev["size"]; g[1] += 1; g[2].add(ev["size"])
rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
# phase of the peak: which frame allocated the event at the peak
peak_ev = tr[best_i]
sizes = collections.Counter(ev["size"] for ev in live.values())
res = {"size_histogram": sorted(sizes.items()), "variant": variant, "notes": notes, "peak_GiB": peak / 2**30, "replayed_peak_GiB": best / 2**30,
       "peak_event_where": where(peak_ev), "peak_event_index_in_step": best_i - n0, "step_events": len(tr) - n0,
       "live_at_peak": [{"where": k, "GiB": v[0] / 2**30, "n": v[1], "sizes_MiB": sorted({s / 2**20 for s in v[2]})[-4:]}
                        for k, v in rows[:60]]}
# step time
torch.cuda.synchronize()
times = S.train_steps(step, 6)
res["step_ms"] = statistics.median(times)
res["profile"] = S.profile_step(loss_fn, opt, x, y, n=2)
res["profile"].pop("kernels", None)
json.dump(res, open(out, "w"), indent=1)
print(f"== {variant}: {res['step_ms']:.1f} ms, peak {res['peak_GiB']:.2f} GiB (replayed {res['replayed_peak_GiB']:.2f}),"
      f" peak at event {res['peak_event_index_in_step']}/{res['step_events']} {res['peak_event_where']}")
for r in res["live_at_peak"]:
    print(f"   {r['GiB']:6.2f} GiB {r['n']:4d}x {r['where'][:120]} {r['sizes_MiB']}")
print("   kernels:", {k: round(v, 1) for k, v in res["profile"]["categories_ms"].items()})
for k in res["profile"]["top_kernels"][:8]:
    print(f"     {k['ms']:6.2f} ms {k['calls']:4d}x {k['name'][:90]}")
