"""Host cost per op: lit-liger's eager ops against the LitGPT / aten code they replace (issue 16).

usage: python -m benchmarks diag op-host [OUT.json]   (env: ITERS, REPS, DEVICE=cpu, PROFILE_ONLY, CASES=name,part)

At LitGPT's recipe sizes a training step is bound by the host: what matters per op is the time the Python
thread needs to issue it (checks, allocations, autograd, Triton's launcher), not the GPU time. Each case runs
forward + backward ``ITERS`` times without a synchronization and reports the time to *issue* them (the
queue never fills at these sizes, so this is host time) and the wall time including the GPU's, per call, in
microseconds; the median of ``REPS`` repetitions. Shapes: Llama-3.2-1B widths (C 2048, 32 / 8 heads of 64,
MLP 8192), bf16, at a tiny (B 1, T 16: host only) and the recipe's (B 4, T 512) token count.

Also the pieces of one lit-liger RMSNorm call (input checks, launch plan, allocations, the bare Triton
launch, an empty autograd Function) and one plain aten launch, to see where the microseconds go, and the
number of GPU kernels each case launches (torch.profiler, one call).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from litgpt.model import RMSNorm, apply_rope, build_rope_cache

from lit_liger.kernels.rms_norm import rms_norm, rms_norm_linear, rms_norm_residual
from lit_liger.kernels.rope import rope_qkv
from lit_liger.kernels.swiglu import glu_linear, swiglu
from lit_liger.kernels._launch import row_plan
from lit_liger.swap.lora import lora_linear, lora_parts

K_rms = sys.modules["lit_liger.kernels.rms_norm"]  # the module (the package exports the function of that name)

import os  # noqa: E402

ITERS, REPS = int(os.environ.get("ITERS", 40)), int(os.environ.get("REPS", 9))
dev = torch.device(os.environ.get("DEVICE", "cuda"))  # DEVICE=cpu with TRITON_INTERPRET=1: a smoke run
dt = torch.bfloat16
C, NH, NG, HS, I = 2048, 32, 8, 64, 8192


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def host_us(step) -> tuple[float, float]:
    return host_us_many(step)[0]


def host_us_many(*steps) -> list[tuple[float, float]]:
    """(issue, wall) medians per step, microseconds per call; the steps take turns in every repetition, so a
    drift of the machine (another process, clocks) reaches all of them alike."""
    for step in steps:
        for _ in range(2):
            step()
    sync()
    issue, wall = [[] for _ in steps], [[] for _ in steps]
    for _ in range(REPS):
        for i, step in enumerate(steps):
            t0 = time.perf_counter()
            for _ in range(ITERS):
                step()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            issue[i].append((t1 - t0) / ITERS * 1e6)
            wall[i].append((t2 - t0) / ITERS * 1e6)
    return [(statistics.median(a), statistics.median(b)) for a, b in zip(issue, wall)]


class triton_path:
    """Launch lit-liger's kernels through Triton's own JITFunction.run (FastKernel off) inside the block."""

    def __enter__(self):
        self._launch = sys.modules.get("lit_liger.kernels._launch")
        self._saved = getattr(self._launch, "_FAST", None)
        if self._saved is not None:
            self._launch._FAST = [False]

    def __exit__(self, *exc):
        if self._saved is not None:
            self._launch._FAST = self._saved


def kernels_per_call(step) -> int:
    from torch.profiler import ProfilerActivity, profile

    if dev.type != "cuda":
        return 0
    step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def cases(B: int, T: int):
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, grad=True, scale=1.0):
        return (torch.randn(*shape, device=dev, dtype=dt, generator=g) * scale).requires_grad_(grad)

    x, r = rnd(B, T, C), rnd(B, T, C)
    w = rnd(C)
    dy = torch.randn(B, T, C, device=dev, dtype=dt)
    norm = RMSNorm(C, eps=1e-5).to(dev, dt)

    def bwd(*outs_grads):
        outs = [o for o, _ in outs_grads]
        torch.autograd.backward(outs, [gg for _, gg in outs_grads])

    yield "rms_norm", (lambda: bwd((norm(x), dy))), (lambda: bwd((rms_norm(x, w, 1e-5), dy)))

    def stock_res():
        s = x + r
        bwd((s, dy), (norm(s), dy))

    def liger_res():
        s, n = rms_norm_residual(x, r, w, 1e-5)
        bwd((s, dy), (n, dy))

    yield "add + rms_norm", stock_res, liger_res

    # norm -> two Linears (full fine-tuning's norm_2 -> fc_1, fc_2)
    w1, w2 = rnd(I, C, scale=0.02), rnd(I, C, scale=0.02)
    di = torch.randn(B, T, I, device=dev, dtype=dt)

    def stock_nl():
        n = norm(x)
        bwd((F.linear(n, w1), di), (F.linear(n, w2), di))

    def liger_nl():
        _, (o1, o2) = rms_norm_linear(x, w, [(w1, None), (w2, None)], 1e-5)
        bwd((o1, di), (o2, di))

    yield "rms_norm -> 2 Linear", stock_nl, liger_nl

    qkv = rnd(B, T, (NH + 2 * NG) * HS)
    cos, sin = build_rope_cache(T, HS, device=dev)
    cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    dq = torch.randn(B, NH, T, HS, device=dev, dtype=dt)
    dk = torch.randn(B, NG, T, HS, device=dev, dtype=dt)
    dv = torch.randn(B, NG, T, HS, device=dev, dtype=dt)

    def stock_rope():  # LitGPT's CausalSelfAttention: split, view, transpose, apply_rope on q and k
        q, k, v = qkv.split((NH * HS, NG * HS, NG * HS), dim=-1)
        q = q.view(B, T, NH, HS).transpose(1, 2)
        k = k.view(B, T, NG, HS).transpose(1, 2)
        v = v.view(B, T, NG, HS).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        bwd((q, dq), (k, dk), (v, dv))

    def liger_rope():
        q, k, v = rope_qkv(qkv, cos, sin, NH, NG)
        bwd((q, dq), (k, dk), (v, dv))

    yield "qkv split + RoPE", stock_rope, liger_rope

    a, b = rnd(B, T, I), rnd(B, T, I)
    yield "silu(a) * b", (lambda: bwd((F.silu(a) * b, di))), (lambda: bwd((swiglu(a, b), di)))
    wp = rnd(C, I, scale=0.02)
    yield "proj(silu(a) * b)", (lambda: bwd((F.linear(F.silu(a) * b, wp), dy))), \
        (lambda: bwd((glu_linear(a, b, wp), dy)))

    # LitGPT LoRA qkv (r 8, q and v, frozen base): one GEMM + the parts' updates
    from litgpt.lora import LoRAQKVLinear

    lq = LoRAQKVLinear(C, (NH + 2 * NG) * HS, head_size=HS, n_head=NH, n_query_groups=NG, r=8, lora_alpha=16,
                       lora_dropout=0.05, enable_lora=(True, False, True)).to(dev, dt)
    lq.linear.weight.requires_grad_(False)
    torch.nn.init.normal_(lq.lora_B, std=0.02)
    xq = rnd(B, T, C)
    dqkv = torch.randn(B, T, (NH + 2 * NG) * HS, device=dev, dtype=dt)
    parts = lora_parts(lq)
    lq.train()

    def liger_lora():
        xd = F.dropout(xq, 0.05, training=True)
        out = lora_linear(xq, lq.linear.weight, None, lq.lora_A, lq.lora_B, lq.scaling, parts, xd)
        bwd((out, dqkv))

    yield "LoRA qkv (r 8, q+v)", (lambda: bwd((lq(xq), dqkv))), liger_lora

    # the whole MLP as LitGPT's Block runs it after attention (frozen weights, as in LoRA): norm_2 -> fc_1, fc_2 ->
    # silu(a) * b -> proj. The GLU ops above are its smallest pieces; this is what the adapter swaps them into.
    w1f, w2f, wpf = (t.detach() for t in (w1, w2, wp))

    def stock_mlp():
        n = norm(x)
        bwd((F.linear(F.silu(F.linear(n, w1f)) * F.linear(n, w2f), wpf), dy))

    def liger_mlp():
        _, (a_, b_) = rms_norm_linear(x, w, [(w1f, None), (w2f, None)], 1e-5)
        bwd((glu_linear(a_, b_, wpf), dy))

    yield "MLP: norm -> GLU -> proj", stock_mlp, liger_mlp


def _triton_jit(kernel):
    """The JIT function under a FastKernel (an older tree's kernels are JIT functions themselves)."""
    return kernel.fn if type(kernel).__name__ == "FastKernel" else kernel


def pieces(B: int, T: int) -> dict[str, float]:
    """Where one lit-liger RMSNorm forward's host time goes (issue time per call, microseconds)."""
    x = torch.randn(B, T, C, device=dev, dtype=dt)
    w = torch.randn(C, device=dev, dtype=dt)
    x2 = x.view(-1, C)
    y = torch.empty_like(x2)
    rstd = torch.empty(x2.shape[0], device=dev, dtype=torch.float32)
    plan = row_plan(C, 2, dev)

    class Nop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            return g

    xg = x.clone().requires_grad_(True)
    out = {
        "check (dtype, device, shape)": lambda: K_rms._check(x, w),
        "row_plan": lambda: row_plan(C, 2, dev),
        "2 x torch.empty": lambda: (torch.empty_like(x2), torch.empty(x2.shape[0], device=dev, dtype=torch.float32)),
        "bare Triton launch (rms fwd)": lambda: K_rms._rms_fwd_kernel[(x2.shape[0],)](
            x2, x2, y, y, w, rstd, x2.stride(0), x2.stride(0), C, y.stride(0), C, 1e-5, 0.0,
            HAS_RESIDUAL=False, BLOCK=plan.block, num_warps=plan.num_warps),
        # the same launch through Triton's JITFunction.run (what every launch cost before kernels/_launch.py's
        # FastKernel; the line above is the direct launcher where this Triton has it)
        "bare Triton launch, Triton's own path": lambda: _triton_jit(K_rms._rms_fwd_kernel)[
            (x2.shape[0],)](
            x2, x2, y, y, w, rstd, x2.stride(0), x2.stride(0), C, y.stride(0), C, 1e-5, 0.0,
            HAS_RESIDUAL=False, BLOCK=plan.block, num_warps=plan.num_warps),
        "aten add (one launch)": lambda: torch.add(x, x),
        "autograd.Function, no kernel": lambda: Nop.apply(xg),
        "rms_norm forward, no grad": lambda: K_rms.rms_norm(x, w, 1e-5),
    }
    norm = RMSNorm(C, eps=1e-5).to(dev, dt)
    out["litgpt RMSNorm forward, no grad"] = lambda: norm(x)
    with torch.no_grad():
        res = dict(zip([k for k in out if "autograd" not in k],
                       [r[0] for r in host_us_many(*[f for k, f in out.items() if "autograd" not in k])]))
    res["autograd.Function, no kernel"] = host_us(out["autograd.Function, no kernel"])[0]
    return res


def profile_ops(B: int = 1, T: int = 16, n: int = 400) -> str:
    """cProfile of lit-liger's GLU, GLU->Linear and RMSNorm forward + backward (autograd's device thread off, so
    the backward's Python runs on the profiled thread), top functions by own time."""
    import cProfile
    import io
    import pstats

    a = torch.randn(B, T, I, device=dev, dtype=dt, requires_grad=True)
    b = torch.randn(B, T, I, device=dev, dtype=dt, requires_grad=True)
    wp = (torch.randn(C, I, device=dev, dtype=dt) * 0.02).requires_grad_(True)
    x = torch.randn(B, T, C, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(C, device=dev, dtype=dt, requires_grad=True)
    di, dc = torch.randn(B, T, I, device=dev, dtype=dt), torch.randn(B, T, C, device=dev, dtype=dt)

    def step():
        torch.autograd.backward([swiglu(a, b), glu_linear(a, b, wp), rms_norm(x, w, 1e-5)], [di, dc, dc])

    torch.autograd.set_multithreading_enabled(False)
    try:
        multi_off = host_us(step)[0]
        for _ in range(5):
            step()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(n):
            step()
        sync()
        pr.disable()
    finally:
        torch.autograd.set_multithreading_enabled(True)
    multi_on = host_us(step)[0]
    buf = io.StringIO()
    buf.write(f"swiglu + glu_linear + rms_norm fwd+bwd, issue us: autograd device thread on {multi_on:.1f}, "
              f"off {multi_off:.1f}\n")
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(28)
    return buf.getvalue()


def main() -> None:
    import triton

    props = torch.cuda.get_device_properties(0) if dev.type == "cuda" else type("P", (), {"name": "cpu"})

    try:
        from lit_liger.kernels._launch import fast_launch_enabled

        fast = fast_launch_enabled()
    except ImportError:  # an older tree (the before/after comparison runs this script against one)
        fast = None
    result = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__, "cases": [], "pieces": {},
              "fast_launch": fast, "lit_liger_file": sys.modules["lit_liger.kernels.rms_norm"].__file__}
    print(f"{props.name} | torch {torch.__version__} | triton {triton.__version__} | fast launch {fast} | "
          f"{result['lit_liger_file']}")
    shapes = ((1, 16), (4, 512)) if dev.type == "cuda" else ((1, 4),)
    for B, T in shapes if not os.environ.get("PROFILE_ONLY") else ():
        print(f"\nB {B} T {T}: per forward+backward call, microseconds (issue = host time; wall includes the GPU)")
        print(f"{'op':24s} {'stock issue':>11s} {'liger issue':>11s} {'x':>5s} {'stock wall':>10s} {'liger wall':>10s} "
              f"{'kernels s/l':>11s} {'1-thread: s':>11s} {'l':>9s} {'x':>5s} {'l, Triton path':>9s} {'x':>5s}")
        for name, stock, liger in cases(B, T):
            if os.environ.get("CASES") and not any(c in name for c in os.environ["CASES"].split(",")):
                continue  # CASES=MLP,RoPE: only the cases whose names contain one of these
            def liger_triton_path(liger=liger):
                with triton_path():
                    liger()

            (si, sw), (li, lw), (lt, _) = host_us_many(stock, liger, liger_triton_path)
            ks, kl = kernels_per_call(stock), kernels_per_call(liger)
            torch.autograd.set_multithreading_enabled(False)  # backward on this thread: no GIL hand-over
            try:
                (si1, _), (li1, _) = host_us_many(stock, liger)
            finally:
                torch.autograd.set_multithreading_enabled(True)
            result["cases"].append({"B": B, "T": T, "op": name, "stock_issue_us": si, "liger_issue_us": li,
                                    "liger_issue_us_triton_path": lt,
                                    "stock_wall_us": sw, "liger_wall_us": lw, "stock_kernels": ks, "liger_kernels": kl,
                                    "stock_issue_us_1thread": si1, "liger_issue_us_1thread": li1})
            print(f"{name:24s} {si:11.1f} {li:11.1f} {li / si:5.2f} {sw:10.1f} {lw:10.1f} {ks:5d}/{kl:<5d} "
                  f"{si1:9.1f} {li1:9.1f} {li1 / si1:5.2f} {lt:9.1f} {lt / si:5.2f}")
    print("\npieces of one lit-liger RMSNorm forward (B 1, T 16), issue microseconds:")
    result["pieces"] = pieces(1, 16)
    for k, v in result["pieces"].items():
        print(f"  {k:34s} {v:7.1f}")
    result["profile"] = profile_ops()
    print(result["profile"])
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
