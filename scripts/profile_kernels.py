"""Kernel-only GPU time (torch.profiler) vs host-inclusive time per fwd+bwd, for the small ops."""
import importlib
import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench
from litgpt.model import RMSNorm, build_rope_cache, apply_rope

from lit_liger.kernels import rms_norm, rope

dev = "cuda"
torch.manual_seed(0)


def measure(name, fn, inputs, n=20):
    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    gos = [torch.randn_like(o) for o in outs]

    def step():
        o = fn()
        o = o if isinstance(o, tuple) else (o,)
        torch.autograd.backward(o, gos)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.device_time_total for e in ev) / n
    top = sorted(ev, key=lambda e: -e.device_time_total)[:4]
    wall = do_bench(step, warmup=10, rep=50)
    print(f"{name:<34} kernels {total:8.1f} us   do_bench {wall*1e3:8.1f} us   | " +
          ", ".join(f"{e.key[:28]}={e.device_time_total/n:.0f}" for e in top))
    for x in inputs:
        x.grad = None


for H in (2048, 4096):
    x = torch.randn(16384, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    m = RMSNorm(H).to(dev, torch.bfloat16)
    cm = torch.compile(m)
    measure(f"rms H={H} lit-liger", lambda: rms_norm(x, w, 1e-6), [x, w])
    measure(f"rms H={H} compile", lambda: cm(x), [x])
for hs in (64, 128):
    B, T, nh, ng = 4, 4096, 32, 8
    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device=dev, dtype=torch.bfloat16)
    q, k, _ = qkv.split((nh * hs, ng * hs, ng * hs), dim=-1)
    q = q.view(B, T, nh, hs).transpose(1, 2).detach().requires_grad_()
    k = k.view(B, T, ng, hs).transpose(1, 2).detach().requires_grad_()
    cos, sin = build_rope_cache(T, hs, device=dev)
    cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    measure(f"rope hs={hs} lit-liger", lambda: rope(q, k, cos, sin), [q, k])
    crope = torch.compile(lambda q, k: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)))
    measure(f"rope hs={hs} compile", lambda: crope(q, k), [q, k])
