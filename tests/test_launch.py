"""Launch plans come from kernels/_launch.py and respect each vendor's limits.

Device properties of an AMD Instinct-like GPU (warp 64), an H100-like and an older NVIDIA GPU
(sm_70, no bf16) are mocked; every op is run under the interpreter with those limits while the
launches are recorded, and each recorded ``num_warps * warp_size`` must fit the thread limit. Also
FastKernel (the direct launcher): its specialization key against Triton's own, its argument rules, and on a
GPU the same results as Triton's launch path.
"""

import sys

import pytest
import torch
import triton.runtime.interpreter as interp

from helpers import exercise_kernels

from lit_liger.kernels import _launch
from lit_liger.kernels._launch import DeviceLimits

AMD = DeviceLimits("AMD Instinct MI300X (mock)", 64, 1024, 304, (9, 4), True)
H100 = DeviceLimits("NVIDIA H100 (mock)", 32, 1024, 132, (9, 0), False)
V100 = DeviceLimits("Tesla V100 (mock)", 32, 1024, 80, (7, 0), False)


@pytest.fixture
def recorded(monkeypatch):
    if not _launch.interpret_mode():
        pytest.skip("records launches through Triton's interpreter")
    launches = []
    orig = interp.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        launches.append((self.fn.__name__, kwargs.get("num_warps", 4), grid, {k: v for k, v in kwargs.items() if k.isupper()}))
        kwargs.pop("num_warps", None)
        kwargs.pop("num_stages", None)
        return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(interp.InterpretedFunction, "run", run)
    return launches


@pytest.mark.parametrize("limits", [AMD, H100, V100], ids=lambda l: l.name.split()[0])
def test_every_launch_fits_the_device(limits, recorded, monkeypatch):
    monkeypatch.setattr(_launch, "_CPU_LIMITS", limits)
    for H in (96, 8192):
        exercise_kernels(H, variants=H == 96)
    names = {n for n, *_ in recorded}
    assert len(names) >= 11, names  # every kernel (forward, backward, each loss mode, qk-norm) was launched
    for name, warps, grid, consts in recorded:
        assert warps & (warps - 1) == 0, (name, warps)
        assert warps * limits.warp_size <= limits.max_threads_per_block, (name, warps, limits)


def test_plans_scale_with_warp_size():
    # row plan under mocked limits
    orig = _launch._CPU_LIMITS
    try:
        for lim in (AMD, H100):
            _launch._CPU_LIMITS = lim
            for n_cols in (64, 4096, 16384):
                p = _launch.row_plan(n_cols, 2, torch.device("cpu"))
                assert p.block >= n_cols and p.num_warps * lim.warp_size <= lim.max_threads_per_block
                e = _launch.elementwise_plan(n_cols * 1000, torch.device("cpu"))
                assert e.num_warps * lim.warp_size <= lim.max_threads_per_block
                assert e.grid[0] * e.block >= n_cols * 1000
    finally:
        _launch._CPU_LIMITS = orig


def test_limits_read_from_device_properties(monkeypatch):
    class Props:  # what torch.cuda.get_device_properties returns on an MI300X (no max_threads_per_block attr)
        name = "AMD Instinct MI300X"
        warp_size = 64
        multi_processor_count = 304
        major, minor = 9, 4

    lim = _launch._limits_from_props(Props(), is_hip=True)
    assert lim.warp_size == 64 and lim.max_warps == 16 and lim.supports_bf16

    class OldProps:
        name = "Tesla V100"
        multi_processor_count = 80
        major, minor = 7, 0

    lim = _launch._limits_from_props(OldProps(), is_hip=False)
    assert lim.warp_size == 32 and lim.max_threads_per_block == 1024 and not lim.supports_bf16


