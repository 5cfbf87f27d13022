"""lit-liger's Triton causal/softcap attention (kernels/attention.py) against FlexAttention, on the GPU.

For each shape: accuracy of both against an fp32 reference (forward and the three gradients), then times
(CUDA events, median of N):
* FlexAttention as lit-liger runs it (``lit_liger.swap.attend.flex_attend``), forward and forward+backward;
* the Triton kernels with the default plan (``_launch.attention_plan``), forward, backward, forward+backward;
* each candidate setting of one kernel (forward, key-block backward, query-block backward) with the others
  at the default, timed on that kernel's call alone (candidates that do not fit the GPU are skipped);
* the best of each combined;
* SDPA flash and cuDNN on the same shape without the softcap (what a fused kernel of the library reaches).
Writes ``attn_sweep.json``.

    python -m benchmarks diag attn-sweep --out DIR [--shapes gemma2] [--quick] [--round N]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ._common import cuda_median_ms
from lit_liger.swap import attend as A
from lit_liger.kernels import _launch as L
from lit_liger.kernels import attention as K

SHAPES = {  # name: (B, n_head, n_query_groups, T, head_size, softcap, scale)
    "gemma2": (4, 8, 4, 2048, 256, 50.0, 256 ** -0.5),
    "gemma2-b1": (1, 8, 4, 512, 256, 50.0, 256 ** -0.5),
    "hs128": (4, 16, 8, 2048, 128, 30.0, 128 ** -0.5),
}
DTYPES = {"gemma2-fp32": ("gemma2-b1", torch.float32)}  # name: (shape, dtype other than bf16)
# packed micro-batches as gemma2-2b's shipped LoRA recipe runs them (micro-batch 2 of Alpaca2k, max_seq_length 512,
# packed into one row of a length bucket): name: (B, n_head, n_query_groups, T, head_size, softcap, scale, sample
# lengths); the kernels take each position's sample start (``starts``) and skip earlier samples' key blocks
PACKED = {
    "gemma2-pack512": (1, 8, 4, 512, 256, 50.0, 256 ** -0.5, (291, 187)),
    "gemma2-pack1024": (1, 8, 4, 1024, 256, 50.0, 256 ** -0.5, (512, 397)),
    "gemma2-pack256": (1, 8, 4, 256, 256, 50.0, 256 ** -0.5, (131, 97)),
}
SHAPES.update({k_: v_[:7] for k_, v_ in PACKED.items()})

FWD = [(64, 32, 4, 2), (64, 64, 4, 2), (64, 64, 8, 2), (64, 64, 8, 3), (128, 32, 8, 2), (128, 64, 8, 2),
       (128, 64, 8, 1), (64, 128, 8, 2), (128, 128, 8, 1)]
KV = [(32, 32, 4, 2), (64, 32, 4, 2), (64, 32, 8, 2), (32, 64, 8, 2), (64, 64, 8, 2), (64, 64, 8, 1),
      (128, 32, 8, 2), (32, 128, 8, 2), (64, 128, 8, 1), (32, 64, 4, 3)]
QB = [(64, 32, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2), (32, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2),
      (64, 64, 8, 1), (32, 32, 4, 2), (64, 64, 4, 3)]

# second round, around the first round's best (fwd 128x64 w8 s2, kv 128x32 w8 s2, q 128x32 w8 s2: the default now)
ROUND2 = dict(
    fwd=[(128, 64, 8, 2), (128, 32, 4, 2), (128, 64, 8, 3), (128, 32, 8, 3), (128, 64, 4, 2), (256, 32, 8, 1)],
    kv=[(128, 32, 8, 2), (128, 32, 8, 3), (128, 32, 4, 2), (128, 64, 8, 1), (256, 32, 8, 1), (128, 16, 4, 2),
        (64, 16, 4, 2), (256, 16, 8, 2)],
    q=[(128, 32, 8, 2), (128, 32, 8, 3), (128, 32, 4, 2), (128, 16, 8, 2), (256, 32, 8, 1), (128, 16, 4, 2),
       (256, 16, 8, 2)],
)

# third round: 16 warps (half the accumulator registers per thread) around the second round's best
ROUND3 = dict(
    fwd=[(128, 64, 8, 2), (128, 64, 16, 2), (128, 128, 16, 1), (256, 64, 16, 1)],
    kv=[(128, 32, 8, 2), (128, 64, 16, 2), (64, 64, 16, 2), (128, 32, 16, 2), (128, 64, 16, 1), (64, 32, 8, 2)],
    q=[(128, 32, 8, 3), (128, 64, 16, 2), (128, 32, 16, 3), (256, 32, 16, 2), (128, 64, 16, 1)],
)

# fourth round: the key-block backward's two layouts (5th field ``kv_hs_major``: 0 = dk/dv as (keys, hs), whose dots
# need 64-key blocks for Hopper's warp-group MMA; 1 = their transposes (hs, keys), the head size as the dots' M)
ROUND4 = dict(
    fwd=[(128, 64, 8, 2)],
    kv=[(128, 32, 8, 2, 0), (32, 64, 8, 2, 0), (16, 64, 8, 2, 0), (16, 64, 8, 3, 0), (128, 16, 8, 1, 1),
        (128, 32, 8, 1, 1), (64, 16, 8, 2, 1), (64, 32, 8, 2, 1)],
    q=[(128, 32, 8, 3), (128, 32, 8, 2)],
)

# fifth round: head size 128 (not swept before), both layouts of the key-block backward around its current plan
ROUND5 = dict(
    fwd=[(128, 64, 8, 2)],
    kv=[(64, 64, 8, 2, 0), (128, 64, 8, 1, 1), (128, 64, 8, 2, 1), (64, 64, 8, 2, 1), (128, 32, 8, 2, 1),
        (128, 32, 8, 1, 1), (128, 128, 8, 1, 1)],
    q=[(64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 2)],
)

# sixth round (head size 256): 64-key blocks in the (hs, keys) layout, 64-key blocks for the query-block backward
ROUND6 = dict(
    fwd=[(128, 64, 8, 2)],
    kv=[(128, 32, 8, 1, 1), (128, 64, 8, 1, 1), (64, 64, 8, 1, 1), (128, 64, 8, 2, 1), (64, 64, 8, 2, 1)],
    q=[(128, 32, 8, 3), (128, 64, 8, 1), (64, 64, 8, 2), (64, 64, 4, 2)],
)


# seventh round (head size 256, short packed rows): few query / key blocks per head leave most of the GPU's SMs idle
# (T 1024, 8 heads: 64 blocks of 128 rows for 132 SMs): smaller blocks around the long-sequence plan
ROUND7 = dict(
    fwd=[(128, 64, 8, 2), (64, 64, 4, 2), (64, 64, 8, 2), (64, 32, 4, 2), (64, 32, 4, 3), (32, 64, 4, 2),
         (32, 32, 4, 2), (64, 128, 8, 1)],
    kv=[(128, 64, 8, 1, 1), (64, 64, 8, 1, 1), (128, 32, 8, 1, 1), (64, 32, 8, 2, 1), (64, 32, 4, 2, 1),
        (32, 32, 4, 2, 1), (128, 16, 4, 2, 1), (64, 16, 4, 2, 1), (32, 64, 8, 2, 0), (16, 64, 8, 2, 0),
        (16, 32, 4, 2, 0)],
    q=[(128, 32, 8, 3), (64, 32, 8, 3), (64, 32, 4, 2), (64, 64, 8, 2), (32, 64, 4, 2), (32, 32, 4, 2),
       (64, 16, 4, 3), (16, 64, 4, 2)],
)


#: each kernel's AttentionPlan fields, in the order of a candidate tuple; the candidate sets by round
_FIELDS = (("fwd", ("fwd_m", "fwd_n", "fwd_warps", "fwd_stages")),
           ("kv", ("kv_m", "kv_n", "kv_warps", "kv_stages", "kv_hs_major")),
           ("q", ("q_m", "q_n", "q_warps", "q_stages")))
_ROUNDS = {1: dict(fwd=FWD, kv=KV, q=QB), 2: ROUND2, 3: ROUND3, 4: ROUND4, 5: ROUND5, 6: ROUND6, 7: ROUND7}


def graph_median_ms(fn, n=20, reps=10) -> float:
    """Median milliseconds of one ``fn()`` replayed in a CUDA graph of ``reps`` calls: short kernels timed without
    the host's launch latency (as lit-liger's captured training steps run them)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        for _ in range(reps):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return cuda_median_ms(g.replay, n) / reps


