"""Per-kernel benchmark: fwd+bwd time, extra memory and time/floor of every op and variant.

    python -m benchmarks kernels [--out DIR] [--quick] [--smoke] [--ops rmsnorm,rope,...]

For each op shape (DESIGN.md "Benchmark method") and each variant -- LitGPT's own eager code,
``torch.compile`` of that code, liger-kernel 0.8.5 (when installed) and lit-liger -- it measures:

* fwd+bwd median time (``triton.testing.do_bench``, grad_output made outside the timed call), twice;
* extra memory: peak during one fwd+bwd minus (inputs + the grads it produces), measured as DESIGN.md
  says: run once keeping the grads, base = allocated, clear ``.grad``, reset the peak, run again;
* the floor: minimal bytes / copy bandwidth (memory-bound ops) or GEMM flops / matmul rate (fused
  linear cross-entropy), both ceilings measured at the start of the same run;
* a correctness spot check: relative error of the outputs and grads against the reference variant
  (LitGPT eager), so a fast wrong kernel cannot hide.
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
OPS = ("rmsnorm", "rope", "swiglu", "geglu", "layernorm", "flce")


# ----------------------------------------------------------------------------------------------
# What a case and a variant are
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Inputs:
    args: list[Any]  # positional arguments of every variant's forward
    grad_idx: tuple[int, ...]  # args that are leaves needing a gradient
    grad_outputs: tuple[torch.Tensor, ...] | None  # cotangents of the outputs (None: scalar loss)


@dataclasses.dataclass
class Variant:
    name: str  # table name: "litgpt eager", "torch.compile", "liger-kernel", "lit-liger", ...
    key: str  # result-key suffix, the anchor's where it has one: eager, compile, liger, ...
    build: Callable[[], Callable[..., Any]]  # -> forward(*args); raises C.Unavailable
    frozen: tuple[int, ...] = ()  # args passed detached (no gradient): the frozen lm_head case


@dataclasses.dataclass
class Case:
    key: str  # "rmsnorm_N16384_H2048": the anchor's naming
    op: str
    shape: dict[str, int]
    make_inputs: Callable[[], Inputs]
    variants: list[Variant]
    min_bytes: int | None = None  # memory-bound: unavoidable bytes of fwd + bwd
    flops: int | None = None  # GEMM-bound: flops of the GEMMs with all grads
    flops_frozen: int | None = None  # ... without the weight gradient

    def floor(self, variant: Variant, ceilings: dict[str, float]) -> tuple[float | None, str, float | None]:
        """(floor ms, unit of the achieved rate, work in that unit's numerator)."""
        if self.flops is not None:
            flops = self.flops_frozen if variant.frozen else self.flops
            rate = ceilings.get("floor_TFLOPs")
            return (flops / (rate * 1e12) * 1e3 if rate else None), "TFLOP/s", flops
        rate = ceilings.get("copy_GBps")
        return (self.min_bytes / (rate * 1e9) * 1e3 if rate else None), "GB/s", self.min_bytes


def _randn(*shape: int, scale: float = 1.0, offset: float = 0.0, grad: bool = False, dtype=DTYPE) -> torch.Tensor:
    t = torch.randn(*shape, device=C.device(), dtype=torch.float32).mul_(scale).add_(offset).to(dtype)
    return t.requires_grad_(grad)


def _compiled(fn: Callable) -> Callable[[], Callable]:
    def build():
        if not C.CUDA:
            raise C.Unavailable("skipped: no CUDA")
        return torch.compile(fn, dynamic=False)

    return build


def _liger(module: str, *names: str, wrap: Callable[[Any], Callable] | None = None) -> Callable[[], Callable]:
    """First of ``names`` found in liger-kernel's ``module`` (optionally wrapped)."""

    def build():
        mod = C.liger_kernel_module(module)
        for name in names:
            fn = getattr(mod, name, None)
            if fn is not None:
                return wrap(fn) if wrap else fn
        raise C.Unavailable(f"missing in liger-kernel: {module}.{names[0]}")

    return build


def _lit(name: str, modules: tuple[str, ...], wrap: Callable[[Any], Callable] | None = None) -> Callable[[], Callable]:
    def build():
        fn = C.lit_liger_attr(name, modules)
        return wrap(fn) if wrap else fn

    return build


LIGER_FUNCTIONAL = "liger_kernel.transformers.functional"


# ----------------------------------------------------------------------------------------------
# The ops. Each eager forward is LitGPT's own code for that op.
# ----------------------------------------------------------------------------------------------
def rmsnorm_case(N: int, H: int, eps: float = 1e-5) -> Case:
    from litgpt.model import RMSNorm

    module = RMSNorm(H, eps=eps).to(device=C.device(), dtype=DTYPE)

    def make_inputs() -> Inputs:
        with torch.no_grad():
            module.weight.copy_(_randn(H, scale=0.1, offset=1.0))
        return Inputs([_randn(N, H, grad=True), module.weight], (0, 1), (_randn(N, H),))

    def eager(x, w):  # litgpt.model.RMSNorm (its weight is w)
        return module(x)

    variants = [
        Variant("litgpt eager", "eager", lambda: eager),
        Variant("torch.compile", "compile", _compiled(eager)),
        # liger's defaults as its Llama patch uses them: casting_mode="llama", in_place=True
        Variant("liger-kernel", "liger",
                _liger(LIGER_FUNCTIONAL, "liger_rms_norm", wrap=lambda f: lambda x, w: f(x, w, eps))),
        Variant("lit-liger", "lit_liger", _lit("rms_norm", ("rms_norm",), wrap=lambda f: lambda x, w: f(x, w, eps))),
    ]
    e = DTYPE.itemsize
    # fwd reads x, writes y; bwd reads dy and x, writes dx (weight and dweight are negligible)
    return Case(f"rmsnorm_N{N}_H{H}", "rmsnorm", {"N": N, "H": H}, make_inputs, variants, min_bytes=5 * N * H * e)


def rope_case(B: int, T: int, n_head: int, n_kv: int, hs: int) -> Case:
    """q and k are made from one qkv tensor by ``split`` + ``view`` + ``transpose`` inside every
    variant's forward, exactly as LitGPT's CausalSelfAttention makes them, and the gradient lands in
    ``qkv.grad`` through those views (as in the model: the split's backward concatenates dq, dk and
    dv into the qkv gradient, and how cheap that is depends on the layout each variant gives dq/dk).
    cos/sin come from ``build_rope_cache`` (fp32, as in LitGPT). torch.compile compiles the split too."""
    from litgpt.model import apply_rope, build_rope_cache

    def make_inputs() -> Inputs:
        qkv = _randn(B, T, (n_head + 2 * n_kv) * hs, grad=True)  # (B, T, (nh_q + 2 nh_kv) * hs)
        cos, sin = build_rope_cache(T, hs, device=C.device())
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)  # (1, T, hs)
        grads = (_randn(B, n_head, T, hs), _randn(B, n_kv, T, hs))
        return Inputs([qkv, cos, sin], (0,), grads)

    def split(qkv):  # CausalSelfAttention.forward
        q, k, _ = qkv.split((n_head * hs, n_kv * hs, n_kv * hs), dim=-1)
        q = q.view(B, T, n_head, hs).transpose(1, 2)  # (B, nh_q, T, hs), strided
        k = k.view(B, T, n_kv, hs).transpose(1, 2)  # (B, nh_kv, T, hs)
        return q, k

    def on_qkv(build):
        def forward_builder():
            fn = build()
            return lambda qkv, cos, sin: fn(*split(qkv), cos, sin)

        return forward_builder

    def eager(q, k, cos, sin):  # CausalSelfAttention.forward, rotate-half layout
        n = cos.size(-1)
        q_roped = apply_rope(q[..., :n], cos, sin)
        k_roped = apply_rope(k[..., :n], cos, sin)
        q = torch.cat((q_roped, q[..., n:]), dim=-1)  # (B, nh_q, T, hs)
        k = torch.cat((k_roped, k[..., n:]), dim=-1)  # (B, nh_kv, T, hs)
        return q, k

    def eager_qkv(qkv, cos, sin):
        return eager(*split(qkv), cos, sin)

    variants = [
        Variant("litgpt eager", "eager", lambda: eager_qkv),
        Variant("torch.compile", "compile", _compiled(eager_qkv)),
        Variant("liger-kernel", "liger", on_qkv(_liger("liger_kernel.transformers.rope", "liger_rotary_pos_emb"))),
        # what the swapped attention runs: rope_qkv, whose backward writes the qkv gradient itself
        Variant("lit-liger", "lit_liger", _lit("rope_qkv", ("rope",), wrap=lambda fn: lambda qkv, cos, sin: fn(
            qkv, cos, sin, n_head, n_kv)[:2])),
        Variant("lit-liger rope(q, k)", "lit_liger_qk", on_qkv(_lit("rope", ("rope",)))),
    ]
    e = DTYPE.itemsize
    qk = B * T * (n_head + n_kv) * hs
    # fwd reads q, k and writes q', k'; bwd reads dq', dk' and writes dq, dk; cos+sin read once per pass
    min_bytes = 4 * qk * e + 2 * 2 * T * hs * 4
    shape = {"B": B, "T": T, "n_head": n_head, "n_kv": n_kv, "hs": hs}
    return Case(f"rope_N{B * T}_H{n_head * hs}_hs{hs}", "rope", shape, make_inputs, variants, min_bytes=min_bytes)


