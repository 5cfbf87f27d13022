import torch, triton, triton.language as tl, time, sys

@triton.jit
def adamw_k(P, G, M, V, STEP, n, lr, beta1, beta2, wd, eps, F64: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dt = tl.float64 if F64 else tl.float32
    p = tl.load(P + offs, mask=mask).to(dt)
    g = tl.load(G + offs, mask=mask).to(dt)
    m = tl.load(M + offs, mask=mask).to(dt)
    v = tl.load(V + offs, mask=mask).to(dt)
    step = tl.load(STEP).to(tl.float32)
    bc1 = 1.0 - tl.exp2(step * tl.log2(beta1.to(tl.float32)))
    bc2 = 1.0 - tl.exp2(step * tl.log2(beta2.to(tl.float32)))
    p = p - lr * wd * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    step_size = lr / bc1
    denom = tl.sqrt(v.to(tl.float32)).to(dt) / tl.sqrt(bc2).to(dt) + eps
    p = p - step_size * m / denom
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)

def shapes(layers=8):
    d, f, v = 4096, 14336, 128256
    s = [(v, d)]
    for _ in range(layers):
        s += [(6144, d), (d, d), (f, d), (f, d), (d, f), (d,), (d,)]
    s += [(d,), (v, d)]
    return s

def main():
    torch.manual_seed(0)
    dev = "cuda"
    ps = [torch.randn(s, device=dev, dtype=torch.bfloat16) * 0.02 for s in shapes()]
    gs = [torch.randn_like(p) * 1e-3 for p in ps]
    n = sum(p.numel() for p in ps)
    print(f"params {n/1e9:.2f} B")
    def torch_fused():
        params = [torch.nn.Parameter(p.clone()) for p in ps]
        for p, g in zip(params, gs): p.grad = g
        return params, torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    params, opt = torch_fused()
    for _ in range(3): opt.step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(10): opt.step()
    e1.record(); torch.cuda.synchronize()
    t = e0.elapsed_time(e1) / 10
    print(f"torch fused: {t:.2f} ms  {14*n/t/1e9:.0f} GB/s")
    ref = [p.detach().clone() for p in params]
    del opt, params
    for f64 in (False, True):
        for block in (1024, 2048, 4096):
            P = [p.clone() for p in ps]; M = [torch.zeros_like(p) for p in ps]; V = [torch.zeros_like(p) for p in ps]
            step = torch.zeros((), device=dev)
            def run():
                step.add_(1)
                for p, g, m, v in zip(P, gs, M, V):
                    adamw_k[(triton.cdiv(p.numel(), block),)](p, g, m, v, step, p.numel(), 3e-4, 0.9, 0.95, 0.1, 1e-8, F64=f64, BLOCK=block, num_warps=4 if block <= 1024 else 8)
            for _ in range(13): run()
            torch.cuda.synchronize()
            e0.record()
            for _ in range(10): run()
            e1.record(); torch.cuda.synchronize()
            t = e0.elapsed_time(e1) / 10
            err = max(((a.float() - b.float()).abs().max().item()) for a, b in zip(P, ref))
            neq = sum((a != b).sum().item() for a, b in zip(P, ref))
            print(f"triton f64={f64} block={block}: {t:.2f} ms  {14*n/t/1e9:.0f} GB/s  maxdiff vs torch {err:.2e}  n_diff {neq}")
            del P, M, V
main()
