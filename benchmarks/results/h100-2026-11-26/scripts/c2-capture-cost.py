"""Where a new shape's capture time goes: per-capture phases, and a cProfile of one warm-up."""
import cProfile, io, math, pstats, random, sys, time
import torch
from litgpt.lora import GPT as LGPT, Config as LConfig, mark_only_lora_as_trainable
from litgpt.utils import chunked_cross_entropy
from lit_liger import apply_liger, LigerConfig
from lit_liger import graphs as G

def batch(B, T, vocab=128000):
    x = torch.randint(1, vocab, (B, T)); y = x.clone()
    for b in range(1, B):  # rows shorter than T: padding
        l = T - 37 * b; x[b, l:] = 0; y[b, l:] = -100
    return x, y

def run(name, cfg_kw, Ts, B=4, profile_at=3):
    torch.manual_seed(0)
    cfg = LConfig.from_name("Llama-3.2-1B", lora_r=8, lora_alpha=16, lora_query=True, lora_value=True, lora_dropout=0.05, block_size=512)
    with torch.device("cuda"): m = LGPT(cfg).to(torch.bfloat16)
    mark_only_lora_as_trainable(m)
    apply_liger(m, LigerConfig(**cfg_kw)); m.train()
    def step(x, y):
        x = x.cuda(); y = y.cuda()
        out = m(x, lm_head_chunk_size=128); out[-1] = out[-1][..., :-1, :]
        loss = chunked_cross_entropy(out, y[..., 1:]); loss.backward(); return loss.item()
    for i, T in enumerate(Ts):
        x, y = batch(B, T)
        before = dict(G.CAPTURE_STATS); t0 = time.perf_counter()
        if i == profile_at:
            pr = cProfile.Profile(); pr.enable(); step(x, y); pr.disable()
        else:
            step(x, y)
        torch.cuda.synchronize(); wall = time.perf_counter() - t0
        d = {k: round(G.CAPTURE_STATS[k] - before[k], 3) for k in before}
        again = time.perf_counter(); step(x, y); torch.cuda.synchronize(); again = time.perf_counter() - again
        print(f"{name} T={T}: new-shape step {wall*1e3:.0f} ms, same shape again {again*1e3:.1f} ms, {d}", flush=True)
        if i == profile_at:
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[-6000:])
    del m; torch.cuda.empty_cache()

Ts = [448, 384, 320, 256, 192, 500]
run("padded-auto", {}, Ts)
run("padded-flash", {"sdpa_backend": "flash"}, Ts, profile_at=99)
run("packed", {"packing": True}, [512, 448, 384, 320, 256, 192], profile_at=3)