def glu_case(op: str, N: int, inter: int, key: str) -> Case:
    """SwiGLU (LLaMAMLP: ``silu(fc_1) * fc_2``) or GeGLU (GemmaMLP: ``gelu(fc_1, "tanh") * fc_2``)."""

    def make_inputs() -> Inputs:
        return Inputs([_randn(N, inter, grad=True), _randn(N, inter, grad=True)], (0, 1), (_randn(N, inter),))

    if op == "swiglu":

        def eager(a, b):
            return F.silu(a) * b

        liger = _liger(LIGER_FUNCTIONAL, "liger_swiglu")
        lit = _lit("swiglu", ("swiglu",))
    else:

        def eager(a, b):
            return F.gelu(a, approximate="tanh") * b

        liger = _liger(LIGER_FUNCTIONAL, "liger_geglu")  # tanh approximation, as Gemma uses
        lit = _lit("geglu", ("geglu", "swiglu"), wrap=lambda f: lambda a, b: f(a, b, approximate="tanh"))

    variants = [
        Variant("litgpt eager", "eager", lambda: eager),
        Variant("torch.compile", "compile", _compiled(eager)),
        Variant("liger-kernel", "liger", liger),
        Variant("lit-liger", "lit_liger", lit),
    ]
    # fwd reads a, b, writes c; bwd reads dc, a, b, writes da, db
    return Case(key, op, {"N": N, "I": inter}, make_inputs, variants, min_bytes=8 * N * inter * DTYPE.itemsize)


