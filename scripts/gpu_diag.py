"""Small GPU diagnostics (one device call): rope_qkv's host/GPU timing at hs=128 with a host-sync
check, and the fused loss's extra memory when all rows fit one chunk (no fp32 dW buffer) vs two."""
import json
import sys
import warnings

import torch

from lit_liger.kernels import fused_linear_cross_entropy, rope_qkv

out = {}
dev = "cuda"
# --- rope_qkv, B=4 T=4096, 32 q / 8 kv heads, hs=128: wall per fwd+bwd (events, back to back) vs GPU time
B, T, nh, ng, hs = 4, 4096, 32, 8, 128
qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device=dev, dtype=torch.bfloat16, requires_grad=True)
from litgpt.model import build_rope_cache  # noqa: E402

cos, sin = (t.unsqueeze(0) for t in build_rope_cache(T, hs, device=torch.device(dev)))
gq, gk = torch.randn(B, nh, T, hs, device=dev, dtype=torch.bfloat16), torch.randn(B, ng, T, hs, device=dev, dtype=torch.bfloat16)


def step():
    q, k, _ = rope_qkv(qkv, cos, sin, nh, ng)
    torch.autograd.backward((q, k), (gq, gk))
    qkv.grad = None


for _ in range(5):
    step()
torch.cuda.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    step()
    torch.cuda.set_sync_debug_mode(0)
out["rope_qkv_sync_warnings"] = [str(w.message)[:200] for w in caught if "ynchroniz" in str(w.message)]
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
import time  # noqa: E402

t0 = time.perf_counter()
s.record()
for _ in range(100):
    step()
e.record()
host_ms = (time.perf_counter() - t0) * 1e3 / 100  # host time to issue one step (GPU may lag)
torch.cuda.synchronize()
out["rope_qkv_hs128_ms_per_call_events"] = s.elapsed_time(e) / 100
out["rope_qkv_hs128_host_issue_ms"] = host_ms

# --- fused loss, V=128256 H=2048 bf16, fast mode: extra memory at N=2048 (one chunk) and N=4096 (two)
V, H = 128256, 2048
w = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
for N in (2048, 4096):
    x = torch.randn(N, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, V, (N,), device=dev)
    fused_linear_cross_entropy(x, w, y).backward()
    x.grad = w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fused_linear_cross_entropy(x, w, y)
    loss.backward()
    torch.cuda.synchronize()
    grads = x.grad.numel() * 2 + w.grad.numel() * 2
    out[f"flce_fast_N{N}_extra_MiB_beyond_grads"] = (torch.cuda.max_memory_allocated() - base - grads) / 2**20
    x.grad = w.grad = None
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