def test_bf16_on_old_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_launch, "device_limits", lambda device=None: V100)
    with pytest.raises(TypeError, match="compute capability"):
        _launch.check_dtype_supported(torch.bfloat16, torch.device("cuda", 0))
    _launch.check_dtype_supported(torch.float16, torch.device("cuda", 0))  # fp16 is fine there
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        _launch.check_dtype_supported(torch.float64, torch.device("cpu"))


def test_host_integer_helpers_match_triton():
    """The plain-Python cdiv / next_pow2 the launch code uses instead of Triton's (jit-wrapped) ones."""
    import triton

    for n in [1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 2048, 2049, 8192, 128256, 10**9 + 7]:
        assert _launch.next_pow2(n) == triton.next_power_of_2(n), n
        for d in [1, 2, 3, 64, 128, 1000]:
            assert _launch.cdiv(n, d) == triton.cdiv(n, d), (n, d)
    assert _launch.next_pow2(0) == 1 and _launch.cdiv(0, 7) == 0


def test_plans_are_memoized_per_device_limits():
    """A plan is computed once per (shape, device limits) and is the same object afterwards; a device with
    other limits gets its own plan."""
    cpu = torch.device("cpu")
    assert _launch.row_plan(2048, 2, cpu) is _launch.row_plan(2048, 2, cpu)
    assert _launch.elementwise_plan(4096, cpu) is _launch.elementwise_plan(4096, cpu)
    # 2048 bf16 columns, 16 per thread: 128 threads = 2 warps of 64 on AMD, 4 warps of 32 on the H100
    assert _launch._row_plan(2048, 2, AMD).num_warps == 2 and _launch._row_plan(2048, 2, H100).num_warps == 4


# ------------------------------------------------------------------------------------------------
# FastKernel: repeat launches skip Triton's dispatch (the launch itself needs a GPU: see the gpu test)
# ------------------------------------------------------------------------------------------------
def test_fast_launch_key_separates_everything_triton_specializes():
    """Two arguments with the same lit-liger spec must get the same Triton specialization, or a repeat launch
    could reach a kernel compiled for other arguments (a 16-byte-aligned pointer for an unaligned one...)."""
    specialize = pytest.importorskip("triton._C.libtriton").native_specialize_impl
    from triton.backends.compiler import BaseBackend

    base = torch.zeros(64, dtype=torch.float32)
    args = [1, 2, 15, 16, 17, 32, -16, -5, 0, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**40, 2**63, 2**63 + 16,
            0.5, 1.0, True, False, None, base, base[1:], base[4:], base[8:], base.to(torch.bfloat16),
            base.to(torch.bfloat16)[1:], base.to(torch.bfloat16)[8:], base.to(torch.int64)]
    triton_spec = [specialize(BaseBackend, a, False, True, True) for a in args]
    ours = [_launch._arg_spec(a) for a in args]
    for i in range(len(args)):
        for j in range(len(args)):
            if ours[i] == ours[j]:
                assert triton_spec[i] == triton_spec[j], (args[i], args[j])
    # and it does separate what matters: alignment, dtype, divisibility, width, 1
    assert _launch._arg_spec(base) != _launch._arg_spec(base[1:])
    assert _launch._arg_spec(base) != _launch._arg_spec(base.to(torch.bfloat16))
    assert len({_launch._arg_spec(a) for a in (1, 2, 16, 2**31, 2**63)}) == 5
    with pytest.raises(_launch._Unsupported):
        _launch._arg_spec("a string")


def _toy(X, n, eps, BLOCK: "tl.constexpr", FLAG: "tl.constexpr" = True):  # noqa: F821 - annotations only
    pass