def layernorm_case(N: int, H: int, eps: float = 1e-5) -> Case:
    def make_inputs() -> Inputs:
        args = [_randn(N, H, grad=True), _randn(H, scale=0.1, offset=1.0, grad=True), _randn(H, scale=0.1, grad=True)]
        return Inputs(args, (0, 1, 2), (_randn(N, H),))

    def eager(x, w, b):  # torch.nn.LayerNorm, LitGPT's norm_class for "LayerNorm"
        return F.layer_norm(x, (H,), w, b, eps)

    variants = [
        Variant("litgpt eager", "eager", lambda: eager),
        Variant("torch.compile", "compile", _compiled(eager)),
        Variant("liger-kernel", "liger",
                _liger(LIGER_FUNCTIONAL, "liger_layer_norm", wrap=lambda f: lambda x, w, b: f(x, w, b, eps))),
        Variant("lit-liger", "lit_liger",
                _lit("layer_norm", ("layer_norm",), wrap=lambda f: lambda x, w, b: f(x, w, b, eps))),
    ]
    return Case(f"layernorm_N{N}_H{H}", "layernorm", {"N": N, "H": H}, make_inputs, variants,
                min_bytes=5 * N * H * DTYPE.itemsize)


def flce_case(B: int, T: int, H: int, V: int) -> Case:
    """lm_head + cross-entropy: x (N, H), weight (V, H), N = B*T random targets."""
    from litgpt.utils import chunked_cross_entropy

    N = B * T

    def make_inputs() -> Inputs:
        x = _randn(N, H, grad=True)
        w = _randn(V, H, scale=0.02, grad=True)  # litgpt's init std
        target = torch.randint(0, V, (N,), device=C.device())
        return Inputs([x, w, target], (0, 1), None)

    def eager(x, w, target):  # the "eager": F.linear + F.cross_entropy on fp32 logits
        return F.cross_entropy(F.linear(x, w).float(), target)

    def litgpt_chunked(x, w, target):  # model(x, lm_head_chunk_size=128) + chunked_cross_entropy (finetune)
        logits = [F.linear(x_i, w) for x_i in x.view(B, T, H).split(128, dim=1)]  # T/128 x (B, 128, V)
        return chunked_cross_entropy(logits, target.view(B, T), chunk_size=128)

    def lit(mode: str) -> Callable[[], Callable]:
        return _lit("fused_linear_cross_entropy", ("fused_linear_cross_entropy",),
                    wrap=lambda f: lambda x, w, target: f(x, w, target, mode=mode))

    variants = [
        Variant("litgpt eager", "eager_fp32logits", lambda: eager),
        Variant("litgpt chunked", "litgpt_chunked", lambda: litgpt_chunked),
        Variant("torch.compile", "compile", _compiled(eager)),
        Variant("liger-kernel", "liger", _liger(LIGER_FUNCTIONAL, "liger_fused_linear_cross_entropy")),
        Variant("lit-liger fast", "lit_liger_fast", lit("fast")),
        Variant("lit-liger lean", "lit_liger_lean", lit("lean")),
        # frozen lm_head (LoRA): no weight gradient, so one GEMM fewer
        Variant("litgpt chunked frozenW", "litgpt_chunked_frozenW", lambda: litgpt_chunked, frozen=(1,)),
        Variant("lit-liger fast frozenW", "lit_liger_fast_frozenW", lit("fast"), frozen=(1,)),
        Variant("lit-liger lean frozenW", "lit_liger_lean_frozenW", lit("lean"), frozen=(1,)),
    ]
    shape = {"B": B, "T": T, "N": N, "H": H, "V": V}
    return Case(f"flce_N{N}_H{H}_V{V}", "flce", shape, make_inputs, variants,
                flops=6 * N * H * V, flops_frozen=4 * N * H * V)


