"""The one place that turns a device and a problem shape into Triton launch parameters.

Every kernel wrapper asks this module for its block size, ``num_warps`` and grid; nothing else in
the package hard-codes a vendor number. The limits come from the device itself:

* warp size: 32 on NVIDIA, 64 on AMD Instinct (wavefront);
* max threads per block: 1024 on both today, read from the device where torch exposes it;
* SM / CU count: used to size persistent grids and partial-reduction buffers.

``num_warps * warp_size`` never exceeds the thread limit (the known failure elsewhere:
``num_warps=32`` on a warp-64 device is 2048 threads).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

__all__ = [
    "DeviceLimits",
    "RowPlan",
    "ElementwisePlan",
    "device_limits",
    "row_plan",
    "elementwise_plan",
    "partial_rows",
    "interpret_mode",
    "use_triton",
    "check_dtype_supported",
    "MAX_FUSED_BYTES",
    "flex_kernel_options",
    "AttentionPlan",
    "attention_plan",
    "cdiv",
    "ATTN_BWD_SLICE_BYTES",
    "attn_bwd_slices",
    "LORA_BRANCH_SMS",
    "LORA_BRANCH_MAX_ROWS",
    "lora_branch_sms",
    "next_pow2",
    "FastKernel",
    "fast_launch",
    "fast_launch_enabled",
    "fp8_tile_plan",
    "embedding_grad_plan",
]

# A row-wise kernel keeps one row in registers; past this many bytes per row it would spill.
MAX_FUSED_BYTES = 65536


# Host-side integer helpers. ``triton.cdiv`` / ``triton.next_power_of_2`` are ``@triton.jit`` functions in recent
# Triton releases: called from Python each goes through ``JITFunction.__call__`` (~5 us of host time on an H100
# machine's CPU, measured by `python -m benchmarks diag op-host`), several per kernel launch. These are plain Python.
def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ``a`` and positive ``b``."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    warp_size: int
    max_threads_per_block: int
    sm_count: int
    capability: tuple[int, int]
    is_hip: bool

    @property
    def max_warps(self) -> int:
        return max(1, self.max_threads_per_block // self.warp_size)

    @property
    def supports_bf16(self) -> bool:
        return self.is_hip or self.capability >= (8, 0)


# Used for CPU tensors under TRITON_INTERPRET=1: the interpreter runs one program at a time and ignores
# num_warps, but the plan must still be a legal one for a real GPU.
_CPU_LIMITS = DeviceLimits("cpu (triton interpreter)", 32, 1024, 4, (0, 0), False)


def interpret_mode() -> bool:
    """True when Triton kernels run on CPU tensors through Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(t: torch.Tensor) -> bool:
    """CUDA/ROCm tensors run Triton; CPU tensors only under the interpreter (else: reference math)."""
    if t.device.type == "cuda":
        return True
    return t.device.type == "cpu" and interpret_mode()


def _limits_from_props(props, is_hip: bool) -> DeviceLimits:
    warp = getattr(props, "warp_size", None) or (64 if is_hip else 32)
    max_threads = getattr(props, "max_threads_per_block", None) or 1024
    return DeviceLimits(
        name=props.name,
        warp_size=int(warp),
        max_threads_per_block=int(max_threads),
        sm_count=int(props.multi_processor_count),
        capability=(int(props.major), int(props.minor)),
        is_hip=is_hip,
    )


#: device index -> its limits. A plain dict, not ``functools.lru_cache``: ``device_limits`` is also called while
#: torch.compile traces a swapped model, and dynamo warns about every lru_cache-wrapped call it traces ("Dynamo
#: detected a call to a `functools.lru_cache`-wrapped function ... This call originates from ...").
_CUDA_LIMITS: dict[int, DeviceLimits] = {}


def _cuda_limits(index: int) -> DeviceLimits:
    lim = _CUDA_LIMITS.get(index)
    if lim is None:
        lim = _CUDA_LIMITS[index] = _limits_from_props(torch.cuda.get_device_properties(index),
                                                       torch.version.hip is not None)
    return lim


def device_limits(device: torch.device | str | None = None) -> DeviceLimits:
    if device is None:
        return _cuda_limits(torch.cuda.current_device())
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cuda":
        return _CPU_LIMITS
    return _cuda_limits(device.index if device.index is not None else torch.cuda.current_device())


