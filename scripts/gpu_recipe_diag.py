"""Where a recipe-sized LoRA iteration's time goes: the model's fwd+loss+bwd alone (host issue time and
wall time per micro-batch), stock vs lit-liger without and with CUDA graphs, on bucketed random lengths."""
import copy, json, random, statistics, sys, time
import torch
from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
from litgpt.utils import chunked_cross_entropy as litgpt_ce
from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy
from lit_liger.graphs import runner_for

B = int(sys.argv[1]) if len(sys.argv) > 1 else 4
cfg = Config.from_name("Llama-3.2-1B", lora_r=8, lora_alpha=16, lora_query=True, lora_value=True, lora_dropout=0.0,
                       block_size=512)
torch.manual_seed(0)
with torch.device("cuda"):
    base = GPT(cfg).to(torch.bfloat16)
mark_only_lora_as_trainable(base)
rng = random.Random(0)
lengths = [min(512, max(40, int(rng.lognormvariate(5.35, 0.6)))) for _ in range(60)]
res = {}
for name in ("stock", "liger-no-graphs", "liger"):
    m = base if name == "stock" else copy.deepcopy(base)
    if name != "stock":
        apply_liger(m, LigerConfig(cuda_graphs=(name == "liger")))
    fn = litgpt_ce if name == "stock" else chunked_cross_entropy
    host, wall = [], []
    for i, T in enumerate(lengths):
        x = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = m(x, lm_head_chunk_size=128)
        out[-1] = out[-1][..., :-1, :]
        loss = fn(out, x[..., 1:])
        loss.backward()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i >= 20:
            host.append((t1 - t0) * 1e3)
            wall.append((t2 - t0) * 1e3)
    r = {"host_ms_p50": statistics.median(host), "wall_ms_p50": statistics.median(wall), "wall_ms_mean": statistics.fmean(wall)}
    if name == "liger":
        rr = runner_for(m)
        r.update(captures=rr.captures, replays=rr.replays, disabled=rr.disabled)
    res[name] = r
    print(name, json.dumps(r), flush=True)
    if name != "stock":
        del m
# the loop's own per-iteration costs: a .item() sync and a tiny op, measured alone
t0 = time.perf_counter()
for _ in range(100):
    torch.zeros((), device="cuda").add_(1).item()
print("item() round trip ms", (time.perf_counter() - t0) * 10)