def build_cases(ops: list[str], *, smoke: bool, quick: bool) -> list[Case]:
    """DESIGN.md shapes; ``--quick``: the issues' headline shape per op; ``--smoke``: tiny odd shapes."""
    if smoke:
        table = {
            "rmsnorm": [lambda: rmsnorm_case(64, 96)],
            "rope": [lambda: rope_case(2, 8, 4, 2, 16)],
            "swiglu": [lambda: glu_case("swiglu", 64, 96, "swiglu_N64_I96")],
            "geglu": [lambda: glu_case("geglu", 64, 96, "geglu_N64_I96")],
            "layernorm": [lambda: layernorm_case(64, 96)],
            "flce": [lambda: flce_case(2, 24, 32, 200)],
        }
    else:
        table = {
            "rmsnorm": [lambda: rmsnorm_case(16384, 2048), lambda: rmsnorm_case(16384, 4096)],
            "rope": [lambda: rope_case(4, 4096, 32, 8, 64), lambda: rope_case(4, 4096, 32, 8, 128)],
            "swiglu": [lambda: glu_case("swiglu", 16384, 8192, "swiglu_N16384_H2048_I8192"),
                       lambda: glu_case("swiglu", 16384, 14336, "swiglu_N16384_H4096_I14336")],
            "geglu": [lambda: glu_case("geglu", 16384, 14336, "geglu_N16384_I14336")],
            "layernorm": [lambda: layernorm_case(16384, 4096)],
            "flce": [lambda: flce_case(4, 2048, 2048, 128256), lambda: flce_case(4, 4096, 4096, 128256)],
        }
        if quick:  # the targets' headline shapes
            pick = {"rmsnorm": 1, "rope": 1, "swiglu": 1, "geglu": 0, "layernorm": 0, "flce": 0}
            table = {op: [fns[pick[op]]] for op, fns in table.items()}
    return [make() for op in ops for make in table[op]]