def check_dtype_supported(dtype: torch.dtype, device: torch.device) -> None:
    """Clear error instead of a Triton crash for bf16 on pre-Ampere NVIDIA GPUs."""
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"lit-liger kernels support float32, float16 and bfloat16 inputs, got {dtype}")
    if device.type == "cuda" and dtype == torch.bfloat16:
        lim = device_limits(device)
        if not lim.supports_bf16:
            raise TypeError(
                f"bfloat16 needs compute capability >= 8.0, but {lim.name} is sm_{lim.capability[0]}{lim.capability[1]}; "
                "train in float16 or float32 (e.g. `--precision 16-mixed`), or disable lit-liger"
            )


@dataclass(frozen=True)
class RowPlan:
    """One program per block of rows; each row of ``n_cols`` fits in one ``BLOCK`` of registers."""

    block: int
    num_warps: int

    @property
    def threads(self) -> int:
        return self.num_warps  # times warp size; kept for readability in tests


def _clamp_warps(warps: int, lim: DeviceLimits) -> int:
    warps = max(1, min(warps, lim.max_warps))
    # power of two, as Triton requires
    return 1 << (warps.bit_length() - 1)


def row_plan(n_cols: int, element_size: int, device: torch.device) -> RowPlan:
    """Block and warps for kernels that hold one row of ``n_cols`` in registers (norms, CE rows).

    The block is the next power of two >= n_cols. Warps grow with the row so each thread holds
    ~8-16 elements (16 bytes per load for 16-bit types), capped by the device's thread limit.
    Memoized per (n_cols, element size, device limits): it runs on every launch.
    """
    return _row_plan(n_cols, element_size, device_limits(device))


@functools.lru_cache(maxsize=4096)
def _row_plan(n_cols: int, element_size: int, lim: DeviceLimits) -> RowPlan:
    block = next_pow2(n_cols)
    if block * element_size > MAX_FUSED_BYTES:
        raise ValueError(
            f"row of {n_cols} elements ({element_size} bytes each) is too wide for a fused row kernel "
            f"(limit {MAX_FUSED_BYTES} bytes)"
        )
    elems_per_thread = 8 if element_size >= 4 else 16
    warps = cdiv(block, elems_per_thread * lim.warp_size)
    return RowPlan(block=block, num_warps=_clamp_warps(warps, lim))


@dataclass(frozen=True)
class ElementwisePlan:
    block: int
    num_warps: int
    grid: tuple[int]


def elementwise_plan(n_elements: int, device: torch.device, block: int | None = None) -> ElementwisePlan:
    """Flat 1-D launch for purely elementwise kernels (SwiGLU/GeGLU). Memoized like :func:`row_plan`."""
    return _elementwise_plan(n_elements, device_limits(device), block)