def test_fast_launch_entry_keeps_constexprs_in_signature_order():
    from triton.runtime.jit import JITFunction

    fk = _launch.FastKernel(JITFunction(_toy))

    class Compiled:
        run, function, packed_metadata = "launcher", 7, ("meta",)

    # constexprs follow the positional runtime arguments in the signature's order; a default fills FLAG
    assert fk._entry(Compiled(), 3, {"BLOCK": 128, "num_warps": 4}) == ("launcher", 7, ("meta",), (128, True))
    assert fk._entry(Compiled(), 3, {"FLAG": False, "BLOCK": 64}) == ("launcher", 7, ("meta",), (64, False))
    # anything the direct path cannot repeat stays on Triton's path
    assert fk._entry(Compiled(), 2, {"eps": 1e-5, "BLOCK": 64}) is False  # a runtime argument by keyword
    assert fk._entry(Compiled(), 4, {}) is False  # a constexpr passed positionally
    assert fk._entry(Compiled(), 3, {}) is False  # BLOCK missing
    assert fk._entry(Compiled(), 3, {"BLOCK": 1, "bogus": 1}) is False  # not a parameter nor an option
    assert fk._entry(None, 3, {"BLOCK": 1}) is False  # an async compile (no kernel yet)
    assert fk.arg_names == ["X", "n", "eps", "BLOCK", "FLAG"]  # other attributes are the JIT function's


def test_fast_launch_is_off_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not _launch.fast_launch_enabled()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("LIT_LIGER_FAST_LAUNCH", "0")
    assert not _launch.fast_launch_enabled()
    monkeypatch.setenv("LIT_LIGER_FAST_LAUNCH", "1")
    monkeypatch.setattr(_launch, "_triton_version", lambda: (3, 3))
    assert not _launch.fast_launch_enabled()  # a Triton whose launch convention was not read
    monkeypatch.setattr(_launch, "_triton_version", lambda: (3, 6))
    assert _launch.fast_launch_enabled()


@pytest.mark.gpu
def test_gpu_fast_launch_matches_tritons_path(monkeypatch):
    """Same results bit for bit through the direct launcher and through Triton's own path, across dtypes,
    sizes and pointer alignments (views one element in make other specializations), and the direct path was
    taken on repeat launches."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from lit_liger.kernels import rms_norm, swiglu
    glu_mod = sys.modules["lit_liger.kernels.swiglu"]  # the package exports the function of that name

    assert _launch.fast_launch_enabled(), "expected on this Triton"
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    for dt in (torch.bfloat16, torch.float32):
        for n in (1000, 4096 + 3):
            flat_a = torch.randn(n + 1, device="cuda", dtype=dt, generator=g)
            flat_b = torch.randn(n + 1, device="cuda", dtype=dt, generator=g)
            cases += [(flat_a[:n], flat_b[:n]), (flat_a[1:], flat_b[1:]), (flat_a[1:], flat_b[:n])]
    x = torch.randn(6, 256, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16, generator=g)

    def run_all():
        outs = [swiglu(a, b) for a, b in cases for _ in range(2)]  # the second call of each is a repeat launch
        outs += [rms_norm(x, w, 1e-6) for _ in range(2)]
        torch.cuda.synchronize()
        return outs

    fast = run_all()
    entries = glu_mod._glu_fwd_kernel._entries
    assert entries and all(e is not False for e in entries.values())
    assert len({k[1] for k in entries}) >= 4  # alignments and dtypes made separate specializations
    monkeypatch.setattr(_launch, "_FAST", [False])
    slow = run_all()
    for f, s in zip(fast, slow):
        assert torch.equal(f, s)


def test_fast_launch_passes_non_jit_kernels_through(monkeypatch):
    """A wrapped object that is not a plain JIT function (the interpreter's, an autotuner) is always launched
    through itself, even where the direct path is on for the process."""
    calls = []

    class NotJit:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k)) or "launched"

    monkeypatch.setattr(_launch, "_FAST", [True])
    fk = _launch.FastKernel(NotJit())
    assert fk[(2,)](1, 2, BLOCK=4) == "launched" and fk[(2,)](1, 2, BLOCK=4) == "launched"
    assert calls == [((2,), (1, 2), {"BLOCK": 4})] * 2 and fk._entries == {}