# ----------------------------------------------------------------------------------------------
# Running one variant
# ----------------------------------------------------------------------------------------------
def _tolerance(dtype: torch.dtype) -> float:
    # a spot check, looser than the unit tests' 1e-2: it flags wrong kernels, not rounding
    return 1e-4 if dtype == torch.float32 else 3e-2


def fresh_inputs(case: Case) -> Inputs:
    """The case's inputs, identical every call (seeded)."""
    torch.manual_seed(0)
    return case.make_inputs()


def restore_inputs(inputs: Inputs, case: Case) -> None:
    """Put the pristine values back into ``inputs`` (same tensors, same addresses, no net allocation).

    Needed because some kernels write into their inputs: liger-kernel's SwiGLU/GeGLU backward writes
    da, db over a, b; its RMSNorm backward (in_place=True) writes dx over dy. After the warm-up
    call those tensors no longer hold the values the reference saw."""
    pristine = fresh_inputs(case)
    with torch.no_grad():
        for dst, src in zip(inputs.args, pristine.args):
            if isinstance(dst, torch.Tensor) and dst.is_floating_point() and dst is not src:
                dst.copy_(src)
        for dst, src in zip(inputs.grad_outputs or (), pristine.grad_outputs or ()):
            dst.copy_(src)
    del pristine