def _errs(out, grads, ref_out, ref_grads) -> dict:
    return {"out": (out.float() - ref_out).abs().max().item(),
            **{f"d{n}": (g.float() - r).abs().max().item() for n, g, r in zip("qkv", grads, ref_grads)}}


def run_shape(name: str, n: int, quick: bool, rnd: int = 1) -> dict:
    base_name, dtype = DTYPES.get(name, (name, torch.bfloat16))
    B, nh, ng, T, hs, cap, scale = SHAPES[base_name]
    dev = torch.device("cuda")
    starts = None
    if base_name in PACKED:  # each position's sample start; the pad after the samples is one more segment
        lens = PACKED[base_name][7]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist(), T], device=dev)
        starts = K.sample_starts(cu, T)
    g = torch.Generator(device=dev).manual_seed(0)
    # the post-RoPE layout lit-liger passes: (B, heads, T, hs) views of (B, T, heads, hs)
    q = torch.randn(B, T, nh, hs, device=dev, dtype=dtype, generator=g).transpose(1, 2)
    k = torch.randn(B, T, ng, hs, device=dev, dtype=dtype, generator=g).transpose(1, 2)
    v = torch.randn(B, T, ng, hs, device=dev, dtype=dtype, generator=g).transpose(1, 2)
    do = torch.randn(B, nh, T, hs, device=dev, dtype=dtype, generator=g)
    res: dict = {"shape": dict(B=B, n_head=nh, n_query_groups=ng, T=T, head_size=hs, softcap=cap, scale=scale,
                               dtype=str(dtype))}

    # accuracy against fp32 math (both kernels in bf16)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = K.reference(qf, kf, vf, scale, cap, starts=starts)
    ref_g = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    ref = ref.detach()
    ref32 = (ref, ref_g)
    del qf, kf, vf
    qb, kb, vb = (t.detach().requires_grad_() for t in (q, k, v))
    o = K.softcap_attention(qb, kb, vb, scale, cap, starts=starts)
    res["err_triton"] = _errs(o, torch.autograd.grad(o, (qb, kb, vb), do), ref, ref_g)
    capf = float(cap or 0.0)
    if starts is not None:  # packed: lit-liger's kernels only, in CUDA graphs (the recipe's steps are captured)
        res["samples"] = list(PACKED[base_name][7])
        return _sweep_packed(res, q, k, v, do, qb, kb, vb, ref32=(ref, ref_g), scale=scale, cap=cap, capf=capf,
                             starts=starts, n=n, quick=quick, rnd=rnd, name=name, hs=hs)
    o = A.flex_attend(qb, kb, vb, scale=scale, softcap=cap)
    res["err_flex"] = _errs(o, torch.autograd.grad(o, (qb, kb, vb), do), ref, ref_g)
    del o

    def fwd_bwd(fn):
        def step():
            out = fn(qb, kb, vb)
            torch.autograd.grad(out, (qb, kb, vb), do)
        return step

    flex = lambda a, b, c: A.flex_attend(a, b, c, scale=scale, softcap=cap)  # noqa: E731
    tri = lambda a, b, c: K.softcap_attention(a, b, c, scale, cap)  # noqa: E731
    res["flex_fwd_ms"] = cuda_median_ms(lambda: flex(q, k, v), n)
    res["flex_fwd_bwd_ms"] = cuda_median_ms(fwd_bwd(flex), n)
    res["triton_fwd_bwd_ms"] = cuda_median_ms(fwd_bwd(tri), n)
    o, lse = K._attn_fwd_impl(q, k, v, scale, capf)
    res["triton_fwd_ms"] = cuda_median_ms(lambda: K._attn_fwd_impl(q, k, v, scale, capf), n)
    res["triton_bwd_ms"] = cuda_median_ms(lambda: K._attn_bwd_impl(do, q, k, v, o, lse, scale, capf), n)
    for backend, label in ((torch.nn.attention.SDPBackend.FLASH_ATTENTION, "sdpa_flash_nocap"),
                           (torch.nn.attention.SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn_nocap")):
        def sdpa(a, b, c, backend=backend):
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(a, b, c, is_causal=True, scale=scale, enable_gqa=ng != nh)
        try:
            res[label + "_fwd_bwd_ms"] = cuda_median_ms(fwd_bwd(sdpa), n)
        except Exception as e:  # noqa: BLE001 - a backend that does not take this shape
            res[label + "_fwd_bwd_ms"] = f"{type(e).__name__}: {str(e)[:120]}"
    if quick:
        return res

    base = L.attention_plan(hs, q.dtype, dev)
    sweeps = {}
    cand = _ROUNDS[rnd]
    errs = {}
    for part, fields in _FIELDS:
        rows = {}
        for c in cand[part]:
            plan = dataclasses.replace(base, **dict(zip(fields, c)))
            L.ATTENTION_PLAN_OVERRIDE[0] = plan
            try:
                if part == "fwd":
                    rows[str(c)] = cuda_median_ms(lambda: K._attn_fwd_impl(q, k, v, scale, capf), n)
                else:
                    # the whole backward: the other backward kernel is at the default in every row of this part
                    rows[str(c)] = cuda_median_ms(lambda: K._attn_bwd_impl(do, q, k, v, o, lse, scale, capf), n)
                    # and this plan's gradients against fp32 math (a wrong layout or mask shows here)
                    o2 = K.softcap_attention(qb, kb, vb, scale, cap)
                    errs[f"{part} {c}"] = _errs(o2, torch.autograd.grad(o2, (qb, kb, vb), do), ref32[0], ref32[1])
            except Exception as e:  # noqa: BLE001 - out of shared memory / registers
                rows[str(c)] = f"{type(e).__name__}: {str(e)[:100]}"
            finally:
                L.ATTENTION_PLAN_OVERRIDE[0] = None
        sweeps[part] = rows
        print(name, part, {k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in rows.items()}, flush=True)
    res["sweeps"] = sweeps
    res["sweep_errs"] = errs

    def best(part):
        ok = {k_: v_ for k_, v_ in sweeps[part].items() if isinstance(v_, float)}
        return eval(min(ok, key=ok.get)) if ok else None  # noqa: S307 - our own tuple reprs

    chosen = {}
    for part, fields in _FIELDS:
        b_ = best(part)
        if b_ is not None:
            chosen.update(zip(fields, b_))
    plan = dataclasses.replace(base, **chosen)
    res["best_plan"] = dataclasses.asdict(plan)
    L.ATTENTION_PLAN_OVERRIDE[0] = plan
    try:
        res["best_fwd_bwd_ms"] = cuda_median_ms(fwd_bwd(tri), n)
        o2 = K.softcap_attention(qb, kb, vb, scale, cap)
        res["err_triton_best"] = _errs(o2, torch.autograd.grad(o2, (qb, kb, vb), do), ref32[0], ref32[1])
    finally:
        L.ATTENTION_PLAN_OVERRIDE[0] = None
    flex_fb = res["flex_fwd_bwd_ms"]
    print(f"{name}: flex {flex_fb:.3f} ms, triton default {res['triton_fwd_bwd_ms']:.3f}, best {res['best_fwd_bwd_ms']:.3f} "
          f"plan {chosen}", flush=True)
    return res


def _sweep_packed(res, q, k, v, do, qb, kb, vb, *, ref32, scale, cap, capf, starts, n, quick, rnd, name, hs) -> dict:
    """A packed shape: the kernels' forward and backward (``_attn_fwd_impl`` / ``_attn_bwd_impl`` with ``starts``)
    timed in CUDA graphs, the default plan, then each candidate of one kernel with the others at the default (the
    forward's candidates on the forward alone; the two backward kernels' on the whole backward), each candidate's
    gradients against fp32 math, and the best of each combined."""
    fwd = lambda: K._attn_fwd_impl(q, k, v, scale, capf, starts)  # noqa: E731
    o, lse = fwd()
    bwd = lambda: K._attn_bwd_impl(do, q, k, v, o, lse, scale, capf, starts)  # noqa: E731

    def both():
        o2, lse2 = K._attn_fwd_impl(q, k, v, scale, capf, starts)
        K._attn_bwd_impl(do, q, k, v, o2, lse2, scale, capf, starts)

    res["triton_fwd_ms"], res["triton_bwd_ms"] = graph_median_ms(fwd, n), graph_median_ms(bwd, n)
    res["triton_fwd_bwd_ms"] = graph_median_ms(both, n)
    B, nh, T = q.shape[:3]
    base = L.attention_plan(hs, q.dtype, q.device, T, B * nh)  # the plan this shape runs with
    res["default_plan"] = dataclasses.asdict(base)
    L.ATTENTION_PLAN_OVERRIDE[0] = L.attention_plan(hs, q.dtype, q.device)  # the long sequences' plan
    try:
        res["long_plan_fwd_bwd_ms"] = graph_median_ms(both, n)
    finally:
        L.ATTENTION_PLAN_OVERRIDE[0] = None
    print(name, "default: fwd, bwd, both", res["triton_fwd_ms"], res["triton_bwd_ms"], res["triton_fwd_bwd_ms"],
          "the long plan's both", res["long_plan_fwd_bwd_ms"], flush=True)
    if quick:
        return res
    sweeps, errs, chosen = {}, {}, {}
    for part, fields in _FIELDS:
        rows = {}
        for c in _ROUNDS[rnd][part]:
            L.ATTENTION_PLAN_OVERRIDE[0] = dataclasses.replace(base, **dict(zip(fields, c)))
            try:
                rows[str(c)] = graph_median_ms(fwd if part == "fwd" else bwd, n)
                o2 = K.softcap_attention(qb, kb, vb, scale, cap, starts=starts)
                errs[f"{part} {c}"] = _errs(o2, torch.autograd.grad(o2, (qb, kb, vb), do), *ref32)
            except Exception as e:  # noqa: BLE001 - out of shared memory / registers
                rows[str(c)] = f"{type(e).__name__}: {str(e)[:100]}"
            finally:
                L.ATTENTION_PLAN_OVERRIDE[0] = None
        sweeps[part] = rows
        ok = {k_: v_ for k_, v_ in rows.items() if isinstance(v_, float)}
        if ok:
            chosen.update(zip(fields, eval(min(ok, key=ok.get))))  # noqa: S307 - our own tuple reprs
        print(name, part, {k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in rows.items()}, flush=True)
    res["sweeps"], res["sweep_errs"] = sweeps, errs
    plan = dataclasses.replace(base, **chosen)
    res["best_plan"] = dataclasses.asdict(plan)
    L.ATTENTION_PLAN_OVERRIDE[0] = plan
    try:
        res["best_fwd_bwd_ms"] = graph_median_ms(both, n)
        o2 = K.softcap_attention(qb, kb, vb, scale, cap, starts=starts)
        res["err_triton_best"] = _errs(o2, torch.autograd.grad(o2, (qb, kb, vb), do), *ref32)
    finally:
        L.ATTENTION_PLAN_OVERRIDE[0] = None
    print(f"{name}: default {res['triton_fwd_bwd_ms']:.4f} ms, best {res['best_fwd_bwd_ms']:.4f} plan {chosen}",
          flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="gemma2")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="accuracy and the default plan only (no sweep)")
    ap.add_argument("--round", type=int, default=1, choices=tuple(_ROUNDS),
                    help="candidate set: 1 or ROUND2 ... ROUND7")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "shapes": {}}
    for name in a.shapes.split(","):
        results["shapes"][name] = run_shape(name, a.n, a.quick, a.round)
        r = results["shapes"][name]
        print(json.dumps({k_: v_ for k_, v_ in r.items() if k_ != "sweeps"}, default=str), flush=True)
        (out / "attn_sweep.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
