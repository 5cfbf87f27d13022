"""Every Triton kernel compiles for real GPUs, checked on a CPU-only machine.

The interpreter (how CI runs the kernels) executes kernel bodies as plain Python, so code that Triton's
GPU compiler rejects (a Python construct it cannot lower, a non-power-of-two ``tl.arange``, a type
mismatch between branches, too much shared memory) would pass every CPU test. Here every op runs once
under the interpreter in fp32, bf16 and fp16 with every constexpr path while each launch is recorded
(kernel, argument types and their GPU specialization, constexpr values, ``num_warps``); then a child
process without the interpreter compiles each distinct launch ahead of time with Triton's own
compiler, through PTX to a cubin for NVIDIA sm_90 (H100/H200), and the bf16 launches also for sm_80
(A100) and to an hsaco for AMD gfx942 (MI300) when Triton has that backend. Nothing is launched: no GPU is needed, only Triton's bundled ``ptxas``.
"""

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

from lit_liger.kernels import _launch

HERE = os.path.dirname(__file__)

# (backend, arch, warp size, which launches): every launch for the H100/H200 the project measures on;
# the bf16 ones (training's dtype) for the A100 and, where Triton has the AMD backend, the MI300.
TARGETS = [("cuda", 90, 32, "all"), ("cuda", 80, 32, "bf16"), ("hip", "gfx942", 64, "bf16")]

_COMPILE = r"""
import json, sys
import triton
from importlib import import_module
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

specs, targets = json.load(sys.stdin)
results = []
for backend, arch, warp, which in targets:
    if {"cuda": "nvidia", "hip": "amd"}[backend] not in backends:
        results.append({"target": f"{backend}:{arch}", "skipped": f"Triton has no {backend} backend here"})
        continue
    target = GPUTarget(backend, arch, warp)
    for spec in specs:
        if which == "bf16" and not any(t.endswith("bf16") for t in spec["signature"].values()):
            continue
        fn = getattr(import_module(spec["module"]), spec["name"])
        attrs = {(i,): [["tt.divisibility", 16]] for i in spec["aligned"]}
        src = ASTSource(fn, spec["signature"], constexprs=spec["constexprs"], attrs=attrs)
        opts = {"num_warps": spec["num_warps"], "num_stages": spec["num_stages"]}
        try:
            kernel = triton.compile(src, target=target, options=opts)
            shared = kernel.metadata.shared
            results.append({"target": f"{backend}:{arch}", "kernel": spec["name"], "shared": shared})
        except Exception as e:  # reported with the launch that failed
            results.append({"target": f"{backend}:{arch}", "kernel": spec["name"], "spec": spec,
                            "error": f"{type(e).__name__}: {str(e)[-1500:]}"})
json.dump(results, sys.stdout)
"""


