"""``python -m lit_liger.selfcheck``: run every kernel against its reference on this machine.

On a CUDA GPU the Triton kernels run natively at moderate sizes in bf16; on a CPU-only machine
they run through Triton's interpreter (``TRITON_INTERPRET=1``, set here before the kernels are
imported, or in a child process where they were imported already) at small sizes in fp32. References are LitGPT's own functions or plain PyTorch in fp64.
Prints one row per op (forward and every gradient) and exits non-zero on a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def _rel(out, ref) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    if not bool(out.isfinite().all()):
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def main(argv: list[str] | None = None) -> int:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and "TRITON_INTERPRET" not in os.environ:
        if "lit_liger.kernels" in sys.modules:
            # the kernels were compiled for a GPU driver when imported (``python -m lit_liger.selfcheck``
            # imports the package first): run again in a process that imports them for the interpreter
            env = dict(os.environ, TRITON_INTERPRET="1")
            args = sys.argv[1:] if argv is None else argv
            return subprocess.call([sys.executable, "-m", "lit_liger.selfcheck", *args], env=env)
        os.environ["TRITON_INTERPRET"] = "1"
    import torch.nn.functional as F
    from litgpt.model import RMSNorm, apply_rope, build_rope_cache

    from lit_liger.kernels import (
        fused_linear_cross_entropy,
        geglu,
        gelu_linear,
        layer_norm,
        layer_norm_dual,
        layer_norm_residual,
        rms_norm,
        rms_norm_linear,
        rope,
        rope_qkv,
        softcap_attention,
        swiglu,
    )
    from lit_liger.kernels.attention import reference as attention_reference
    from lit_liger.kernels._launch import device_limits, interpret_mode

    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    N, H, I, V = (4096, 2048, 5632, 32000) if cuda else (24, 96, 160, 300)
    path = "triton (native)" if cuda else ("triton (interpreter)" if interpret_mode() else "reference (no GPU)")
    lim = device_limits(dev)
    print(f"lit-liger self-check on {lim.name} - {path} - {str(dtype).replace('torch.', '')}, tolerance {tol:g}")
    torch.manual_seed(0)
    rows = []

    def check(name, fn, ref_fn, inputs):
        t0 = time.perf_counter()
        ins = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        ref_ins = [t.detach().clone().double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
        out, ref = fn(*ins), ref_fn(*ref_ins)
        outs, refs = (out if isinstance(out, tuple) else (out,)), (ref if isinstance(ref, tuple) else (ref,))
        errs = [_rel(o, r) for o, r in zip(outs, refs)]
        gos = [torch.randn_like(r.float()) for r in refs]
        torch.autograd.backward([o for o in outs], [g.to(o.dtype) for o, g in zip(outs, gos)])
        torch.autograd.backward([r for r in refs], [g.double() for g in gos])
        gerrs = [_rel(a.grad, b.grad) for a, b in zip(ins, ref_ins) if a.is_floating_point() and b.grad is not None]
        worst = max(errs + gerrs)
        rows.append((name, max(errs), max(gerrs) if gerrs else 0.0, worst <= tol, time.perf_counter() - t0))

    x, w, b = torch.randn(N, H, device=dev, dtype=dtype), torch.randn(H, device=dev, dtype=dtype), torch.randn(H, device=dev, dtype=dtype)

    def litgpt_rms(x, w):  # litgpt.model.RMSNorm's forward, with the given weight, in fp64
        return torch.func.functional_call(RMSNorm(w.shape[0], eps=1e-6), {"weight": w}, (x,))

    check("rms_norm", lambda x, w: rms_norm(x, w, 1e-6), litgpt_rms, [x, w])
    r, W1, W2 = (torch.randn(N, H, device=dev, dtype=dtype), torch.randn(I, H, device=dev, dtype=dtype) * H**-0.5,
                 torch.randn(I, H, device=dev, dtype=dtype) * H**-0.5)

    def norm_linear(x, r, w, W1, W2):  # (s, *outs) of the fused norm_2 -> fc_1, fc_2
        s, outs = rms_norm_linear(x, w, [(W1, None), (W2, None)], 1e-6, residual=r)
        return (s, *outs)

    def norm_linear_ref(x, r, w, W1, W2):
        s = x + r
        n = litgpt_rms(s, w)
        return s, F.linear(n, W1), F.linear(n, W2)

    check("rms_norm_linear (+residual)", norm_linear, norm_linear_ref, [x, r, w, W1, W2])
    check("layer_norm", lambda x, w, b: layer_norm(x, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, (H,), w, b, 1e-5), [x, w, b])
    w2, b2 = torch.randn(H, device=dev, dtype=dtype), torch.randn(H, device=dev, dtype=dtype)
    check("layer_norm_residual", lambda x, r, w, b: layer_norm_residual(x, r, w, b, 1e-5),
          lambda x, r, w, b: (x + r, F.layer_norm(x + r, (H,), w, b, 1e-5)), [x, r, w, b])
    check("layer_norm_dual", lambda x, w, b, w2, b2: layer_norm_dual(x, w, b, w2, b2, 1e-5),
          lambda x, w, b, w2, b2: (F.layer_norm(x, (H,), w, b, 1e-5), F.layer_norm(x, (H,), w2, b2, 1e-5)),
          [x, w, b, w2, b2])
    a, g = torch.randn(N, I, device=dev, dtype=dtype), torch.randn(N, I, device=dev, dtype=dtype)
    Wp = torch.randn(H, I, device=dev, dtype=dtype) * I**-0.5
    check("gelu_linear (exact)", lambda a, W: gelu_linear(a, W, None, "none"), lambda a, W: F.linear(F.gelu(a), W),
          [a, Wp])
    check("swiglu", swiglu, lambda a, g: F.silu(a) * g, [a, g])
    check("geglu (tanh)", lambda a, g: geglu(a, g, approximate="tanh"), lambda a, g: F.gelu(a, approximate="tanh") * g, [a, g])
    B, T, nh, ng, hs = (2, 1024, 32, 8, 64) if cuda else (2, 8, 4, 2, 16)
    q = torch.randn(B, nh, T, hs, device=dev, dtype=dtype)
    k = torch.randn(B, ng, T, hs, device=dev, dtype=dtype)
    cos, sin = build_rope_cache(T, hs, device=dev)
    cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    check("rope (q+k, GQA)", lambda q, k: rope(q, k, cos, sin), lambda q, k: (apply_rope(q, cos.double(), sin.double()), apply_rope(k, cos.double(), sin.double())), [q, k])

    def litgpt_qkv(qkv):  # LitGPT's split + view + transpose + apply_rope, in fp64
        q, k, v = qkv.split((nh * hs, ng * hs, ng * hs), dim=-1)
        q, k, v = (t.reshape(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))
        return apply_rope(q, cos.double(), sin.double()), apply_rope(k, cos.double(), sin.double()), v

    qkv = torch.randn(B, T, (nh + 2 * ng) * hs, device=dev, dtype=dtype)
    check("rope_qkv (fused qkv)", lambda qkv: rope_qkv(qkv, cos, sin, nh, ng), litgpt_qkv, [qkv])
    v = torch.randn(B, ng, T, hs, device=dev, dtype=dtype)
    check("softcap_attention (GQA)", lambda q, k, v: softcap_attention(q, k, v, 2 * hs**-0.5, 5.0),
          lambda q, k, v: attention_reference(q, k, v, 2 * hs**-0.5, 5.0), [q, k, v])
    xs = torch.randn(N, H, device=dev, dtype=dtype)
    W = torch.randn(V, H, device=dev, dtype=dtype) * H**-0.5
    tgt = torch.randint(0, V, (N,), device=dev)
    tgt[::7] = -100
    check("fused_linear_cross_entropy", lambda x, W: fused_linear_cross_entropy(x, W, tgt), lambda x, W: F.cross_entropy(F.linear(x, W), tgt), [xs, W])

    float8_ok = not cuda or torch.cuda.get_device_capability(dev) >= (8, 9)
    if float8_ok:  # LigerConfig.fp8="tensorwise"'s casts: the bits of a tensorwise cast of the 16-bit kernels' output
        from lit_liger.kernels import float8 as f8
        from lit_liger.kernels.rms_norm import _rms_norm_fwd_impl
        from lit_liger.kernels.swiglu import _glu_fwd_impl

        t0 = time.perf_counter()
        xh, rh, wh = (t.to(torch.bfloat16) for t in (x, torch.randn_like(x), w))
        ah, bh = (torch.randn(N, I, device=dev, dtype=torch.bfloat16) for _ in range(2))
        y16 = _rms_norm_fwd_impl(xh, rh, wh, 1e-6, 0.0)[0]
        s_, rstd, y8, ys = f8.norm_fp8(xh, rh, wh, 1e-6, 0.0)
        h8, h8_t, hs = f8.glu_fp8(ah, bh, "silu", write_t=True)
        y_ref = f8.cast_reference(y16, f8.E4M3)[0]
        h_ref = f8.cast_reference(_glu_fwd_impl(ah, bh, "silu"), f8.E4M3)[0]
        pairs = [(y8, y_ref), (f8.norm_fp8_t(s_, rstd, wh, 0.0, ys), y_ref.t()), (h8, h_ref), (h8_t, h_ref.t()),
                 (f8.fp8_cast(xh, f8.E5M2)[0], f8.cast_reference(xh, f8.E5M2)[0])]
        # the share of float8 bytes that differ (0: bit for bit)
        err = max((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).float().mean().item()
                  for a, b in pairs)
        rows.append(("float8 casts (tensorwise)", err, 0.0, err == 0.0, time.perf_counter() - t0))
    print(f"{'op':<28} {'fwd rel err':>12} {'grad rel err':>13}  {'ok':<4} {'s':>6}")
    for name, fe, ge, ok, s in rows:
        print(f"{name:<28} {fe:>12.2e} {ge:>13.2e}  {'ok' if ok else 'FAIL':<4} {s:>6.2f}")
    failed = [r[0] for r in rows if not r[3]]
    if not float8_ok:
        print("float8 casts: not checked (this GPU has no float8 support: sm_89 and newer)")
    print("all kernels match their references" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