def run_variant(case: Case, variant: Variant, ref: dict | None, ceilings: dict, opts) -> tuple[dict, dict | None]:
    """Returns the result row and, if this run succeeded, its outputs/grads (to serve as reference).

    Every variant gets its own fresh inputs (a kernel that writes into its inputs cannot affect the
    next variant)."""
    row: dict[str, Any] = {"case": case.key, "op": case.op, "shape": case.shape, "variant": variant.name,
                           "key": f"{case.key}_{variant.key}", "status": "ok"}
    floor_ms, unit, work = case.floor(variant, ceilings)
    row.update(floor_ms=floor_ms, rate_unit=unit)
    try:
        fwd = variant.build()
    except C.Unavailable as exc:
        row["status"] = str(exc)
        return row, None
    except Exception as exc:  # noqa: BLE001
        row["status"] = C.failure_status(exc)
        return row, None

    inputs = args = leaves = outs = grads = produced = None
    try:
        inputs = fresh_inputs(case)
        args = [a.detach() if i in variant.frozen else a for i, a in enumerate(inputs.args)]
        grad_idx = [i for i in inputs.grad_idx if i not in variant.frozen]
        leaves = [args[i] for i in grad_idx]
        grad_outputs = inputs.grad_outputs

        def clear_grads() -> None:
            for t in leaves:
                t.grad = None

        def fwd_bwd():
            out = fwd(*args)
            outs = out if isinstance(out, tuple) else (out,)
            torch.autograd.backward(outs, grad_outputs)
            return outs

        def timed():
            clear_grads()
            fwd_bwd()

        C.reset_compile()
        outs = fwd_bwd()  # warm-up (compiles); keeps the grads: DESIGN.md's "run once"
        outs = None
        C.sync()
        restore_inputs(inputs, case)  # the measured run below starts from the reference's values
        if C.CUDA:
            base = torch.cuda.memory_allocated()  # inputs + grad_outputs + the grads (+ the reference kept)
            clear_grads()
            torch.cuda.reset_peak_memory_stats()
            outs = fwd_bwd()
            C.sync()
            row["peak_extra_MiB"] = (torch.cuda.max_memory_allocated() - base) / C.MiB
        else:
            clear_grads()
            outs = fwd_bwd()
        # clone: a kernel may later overwrite what it returned (in-place backward into its inputs)
        grads = {i: args[i].grad.detach().clone() for i in grad_idx}
        outs = tuple(o.detach().clone() for o in outs)
        if ref is None:
            row["err_out"] = row["err_grad"] = 0.0
            row["check"] = "ref"
        else:
            row["err_out"] = max(C.rel_err(o, r) for o, r in zip(outs, ref["outs"]))
            row["err_grad"] = max((C.rel_err(g, ref["grads"][i]) for i, g in grads.items() if i in ref["grads"]),
                                  default=None)
            worst = max(e for e in (row["err_out"], row["err_grad"]) if e is not None)
            row["check"] = "ok" if worst <= _tolerance(DTYPE) else "MISMATCH"
        produced = {"outs": outs, "grads": grads, "variant": variant.name} if ref is None else None
        outs = grads = None
        row["ms"] = C.time_ms(timed, quick=opts.quick, smoke=opts.smoke)
        row["ms_again"] = C.time_ms(timed, quick=opts.quick, smoke=opts.smoke)
        row["spread_pct"] = 100 * abs(row["ms"] - row["ms_again"]) / min(row["ms"], row["ms_again"])
        best = min(row["ms"], row["ms_again"])
        if floor_ms:
            row["x_floor"] = best / floor_ms
        if C.CUDA:
            row["gpu_ms"] = C.gpu_kernel_ms(timed)
            if floor_ms:
                row["gpu_x_floor"] = row["gpu_ms"] / floor_ms
        row["rate"] = work / (best * 1e-3) / (1e12 if unit == "TFLOP/s" else 1e9)
    except Exception as exc:  # noqa: BLE001 - OOM or a broken variant: record and carry on
        row["status"] = C.failure_status(exc)
        produced = None
    inputs = args = leaves = outs = grads = fwd = None  # outside the except: its traceback is gone
    C.free_memory()
    return row, produced


def run_case(case: Case, ceilings: dict, opts, emit: Callable[[dict], None]) -> None:
    ref = None
    for variant in case.variants:
        if opts.variants and not any(s in variant.name for s in opts.variants):
            continue
        row, produced = run_variant(case, variant, ref, ceilings, opts)
        if ref is None and produced is not None:
            ref = produced  # the first variant that ran (LitGPT eager unless it failed)
        if ref is not None and row["status"] == "ok":
            row["ref"] = ref["variant"]
        emit(row)
    ref = None
    C.free_memory()


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
COLUMNS = ["case", "variant", "ms", "ms again", "GPU ms", "floor ms", "x floor", "GPU x floor", "GB/s|TFLOP/s", "extra MiB",
           "err out", "err grad", "check", "anchor ms", "status"]


