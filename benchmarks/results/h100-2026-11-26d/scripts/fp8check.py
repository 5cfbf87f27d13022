"""GPU: lit-liger's tensorwise casts and GEMMs bit for bit against torchao's Float8Linear; kernel timings."""
import json, sys, time
import torch
from torchao.float8 import Float8LinearConfig
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
from torchao.float8.float8_training_tensor import LinearMMConfig
from lit_liger.kernels import float8 as F8
from lit_liger.kernels.rms_norm import _rms_norm_fwd_impl
from lit_liger.kernels.swiglu import _glu_fwd_impl
from lit_liger import fp8 as lf

dev = "cuda"; torch.manual_seed(0)
res = {}
def eq(a, b): return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))
M, C, I = 8192 + 5, 2048, 8192
x = (torch.randn(M, C, device=dev) * 3).bfloat16()
for dt in (F8.E4M3, F8.E5M2):
    ref = hp_tensor_to_float8_dynamic(x, dt, LinearMMConfig())
    t8, t8t, sc = F8.fp8_cast(x, dt, write=True, write_t=True, t_pad=11)
    res[f"copy_{dt}"] = eq(t8, ref._data) and eq(t8t[:, :M], ref._data.t()) and bool(torch.equal(sc, ref._scale)) and bool((t8t[:, M:].float() == 0).all())
w = torch.randn(C, device=dev).bfloat16(); r = torch.randn(M, C, device=dev).bfloat16()
s, rstd, y8, sc = F8.norm_fp8(x, r, w, 1e-5, 0.0)
y, s2, _ = _rms_norm_fwd_impl(x, r, w, 1e-5, 0.0)
ref = hp_tensor_to_float8_dynamic(y, F8.E4M3, LinearMMConfig())
res["norm"] = eq(y8, ref._data) and bool(torch.equal(sc, ref._scale)) and bool(torch.equal(s, s2))
res["norm_t"] = eq(F8.norm_fp8_t(s, rstd, w, 0.0, sc), ref._data.t())
a = torch.randn(M, I, device=dev).bfloat16(); b = torch.randn(M, I, device=dev).bfloat16()
h8, h8t, sc = F8.glu_fp8(a, b, "silu", write_t=True)
ref = hp_tensor_to_float8_dynamic(_glu_fwd_impl(a, b, "silu"), F8.E4M3, LinearMMConfig())
res["glu"] = eq(h8, ref._data) and eq(h8t, ref._data.t()) and bool(torch.equal(sc, ref._scale))

# a Float8Linear: ours vs torchao's forward/backward, bit for bit
M = 8192
x = (torch.randn(M, C, device=dev) * 3).bfloat16()
lin = torch.nn.Linear(C, 3072, bias=False, device=dev, dtype=torch.bfloat16)
ao = Float8Linear.from_float(torch.nn.Linear(C, 3072, bias=False, device=dev, dtype=torch.bfloat16), config=Float8LinearConfig())
ao.weight.data.copy_(lin.weight.data)
xs = [x.clone().requires_grad_(True) for _ in range(2)]
g = torch.randn(M, 3072, device=dev).bfloat16()
o1 = lf._LinearTW.apply(xs[0], lin.weight, None); o1.backward(g)
o2 = ao(xs[1]); o2.backward(g)
res["linear_out"] = bool(torch.equal(o1, o2)); res["linear_dx"] = bool(torch.equal(xs[0].grad, xs[1].grad)); res["linear_dw"] = bool(torch.equal(lin.weight.grad, ao.weight.grad))
# tokens not a multiple of 16: ours pads the transposed operands with zeros; the same as zero rows appended
Mo = 8197
xo = x[:Mo].clone().requires_grad_(True); go = g[:Mo]
xp = torch.cat([x[:Mo], x.new_zeros(11, C)]).requires_grad_(True); gp = torch.cat([go, go.new_zeros(11, 3072)])
lin.weight.grad = None
lf._LinearTW.apply(xo, lin.weight, None).backward(go); dwo = lin.weight.grad; lin.weight.grad = None
op = lf._LinearTW.apply(xp, lin.weight, None); op.backward(gp)
res["odd_tokens_dw"] = bool(torch.equal(dwo, lin.weight.grad)); res["odd_tokens_dx"] = bool(torch.equal(xo.grad, xp.grad[:Mo]))
print(json.dumps(res), flush=True)

def bench(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e3
M = 8192
x = torch.randn(M, C, device=dev).bfloat16(); a = torch.randn(M, I, device=dev).bfloat16(); b = torch.randn(M, I, device=dev).bfloat16()
r = torch.randn(M, C, device=dev).bfloat16()
tm = {}
tm["torch cast x (amax+cast) ms"] = bench(lambda: hp_tensor_to_float8_dynamic(x, F8.E4M3, LinearMMConfig()))
tm["ours cast x row ms"] = bench(lambda: F8.fp8_cast(x, F8.E4M3))
tm["ours cast x row+T ms"] = bench(lambda: F8.fp8_cast(x, F8.E4M3, write_t=True))
tm["ours cast x T, scale given"] = bench(lambda: F8.fp8_cast(x, F8.E4M3, write=False, write_t=True, scale=torch.ones((), device=dev)))
tm["rms_norm fwd (bf16 y) ms"] = bench(lambda: _rms_norm_fwd_impl(x, r, w, 1e-5, 0.0))
tm["ours norm_fp8 ms"] = bench(lambda: F8.norm_fp8(x, r, w, 1e-5, 0.0))
tm["glu fwd bf16 ms"] = bench(lambda: _glu_fwd_impl(a, b, "silu"))
tm["ours glu_fp8 row ms"] = bench(lambda: F8.glu_fp8(a, b, "silu"))
tm["ours glu_fp8 T (scale) ms"] = bench(lambda: F8.glu_fp8(a, b, "silu", write=False, write_t=True, scale=torch.ones((), device=dev)))
tm["copy a (bandwidth ref, 128MB r+w) ms"] = bench(lambda: a.clone())
print(json.dumps({k: round(v, 3) for k, v in tm.items()}), flush=True)
