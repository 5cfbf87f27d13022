"""glu_linear's backward with a trained weight: the fused kernel (the product written over d h) against the old
recompute pass, at gemma-2-2b's and Llama-3.2-1B's MLP shapes (B4 x T2048, bf16). GPU only.

usage: python scripts/gpu_glu_bwd.py [OUT.json]
"""
import json
import sys

import torch

import importlib

S = importlib.import_module("lit_liger.kernels.swiglu")  # (the package attribute `swiglu` is the function)

SHAPES = {"gemma-2-2b": (8192, 2304, 9216, "gelu_tanh"), "Llama-3.2-1B": (8192, 2048, 8192, "silu")}


def old_backward(ctx, dy):  # the path before: recompute the product, then the GLU backward
    return (*S._gl_backward(ctx, dy, glu_fwd=S._glu_fwd_impl, glu_bwd=S._glu_bwd_impl), None)


def bench(n, c, i, act, fused, reps=50):
    torch.manual_seed(0)
    a = torch.randn(n, i, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, i, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(c, i, device="cuda", dtype=torch.bfloat16) / i**0.5).requires_grad_()
    dy = torch.randn(n, c, device="cuda", dtype=torch.bfloat16)
    real = S._GLULinearFn.backward
    if not fused:
        S._GLULinearFn.backward = staticmethod(old_backward)
    try:
        out = S.glu_linear(a, b, w, None, act)
        grads = torch.autograd.grad(out, (a, b, w), dy)
        ts = []
        for _ in range(reps):
            out = S.glu_linear(a, b, w, None, act)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            torch.autograd.grad(out, (a, b, w), dy)
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
    finally:
        S._GLULinearFn.backward = real
    ts.sort()
    return ts[len(ts) // 2], grads


res = {}
for name, (n, c, i, act) in SHAPES.items():
    t_old, g_old = bench(n, c, i, act, False)
    t_new, g_new = bench(n, c, i, act, True)
    diff = max(((x.float() - y.float()).norm() / y.float().norm()).item() for x, y in zip(g_new, g_old))
    res[name] = {"backward_ms_recompute": round(t_old, 4), "backward_ms_fused": round(t_new, 4),
                 "saved_ms_per_layer": round(t_old - t_new, 4), "max_rel_diff": diff}
    print(name, res[name])
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)