@functools.lru_cache(maxsize=4096)
def _elementwise_plan(n_elements: int, lim: DeviceLimits, block: int | None) -> ElementwisePlan:
    if block is None:
        block = 1024 if lim.warp_size == 32 else 2048
        block = min(block, next_pow2(n_elements))
    warps = _clamp_warps(max(1, block // (8 * lim.warp_size)), lim)
    return ElementwisePlan(block=block, num_warps=warps, grid=(cdiv(max(n_elements, 1), block),))


def partial_rows(n_rows: int, device: torch.device) -> int:
    """Number of programs for a row kernel that also reduces a per-column gradient (dW).

    A persistent grid of a few programs per SM: each program loops over rows, accumulates its
    share of dW in fp32 registers and writes one partial row; the partials are summed on device
    (no host sync). On the interpreter a small grid keeps CPU tests fast.
    """
    lim = device_limits(device)
    per_sm = 1 if device.type != "cuda" else 4
    return max(1, min(n_rows, lim.sm_count * per_sm))


def embedding_grad_plan(n_cols: int, device: torch.device) -> tuple[int, int]:
    """``(block_cols, num_warps)`` of ``kernels.embedding``'s gradient-into kernel: one program per sorted token
    position and block of columns; most programs (a row's later occurrences) load three integers and stop. 1024
    columns over 4 warps of 32 is 8 per thread, one 16-byte load of a 16-bit row per thread and occurrence; narrower
    rows take one block. The interpreter gets small blocks: CPU tests use small widths."""
    if device.type != "cuda":
        return min(next_pow2(n_cols), 32), 1
    lim = device_limits(device)
    warps = _clamp_warps(4, lim)
    return min(next_pow2(n_cols), 8 * lim.warp_size * warps), warps


def fp8_tile_plan(device: torch.device) -> tuple[int, int, int]:
    """``(block_rows, block_cols, num_warps)`` of ``kernels.float8``'s tile kernels (bandwidth bound: read a 16-bit
    tile, write it as float8 row-major and/or transposed): 64 x 64 tiles, 4 warps (32 elements per thread with warps
    of 32). The transposed store goes through shared memory (Triton's layout conversion) in 64-byte rows. The
    interpreter gets small tiles: CPU tests use small shapes."""
    if device.type != "cuda":
        return 16, 16, 1
    return 64, 64, _clamp_warps(4, device_limits(device))


def fp8_scale_plan(device: torch.device) -> tuple[int, int]:
    """``(block, num_warps)`` of ``kernels.float8._scale_kernel``: one program folds a tensor's per-tile maxima (a few
    thousand floats) in blocks of 1024, then does the scale's float64 arithmetic. The block is fixed, not sized to the
    count, so that token counts that vary between micro-batches do not compile it again."""
    return 1024, _clamp_warps(4, device_limits(device))


#: ``glu_mlp``: the MLP's rows run in this many chunks (at least MLP_MIN_ROWS rows each, tests lower it)
MLP_CHUNKS = 4
MLP_MIN_ROWS = 128


#: the most bytes one ``(rows, intermediate_size)`` tensor of an MLP run in pieces may take: ``glu_mlp``'s chunks (with
#: ``row_bytes``) and the tiled MLP's tiles (``lit_liger.runtime.memplan.tile_tokens``). At 256 MiB the pieces keep
#: thousands of rows (Llama-3.1-8B's 14,336-wide MLP: 9,362 in bf16), long past where a GEMM's speed stops growing
#: with its rows; without the cap ``glu_mlp``'s quarters of a 256k-token sequence were 1.75 GiB each, three at once
MLP_CHUNK_BYTES = 256 * 2**20


#: the most bytes of the query one call of the attention's backward (``lit_liger.swap.attend``'s recomputed Blocks)
#: takes: where the query is larger, the backward runs over slices of whole key/value groups. Flash's and cuDNN's
#: backwards hold a float32 accumulator of the query's gradient (twice the query's bytes) beside their outputs: at
#: Llama-3.1-8B's width and 262,144 tokens 4 GiB in one call, 0.5 GiB over its 8 groups (measured with cuDNN's
#: workspace: 706 MiB above the inputs in one call at 16k tokens, 280 MiB over 8 slices; at 262k a slice's call held
#: 1.4 GiB; benchmarks/results/h200-2026-12-04d). 256 MiB keeps 32k tokens of a 4096-wide query (and every shorter one)
#: in one call; the slices still hold thousands of row blocks each. Whether slices cost time is not measured yet
#: (``python -m benchmarks diag long-attn``'s ``rerun-gqa`` / ``rerun-sliced-gqa``)
ATTN_BWD_SLICE_BYTES = 256 * 2**20


#: SMs that a LoRA layer's frozen input-gradient GEMM leaves free for the layer's LoRA branch, in a CUDA graph's
#: backward (the branch on a second stream: ``lit_liger.swap.lora``). At a recipe's few hundred rows cuBLAS's kernel for
#: that GEMM is one wave over every SM (gemma2-2b's fc backward: 2 x 66 tiles on the H200's 132 SMs), so the branch's
#: small kernels (``dh``, ``dh A``, ``dB``, the dropout's backward, ``dA``) waited for its end: ``dy B`` reported 46.6 us
#: against ~5 alone. Through cuBLASLt with 16 SMs left (PyTorch's SM carveout, which its cuBLAS path ignores) the
#: frozen GEMM runs on 116 and the branch beside it. Measured on an H200 (torch 2.11, ``python -m benchmarks diag
#: lora-cost``, gemma2-2b's recipe: 26 layers, 2 x 256 tokens, r 8 on every projection, dropout 0.1; one process, the
#: variants in turns, benchmarks/results/h200-2026-12-04e): the backward graphs 9.59 -> 8.47 ms with 16 SMs (8: 9.13,
#: 24: 8.44; cuBLASLt without a carveout 9.58). The forward with a carveout was not faster (7.07-7.14 against 6.89
#: ms: the dropout's kernel is as long as the branch's share of the frozen GEMM). Hopper only, where it was measured.
LORA_BRANCH_SMS = 16
#: ... and only for GEMMs of at most this many rows (about one wave of tiles at 2-4k wide outputs): at several thousand
#: rows the frozen GEMM is several waves and the branch's kernels find SMs between them; not measured there, so left
#: alone. The README's Llama-3.2-1B LoRA row (packed micro-batches of ~1,000 rows, LoRA on q and v) gets the carveout
#: for its micro-batches of up to 1,024 rows: not re-measured yet
LORA_BRANCH_MAX_ROWS = 1024


def lora_branch_sms(device: torch.device, rows: int) -> int | None:
    """:data:`LORA_BRANCH_SMS` for a LoRA layer's frozen input-gradient GEMM of ``rows`` rows on ``device`` while its
    branch runs beside it, or None (no carveout: another GPU than Hopper, ROCm, a torch without PyTorch's SM
    carveout, or more than :data:`LORA_BRANCH_MAX_ROWS` rows)."""
    if rows > LORA_BRANCH_MAX_ROWS or not hasattr(torch._C, "_set_sm_carveout_experimental"):
        return None
    lim = device_limits(device)
    if lim.is_hip or lim.capability != (9, 0) or lim.sm_count <= LORA_BRANCH_SMS:
        return None
    return LORA_BRANCH_SMS


def attn_bwd_slices(n_groups: int, q_bytes: int) -> int:
    """The number of slices (a divisor of ``n_groups``, each of whole key/value groups) the attention's backward of a
    query of ``q_bytes`` runs over: the fewest whose query slice is at most :data:`ATTN_BWD_SLICE_BYTES`, else one
    group a slice."""
    for parts in range(1, n_groups + 1):
        if n_groups % parts == 0 and q_bytes <= ATTN_BWD_SLICE_BYTES * parts:
            return parts
    return max(1, n_groups)


def mlp_chunk_rows(n_rows: int, row_bytes: int = 0) -> int:
    """Rows per chunk of :func:`glu_mlp` (frozen MLP, recomputed in its backward): its transient ``(rows, I)``
    tensors are a quarter of the whole MLP's, and with ``row_bytes`` (one ``(1, I)`` row's bytes) at most
    :data:`MLP_CHUNK_BYTES`, while each GEMM keeps at least 128 rows (one row of 128 x 128 output tiles: smaller
    chunks only add launches)."""
    rows = cdiv(n_rows, MLP_CHUNKS)
    if row_bytes > 0:
        rows = min(rows, MLP_CHUNK_BYTES // row_bytes)
    return max(1, MLP_MIN_ROWS, rows)


def flex_kernel_options(head_dim: int, dtype: torch.dtype, device: torch.device, windowed: bool = False) -> dict | None:
    """FlexAttention launch settings (``flex_attention(kernel_options=...)``) where torch's own default was
    measured slower, else ``None`` (torch's default).

    Measured on an H100 (torch 2.11, ``benchmarks/results/h100-2026-11-23e/flex*/``), forward+backward of one
    layer at B4 T2048, bf16, head size 256: torch's sm90 default for the backward is 64x64 blocks, 2 stages,
    4 warps; 8 warps took gemma-2-2b's shape (8 heads, 4 groups, softcap) from 3.11 to 2.72 ms and gemma-3-1b's
    (4 heads, 1 group, window 512) from 1.36 to 1.05 ms. The forward keeps torch's default: the 128x128 /
    1-stage / 8-warp forward inductor's autotune picked at gemma-2's shape, added to that backward, gave 2.69 ms
    there but 1.23 ms at gemma-3's. Other head sizes keep torch's default (up to 128 it is already 8 warps on
    sm90 for the backward; sizes between 128 and 256 were not measured).

    Without a window (``windowed`` False: the block mask is causal), ``BLOCKS_ARE_CONTIGUOUS`` too: each query
    block's full key blocks are 0 .. i-1 and its partial one is i (and the transposed lists of the backward are
    contiguous the same way), so the kernels step to the next block instead of loading its index. A sliding
    window's partial blocks are two with a gap (the window's first block and the diagonal): never set there.
    Measured on an H100 (``h100-2026-11-24c/flex-sweep2/``, ``flex-sweep3/``): gemma-2's layer forward+backward
    2.50 -> 2.16 and 2.37 -> 2.29 ms in two sweeps (2.20 ms for lit-liger's default after the change)."""
    if device.type != "cuda" or torch.version.hip is not None or dtype not in (torch.bfloat16, torch.float16):
        return None
    if device_limits(device).capability != (9, 0) or head_dim != 256:
        return None
    options = {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
               "bwd_num_stages": 2, "bwd_num_warps": 8}
    if not windowed:
        options["BLOCKS_ARE_CONTIGUOUS"] = True
    return options


@dataclass(frozen=True)
class AttentionPlan:
    """Blocks, warps and stages of ``kernels/attention.py``: the forward (query rows ``fwd_m`` x key rows
    ``fwd_n``), the key-block backward (``kv_n`` key rows, stepping ``kv_m`` query rows; ``kv_hs_major``: it
    accumulates ``dk``/``dv`` transposed, ``(hs, kv_n)``, which puts the head size in its dots' M: Hopper's
    warp-group MMA needs M >= 64, and 64-key ``(kv_n, hs)`` accumulators at head size 256 do not fit the
    registers), the query-block backward (``q_m`` x ``q_n``) and the ``delta`` pass (``delta_m`` rows,
    ``delta_warps`` warps)."""

    fwd_m: int
    fwd_n: int
    fwd_warps: int
    fwd_stages: int
    kv_m: int
    kv_n: int
    kv_warps: int
    kv_stages: int
    q_m: int
    q_n: int
    q_warps: int
    q_stages: int
    delta_m: int = 64
    delta_warps: int = 4
    kv_hs_major: bool = False


#: the interpreter (CI): small blocks, so a test's short sequences still cross several blocks and the padding
_ATTN_CPU = AttentionPlan(16, 16, 4, 1, 16, 16, 4, 1, 16, 16, 4, 1, 16)
#: a plan set by ``python -m benchmarks diag attn-sweep`` while it measures candidates (None: the table below)
ATTENTION_PLAN_OVERRIDE: list[AttentionPlan | None] = [None]


def attention_plan(head_dim: int, dtype: torch.dtype, device: torch.device, T: int = 0, heads: int = 0
                   ) -> AttentionPlan:
    """Launch settings of the causal / softcap attention kernels for one head size on one device; ``T`` the
    sequence's length and ``heads`` its batch size times query heads (0: a long sequence's plan).

    The tiles sit in shared memory: a row of ``head_dim`` bf16 values is 512 bytes at 256, and the kernels hold
    four such tiles (q, k, v, dO) plus the pipeline's copies. The measured plans are the H100's (sm90: 227 KiB per
    block); every other device gets small blocks that fit in 64 KiB (the A100 has 163 KiB, consumer NVIDIA parts
    99, AMD Instinct 64), not timed. ``tests/test_gpu_compile.py`` compiles every plan for sm90, sm80 and, where
    Triton has the backend, gfx942, and checks each against its device's limit."""
    if ATTENTION_PLAN_OVERRIDE[0] is not None:
        return ATTENTION_PLAN_OVERRIDE[0]
    lim = device_limits(device)
    if lim.capability == (0, 0):  # the interpreter
        return _ATTN_CPU
    big = head_dim * (4 if dtype == torch.float32 else 2) > 256  # bytes per tile row
    if lim.is_hip or lim.capability != (9, 0):
        return AttentionPlan(32, 32, 4, 1, 32, 32, 4, 1, 32, 32, 4, 1) if big else \
            AttentionPlan(64, 32, 4, 1, 32, 32, 4, 1, 64, 32, 4, 1)
    if dtype == torch.float32 and head_dim > 64:
        # fp32 tiles take twice the shared memory: the bf16 plans below need more than an H100's 227 KiB at head
        # size 256 (measured: 295 KB requested). Not timed (lit-liger's adapter sends fp32 layers to FlexAttention)
        return AttentionPlan(64, 32, 4, 1, 32, 32, 4, 1, 32, 32, 4, 1)
    if head_dim > 128 and T and heads * cdiv(T, 128) < lim.sm_count:
        # a short sequence (a packed fine-tuning micro-batch: gemma2-2b's shipped LoRA recipe packs 2 samples of at
        # most 512 tokens into one row): the long plan's 128-row blocks leave most SMs idle (T 1024, 8 heads: 64
        # blocks for 132). Measured on an H200 (torch 2.11, triton 3.6), packed rows of 256, 512 and 1024 slots (two
        # samples each), 8 heads / 4 groups, softcap 50, CUDA-graph timed: each kernel's best of 8-11 candidates
        # (h200-2026-12-03b a1), one plan for the three rows; forward + backward 0.049 / 0.065 / 0.087 ms against the
        # long plan's 0.077 / 0.103 / 0.132 in one run (a2)
        return AttentionPlan(64, 32, 4, 3, 128, 32, 8, 1, 64, 32, 4, 2, kv_hs_major=True)
    if head_dim > 128:
        # measured on an H100 (torch 2.11, triton 3.6), gemma-2-2b's layer at B4 T2048 bf16 (8 heads, 4 groups,
        # softcap 50): each kernel's best of 9-10 candidates (h100-2026-11-24g/attn/), then of 6-8 around those
        # (attn2/): forward 0.34 ms, backward 1.2 ms; forward + backward 1.51 ms against FlexAttention's 2.36.
        # The key-block backward in the (hs, keys) layout (h100-2026-11-24h/attn4/, 8 candidates of both layouts):
        # the whole backward 1.11 ms against 1.21 for the (keys, hs) layout's best, in one run; then 64-key blocks
        # (attn6/, 5 candidates): 0.93 ms against 1.04 for 32 keys, in one run
        return AttentionPlan(128, 64, 8, 2, 128, 64, 8, 1, 128, 32, 8, 3, kv_hs_major=True)
    # head size 128 (B4 T2048, 16 heads, 8 groups, softcap 30; gemma-2-27b's heads), the backward's kernels swept
    # (h100-2026-11-24h/attn5/, both layouts): forward + backward 1.80 ms against 2.10 with the earlier unswept plan
    # and FlexAttention's 1.91, in one run
    return AttentionPlan(128, 64, 8, 2, 128, 64, 8, 2, 128, 64, 8, 2, kv_hs_major=True)


# ----------------------------------------------------------------------------------------------
# Kernel launch without Triton's generic per-call dispatch
# ----------------------------------------------------------------------------------------------
# ``kernel[grid](*args)`` goes through ``JITFunction.run`` on every call: environment-backed knobs, the argument
# binder, a cache key built with ``str(options)``, a launch-metadata object, then the compiled kernel's launcher.
# At LitGPT's small-step sizes that is most of an op's host time (a bare Triton launch measured 18.9-39.8 us
# against 9.1-17.5 us for one aten launch, h100-2026-11-24b/op-host-*). ``FastKernel`` keeps Triton's path for
# the first launch of each specialization (it compiles and returns the ``CompiledKernel``) and calls that
# kernel's launcher directly afterwards, with the arguments Triton itself passes it. The specialization key
# covers everything Triton specializes a launch on (argument dtypes, 16-byte pointer alignment, integer
# divisibility by 16 / equality to 1 / width, constexpr values, launch options, current device), so a launch
# never reaches a kernel compiled for other arguments. Used on the Triton versions whose launch convention was
# read (``JITFunction.run`` -> ``CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata,
# launch_metadata, enter_hook, exit_hook, *bound_args)``: 3.6 to 3.9); anywhere else, under the interpreter,
# with launch hooks installed (profilers) or with ``LIT_LIGER_FAST_LAUNCH=0``, every launch takes Triton's path.
FAST_LAUNCH_TRITON = ((3, 6), (3, 9))


def _triton_version() -> tuple[int, int]:
    import triton

    try:
        major, minor = triton.__version__.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def fast_launch_enabled() -> bool:
    """Whether :class:`FastKernel` launches skip Triton's dispatch in this process (read at the first launch)."""
    lo, hi = FAST_LAUNCH_TRITON
    return (os.environ.get("LIT_LIGER_FAST_LAUNCH", "1") != "0" and not interpret_mode()
            and lo <= _triton_version() <= hi)


# what Triton's CUDA driver itself calls for the current device and its current stream's handle
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda d: torch.cuda.current_stream(d).cuda_stream)
_FAST = [None]  # resolved on first launch (importing triton.knobs early is avoided)
_I32 = (-(2**31), 2**31)


class _Unsupported(Exception):
    pass


def _arg_spec(a):
    """What Triton's specialization sees of one runtime argument."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    t = type(a)
    if t is bool:
        return "b", a
    if t is int:
        return "i", a == 1, a % 16 == 0, _I32[0] <= a < _I32[1], a >= 2**63
    if t is float:
        return "f"
    if a is None:
        return None
    raise _Unsupported


_RUNTIME_KNOBS = []  # triton.knobs.runtime, looked up once


def _hooks_installed() -> bool:
    if not _RUNTIME_KNOBS:
        from triton import knobs

        _RUNTIME_KNOBS.append(knobs.runtime)
    rt = _RUNTIME_KNOBS[0]
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


class FastKernel:
    """A ``@triton.jit`` kernel launched as ``kernel[grid](*runtime_args, **constexprs_and_options)``, whose
    repeat launches call the compiled kernel's launcher directly (see the comment above). Runtime arguments are
    passed positionally, constexprs and options (``num_warps``...) by keyword; anything else (a runtime argument
    by keyword, a callable grid, an unsupported argument type) takes Triton's path. Other attributes are the
    JIT function's."""

    def __init__(self, fn):
        from triton.runtime.jit import JITFunction

        self.fn = fn
        self._entries: dict = {}
        # under the interpreter (or for an autotuner / heuristics wrapper) every launch takes the wrapped path
        self._is_jit = isinstance(fn, JITFunction)

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        fast = _FAST[0]
        if fast is None:
            fast = _FAST[0] = fast_launch_enabled()
        if not fast or not self._is_jit or callable(grid) or _hooks_installed():
            return self.fn[grid](*args, **kwargs)
        try:
            device = _current_device()
            key = (device, tuple(map(_arg_spec, args)), tuple(kwargs.items()))  # a call site keeps its order
        except (_Unsupported, TypeError):  # TypeError: an unhashable keyword value
            return self.fn[grid](*args, **kwargs)
        entry = self._entries.get(key)
        if entry is None:
            kernel = self.fn[grid](*args, **kwargs)
            self._entries[key] = self._entry(kernel, len(args), kwargs)
            return kernel
        if entry is False:
            return self.fn[grid](*args, **kwargs)
        run, function, packed, tail = entry
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _current_stream(device),
            function, packed, None, None, None, *args, *tail)
        return None

    def _entry(self, kernel, n_args: int, kwargs):
        """(launcher, function, packed metadata, constexpr values after the positional arguments), or False
        where this launch cannot be repeated without Triton's binder."""
        params = self.fn.params
        if kernel is None or hasattr(kernel, "result") or n_args > len(params):
            return False
        if any(p.is_constexpr for p in params[:n_args]):
            return False  # a constexpr passed positionally: fine for Triton, but keep the rule simple
        tail = []
        for p in params[n_args:]:
            if not p.is_constexpr:
                return False  # a runtime argument by keyword or by default
            if p.name in kwargs:
                tail.append(kwargs[p.name])
            elif p.has_default:
                tail.append(p.default)
            else:
                return False
        names = {p.name for p in params}
        # keywords that are neither parameters nor Triton's launch options would be an error in Triton's path
        if any(k not in names and k not in _OPTION_NAMES for k in kwargs):
            return False
        try:
            return kernel.run, kernel.function, kernel.packed_metadata, tuple(tail)
        except AttributeError:
            return False


_OPTION_NAMES = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl",
                           "launch_cooperative_grid", "debug"})


def fast_launch(fn) -> FastKernel:
    """Decorator over ``@triton.jit``: see :class:`FastKernel`."""
    return FastKernel(fn)
