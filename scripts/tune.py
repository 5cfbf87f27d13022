"""Quick launch-parameter sweep on a GPU (fwd and bwd timed apart). Not a benchmark of record."""
import itertools, sys
import torch, triton
from triton.testing import do_bench
import importlib
R = importlib.import_module("lit_liger.kernels.rms_norm")
P = importlib.import_module("lit_liger.kernels.rope")
LN = importlib.import_module("lit_liger.kernels.layer_norm")
F = importlib.import_module("lit_liger.kernels.fused_linear_cross_entropy")
from lit_liger.kernels import _launch
from litgpt.model import build_rope_cache

dev = "cuda"
torch.manual_seed(0)

def t(fn):
    return do_bench(fn, warmup=25, rep=100)

def fb(fwd, inputs):
    out = fwd()
    outs = out if isinstance(out, tuple) else (out,)
    gos = [torch.randn_like(o) for o in outs]
    def bwd():
        torch.autograd.grad(outs, inputs, gos, retain_graph=True)
    return t(fwd), t(bwd)

print("== rms_norm (N=16384)")
for H in (2048, 4096):
    x = torch.randn(16384, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    orig_rows, orig_plan = R.partial_rows, R.row_plan
    for per_sm, wmul in itertools.product((2, 4, 8, 16), (0.5, 1, 2)):
        R.partial_rows = lambda n, d, per_sm=per_sm: min(n, 132 * per_sm)
        def plan(n, es, d, wmul=wmul):
            p = orig_plan(n, es, d)
            return _launch.RowPlan(p.block, max(1, min(32, int(p.num_warps * wmul))))
        R.row_plan = plan
        f, b = fb(lambda: R.rms_norm(x, w), (x, w))
        print(f"H={H} per_sm={per_sm:2d} warps={plan(H,2,dev).num_warps:2d}  fwd {f*1e3:7.1f} us  bwd {b*1e3:7.1f} us  total {(f+b):.3f} ms")
    R.partial_rows, R.row_plan = orig_rows, orig_plan

print("== layer_norm H=4096 (current plan)")
x = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
b_ = torch.randn(4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
f, b = fb(lambda: LN.layer_norm(x, w, b_, 1e-5), (x, w, b_))
print(f"fwd {f*1e3:.1f} us bwd {b*1e3:.1f} us")

print("== rope B=4 T=4096 32q/8kv")
for hs in (64, 128):
    B, T, nh, ng = 4, 4096, 32, 8
    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device=dev, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = qkv.split((nh * hs, ng * hs, ng * hs), dim=-1)
    q = q.view(B, T, nh, hs).transpose(1, 2).detach().requires_grad_()  # strided leaf views
    k = k.view(B, T, ng, hs).transpose(1, 2).detach().requires_grad_()
    cos, sin = build_rope_cache(T, hs, device=dev)
    cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    orig_plan, orig_ew = P.row_plan, P.elementwise_plan
    for blk, wmul in itertools.product((512, 1024, 2048, 4096), (0.5, 1, 2, 4)):
        P.elementwise_plan = lambda n, d, block=None, blk=blk: _launch.ElementwisePlan(blk, 4, (1,))
        def plan(n, es, d, wmul=wmul):
            p = orig_plan(n, es, d)
            return _launch.RowPlan(p.block, max(1, min(32, int(p.num_warps * wmul))))
        P.row_plan = plan
        f, b = fb(lambda: P.rope(q, k, cos, sin), (q, k))
        print(f"hs={hs} chunk={blk:4d} wmul={wmul}  fwd {f*1e3:7.1f} us  bwd {b*1e3:7.1f} us  total {(f+b):.3f} ms")
    P.row_plan, P.elementwise_plan = orig_plan, orig_ew

print("== flce sweep (bf16, V=128256): ms / extra MiB")
def extra_mem(fn):
    torch.cuda.synchronize(); gc_base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(); torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - gc_base) / 2**20
for N, H in ((8192, 2048), (16384, 4096)):
    V = 128256
    x = torch.randn(N, H, device=dev, dtype=torch.bfloat16, requires_grad=True)
    W = (torch.randn(V, H, device=dev, dtype=torch.bfloat16) * H**-0.5).requires_grad_()
    y = torch.randint(0, V, (N,), device=dev)
    for mode, chunks in (("fast", (1024, 2048, 4096, 8192)), ("lean", (4096, 8192, 16384, 32768))):
        for c in chunks:
            def run():
                loss = F.fused_linear_cross_entropy(x, W, y, mode=mode, chunk_size=c)
                loss.backward()
            run()
            x.grad = W.grad = None
            # base: inputs + grads that fwd+bwd produce
            gx, gW = torch.empty_like(x), torch.empty_like(W)
            m = extra_mem(run) - (gx.numel() + gW.numel()) * 2 / 2**20
            del gx, gW
            x.grad = W.grad = None
            ms = do_bench(lambda: (F.fused_linear_cross_entropy(x, W, y, mode=mode, chunk_size=c).backward()), warmup=3, rep=20)
            x.grad = W.grad = None
            print(f"N={N} H={H} {mode} chunk={c:6d}  {ms:7.2f} ms  extra {m:8.0f} MiB")