def _table_rows(result: dict) -> list[list[Any]]:
    out = []
    for r in result["rows"]:
        out.append([r["case"], r["variant"], r.get("ms"), r.get("ms_again"), r.get("gpu_ms"), r.get("floor_ms"),
                    r.get("x_floor"), r.get("gpu_x_floor"),
                    r.get("rate"), r.get("peak_extra_MiB"), r.get("err_out"), r.get("err_grad"), r.get("check"),
                    r.get("anchor_ms"), r["status"]])
    return out


def render(result: dict, out_dir: Path) -> list[Path]:
    """kernels.md and the PNG charts from a result dict (also used by ``python -m benchmarks plot``)."""
    written = []
    env, ceil = result["environment"], result["ceilings"]
    md = [
        f"# Kernel benchmark: {env['device']}, {env['date']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, liger-kernel {env['liger_kernel']}, "
        f"lit-liger {env['lit_liger']} ({env.get('lit_liger_commit')}), dtype {result['dtype']}"
        + (" — SMOKE RUN (tiny shapes, not a measurement)" if result.get("smoke") else ""),
        "",
        f"Ceilings measured in this run: copy {C.fmt(ceil.get('copy_GBps'))} GB/s; bf16 matmul "
        f"{C.fmt(ceil.get('bf16_mm_TFLOPs'))} TFLOP/s (8192³), {C.fmt(ceil.get('bf16_mm_flce_TFLOPs'))} TFLOP/s "
        f"(lm_head shape {ceil.get('flce_gemm_shape')}); FLCE floors use {C.fmt(ceil.get('floor_TFLOPs'))} TFLOP/s.",
        "",
        "fwd+bwd, median ms of `triton.testing.do_bench` (timed twice; it includes the host's launch overhead, "
        "which dominates the small memory-bound ops for every eager-launched variant); `GPU ms` = the sum of the "
        "GPU kernel times of one fwd+bwd (torch.profiler, mean of 10 calls: what the op costs inside a "
        "training step whose host runs ahead); `x floor` = best time / floor; "
        "`extra MiB` = peak during fwd+bwd minus inputs and grads; `err` = relative error vs the `ref` variant.",
        "",
        C.markdown_table(COLUMNS, _table_rows(result)),
        "",
    ]
    path = out_dir / "kernels.md"
    path.write_text("\n".join(md))
    written.append(path)

    times, mems, floors = {}, {}, {}
    for r in result["rows"]:
        if r["status"] != "ok":
            continue
        best = min(r["ms"], r["ms_again"])
        times.setdefault(r["case"], {})[r["variant"]] = best
        if r.get("peak_extra_MiB") is not None:
            mems.setdefault(r["case"], {})[r["variant"]] = r["peak_extra_MiB"]
        if r.get("floor_ms") and "frozenW" not in r["variant"]:
            floors[r["case"]] = r["floor_ms"]
    title = f"{env['device']} — fwd+bwd {result['dtype']}"
    if C.bar_charts(out_dir / "kernels_time.png", times, title=title + " time (lower is better)", ylabel="ms",
                    hlines=floors):
        written.append(out_dir / "kernels_time.png")
    if C.bar_charts(out_dir / "kernels_memory.png", mems, title=title + " extra memory", ylabel="MiB"):
        written.append(out_dir / "kernels_memory.png")
    return written


def measure_ceilings(opts) -> dict[str, Any]:
    smoke, quick = opts.smoke, opts.quick
    ceil: dict[str, Any] = {"copy_GBps": C.copy_bandwidth_GBps(smoke=smoke, quick=quick)}
    big = 256 if smoke else 8192
    ceil["bf16_mm_TFLOPs"] = C.matmul_TFLOPs(big, big, big, smoke=smoke, quick=quick)
    m, v, h = (48, 200, 32) if smoke else (8192, 128256, 2048)
    ceil["flce_gemm_shape"] = f"({m}, {h}) x ({v}, {h})^T"
    ceil["bf16_mm_flce_TFLOPs"] = C.matmul_TFLOPs(m, v, h, smoke=smoke, quick=quick)
    # the floor is the best GEMM rate this GPU showed: the most demanding floor
    ceil["floor_TFLOPs"] = max(ceil["bf16_mm_TFLOPs"], ceil["bf16_mm_flce_TFLOPs"])
    return ceil