def _record_launches(monkeypatch, exercise=None, limits=None) -> list[dict]:
    """Each distinct launch of ``exercise()`` (default: every op but the attention, on an H100's plans) under the
    interpreter, with ``_launch``'s device limits for CPU tensors set to ``limits`` (the plans of that device)."""
    import triton.runtime.interpreter as interp
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    specs = {}
    orig = interp.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = inspect.signature(fn).parameters
        bound = dict(zip(params, args))
        bound.update({k: v for k, v in kwargs.items() if k in params})
        signature, constexprs, aligned = {}, {}, []
        for i, (name, p) in enumerate(params.items()):
            value = bound.get(name, p.default)
            # specialized as Triton's launcher does on a GPU: ints equal to 1 become constants, pointers
            # and ints that are multiples of 16 get the divisibility attribute (wider vector accesses)
            typ, key = ("constexpr", value) if "constexpr" in str(p.annotation) else native_specialize_impl(
                BaseBackend, value, False, True, True)
            signature[name] = typ
            if typ == "constexpr":
                constexprs[name] = value
            elif key and "D" in key:
                aligned.append(i)
        spec = {"module": fn.__module__, "name": fn.__name__, "signature": signature, "constexprs": constexprs,
                "aligned": aligned, "num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3)}
        specs[json.dumps(spec, sort_keys=True)] = spec
        kwargs.pop("num_warps", None)
        kwargs.pop("num_stages", None)
        return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(interp.InterpretedFunction, "run", run)
    from helpers import exercise_kernels

    monkeypatch.setattr(_launch, "_CPU_LIMITS",
                        limits or _launch.DeviceLimits("H100 (plan only)", 32, 1024, 132, (9, 0), False))
    if exercise is not None:
        exercise()
        return list(specs.values())
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        exercise_kernels(2048, dtype, variants=True)
    exercise_kernels(96, torch.bfloat16)  # smaller blocks and warps
    return list(specs.values())


def _compile(specs, targets) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = env.get("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps([specs, targets]), env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_kernel_compiles_for_gpus(monkeypatch):
    if not _launch.interpret_mode():
        pytest.skip("records launches through Triton's interpreter")
    specs = _record_launches(monkeypatch)
    names = {s["name"] for s in specs}
    kernel_names = {
        name for mod in ("rms_norm", "layer_norm", "rope", "swiglu", "fused_linear_cross_entropy")
        for name, obj in vars(__import__(f"lit_liger.kernels.{mod}", fromlist=["_"])).items()
        if name.endswith("_kernel") and hasattr(obj, "fn")
    }
    assert kernel_names and names == kernel_names, kernel_names - names  # every kernel was launched
    results = _compile(specs, TARGETS)
    failures = [r for r in results if "error" in r]
    assert not failures, json.dumps(failures[:3], indent=1)
    compiled = [r for r in results if "kernel" in r]
    assert {r["target"] for r in compiled} >= {"cuda:90", "cuda:80"}
    assert sum(r["target"] == "cuda:90" for r in compiled) == len(specs)
    # shared memory of every launch fits the smallest of these devices (A100: 163 KB per block)
    worst = max(compiled, key=lambda r: r["shared"])
    assert worst["shared"] <= 163 * 1024, worst


# (device limits the plans are chosen for, its compile target, shared memory per block it allows)
ATTENTION_DEVICES = [
    (_launch.DeviceLimits("H100 (plan only)", 32, 1024, 132, (9, 0), False), ("cuda", 90, 32, "all"), 227 * 1024),
    (_launch.DeviceLimits("A100 (plan only)", 32, 1024, 108, (8, 0), False), ("cuda", 80, 32, "all"), 163 * 1024),
    (_launch.DeviceLimits("MI300 (plan only)", 64, 1024, 304, (9, 4), True), ("hip", "gfx942", 64, "all"), 64 * 1024),
]


def _exercise_attention():
    """Every plan: a short sequence's (these 40 tokens) and the long sequences' (``T`` 0: set as the override)."""
    from lit_liger.kernels.attention import softcap_attention

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for hs, cap in ((256, 50.0), (128, None), (64, 30.0)):
            for long in (False, True):
                q = torch.randn(1, 2, 40, hs, dtype=dtype).requires_grad_()
                k, v = (torch.randn(1, 1, 40, hs, dtype=dtype).requires_grad_() for _ in range(2))
                if long:
                    _launch.ATTENTION_PLAN_OVERRIDE[0] = _launch.attention_plan(hs, dtype, q.device)
                try:
                    softcap_attention(q, k, v, hs ** -0.5, cap).sum().backward()
                finally:
                    _launch.ATTENTION_PLAN_OVERRIDE[0] = None


@pytest.mark.parametrize("limits, target, smem", ATTENTION_DEVICES, ids=["sm90", "sm80", "gfx942"])
def test_attention_kernels_compile_within_each_devices_shared_memory(monkeypatch, limits, target, smem):
    """The softcap attention's plans (``_launch.attention_plan``) hold whole tiles of q, k, v and dO in shared memory,
    so each device gets its own: every launch (3 dtypes, head sizes 256 / 128 / 64, with and without the softcap)
    compiles for that device and fits its shared memory (the H100's measured plans would not fit an A100's)."""
    if not _launch.interpret_mode():
        pytest.skip("records launches through Triton's interpreter")
    from lit_liger.kernels import attention

    monkeypatch.setattr(attention, "_upcast", lambda t: False)  # the interpreter's bf16 workaround: not a GPU launch
    specs = _record_launches(monkeypatch, _exercise_attention, limits)
    assert {s["name"] for s in specs} == {"_attn_fwd_kernel", "_attn_delta_kernel", "_attn_dkdv_kernel",
                                          "_attn_dq_kernel"}
    results = _compile(specs, [target])
    if all("skipped" in r for r in results):
        pytest.skip(results[0]["skipped"])
    failures = [r for r in results if "error" in r]
    assert not failures, json.dumps(failures[:2], indent=1)
    assert len(results) == len(specs)
    worst = max(results, key=lambda r: r["shared"])
    assert worst["shared"] <= smem, worst


def test_attention_plan_takes_smaller_blocks_where_a_long_plan_leaves_sms_idle(monkeypatch):
    """At head size 256 on sm90 a short sequence (one packed fine-tuning row: fewer 128-row blocks over all heads
    than SMs) gets the short plan, a long one (or ``T`` not given) the long plan; other head sizes one plan."""
    monkeypatch.setattr(_launch, "_CPU_LIMITS", ATTENTION_DEVICES[0][0])  # an H100's 132 SMs, for CPU tensors
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    long = _launch.attention_plan(256, bf16, cpu)
    short = _launch.attention_plan(256, bf16, cpu, T=1024, heads=8)  # 8 heads x 8 blocks of 128 rows < 132
    assert long == _launch.attention_plan(256, bf16, cpu, T=2048, heads=32)  # 512 blocks: the long plan
    assert long == _launch.attention_plan(256, bf16, cpu, T=2048, heads=66)
    assert short == _launch.attention_plan(256, bf16, cpu, T=2048, heads=8)  # 128 blocks
    assert (short.fwd_m, short.kv_n, short.q_m) == (64, 32, 64) and (long.fwd_m, long.kv_n, long.q_m) == (128, 64, 128)
    assert _launch.attention_plan(128, bf16, cpu, T=512, heads=8) == _launch.attention_plan(128, bf16, cpu)


def _exercise_dropout():
    """Every kernel of ``kernels/dropout.py`` on each dtype: the mask inside the dropped input, its bits, the
    backward from either (with ``x`` or the GLU product as the source)."""
    from lit_liger.kernels import dropout as D

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(3, 2051, dtype=dtype)
        xd, mask = torch.native_dropout(x, 0.3, True)
        D.encode_dropped_(xd, mask)
        D.dropout_grad_add_(torch.randn_like(x), torch.randn_like(x), xd, 1 / 0.7)
        bits = D.pack_kept(mask)
        D.dropped_from_bits(bits, 1 / 0.7, x=x, dx=torch.randn_like(x), dxd=torch.randn_like(x))
        D.dropped_from_bits(bits, 1 / 0.7, glu=(x, torch.randn_like(x), "silu"), write_xd=True)


def test_dropout_kernels_compile_for_gpus(monkeypatch):
    """The LoRA dropout's kernels (its mask packed into bits among them) compile for every target and fit the
    A100's shared memory."""
    if not _launch.interpret_mode():
        pytest.skip("records launches through Triton's interpreter")
    from lit_liger.kernels import dropout as D

    specs = _record_launches(monkeypatch, _exercise_dropout)
    kernels = {name for name, obj in vars(D).items() if name.endswith("_kernel") and hasattr(obj, "fn")}
    assert kernels and {s["name"] for s in specs} == kernels, kernels
    results = _compile(specs, TARGETS)
    failures = [r for r in results if "error" in r]
    assert not failures, json.dumps(failures[:2], indent=1)
    compiled = [r for r in results if "kernel" in r]
    assert sum(r["target"] == "cuda:90" for r in compiled) == len(specs)
    assert max(r["shared"] for r in compiled) <= 163 * 1024