def anchor_ops(rows: list[dict]) -> dict[str, dict]:
    """The anchor file's ``ops`` shape: key -> ms, ms_again, peak_extra_MiB, GBps_vs_min_bytes|TFLOPs."""
    ops = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        entry = {"ms": r["ms"], "ms_again": r["ms_again"], "peak_extra_MiB": r.get("peak_extra_MiB")}
        entry["TFLOPs" if r["rate_unit"] == "TFLOP/s" else "GBps_vs_min_bytes"] = r.get("rate")
        ops[r["key"]] = entry
    return ops


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{C.PROG} kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/<device>-<date>/)")
    p.add_argument("--quick", action="store_true", help="one headline shape per op, shorter timing windows")
    p.add_argument("--smoke", action="store_true", help="tiny shapes; on CPU runs Triton's interpreter (harness test)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--variants", default="", help="comma-separated substrings: only variants whose name contains one")
    p.add_argument("--anchor", default=None,
                   help="reference JSON to quote (default: newest ../shared/anchors/*.json; 'none' to skip)")
    return p


def main(argv: list[str] | None = None) -> dict:
    opts = build_parser().parse_args(argv)
    ops = [o.strip() for o in opts.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise SystemExit(f"unknown op(s) {unknown}; choose from {list(OPS)}")
    opts.variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    out_dir = opts.out or C.default_out_dir(opts.smoke)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_float32_matmul_precision("high")
    anchor, anchor_path = C.load_anchor(opts.anchor)
    anchor_ops_ref = (anchor or {}).get("ops", {})

    env = C.environment()
    print(f"# lit-liger kernel benchmark on {env['device']} (torch {env['torch']}, triton {env['triton']}, "
          f"liger-kernel {env['liger_kernel']}) -> {out_dir}", flush=True)
    ceilings = measure_ceilings(opts)
    print(f"# ceilings: copy {C.fmt(ceilings['copy_GBps'])} GB/s, bf16 matmul {C.fmt(ceilings['bf16_mm_TFLOPs'])} "
          f"TFLOP/s (8192^3), {C.fmt(ceilings['bf16_mm_flce_TFLOPs'])} TFLOP/s (lm_head shape)", flush=True)
    result = {
        "kind": "kernels", "environment": env, "dtype": str(DTYPE).replace("torch.", ""), "smoke": opts.smoke,
        "quick": opts.quick, "anchor": anchor_path, "ceilings": ceilings, "rows": [], "ops": {},
        # the anchor file's top-level names, for side-by-side reading
        "device": env["device"], "torch": env["torch"], "triton": env["triton"],
        "copy_GBps": ceilings["copy_GBps"], "bf16_mm_TFLOPs": ceilings["bf16_mm_TFLOPs"],
    }
    json_path = out_dir / "kernels.json"
    print("  ".join(COLUMNS), flush=True)

    def emit(row: dict) -> None:
        ref = anchor_ops_ref.get(row["key"])
        if ref:
            row["anchor_ms"] = ref.get("ms")
            row["anchor_peak_extra_MiB"] = ref.get("peak_extra_MiB")
        result["rows"].append(row)
        result["ops"] = anchor_ops(result["rows"])
        C.write_json(json_path, result)  # after every row: a run cut short still leaves its numbers
        print("  ".join(C.fmt(v) for v in _table_rows({"rows": [row]})[0]), flush=True)

    for op in ops:
        for case in build_cases([op], smoke=opts.smoke, quick=opts.quick):
            run_case(case, ceilings, opts, emit)

    print()
    print(C.text_table(COLUMNS, _table_rows(result)))
    written = [json_path] + render(result, out_dir)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
