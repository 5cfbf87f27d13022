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
    "cdiv",
    "next_pow2",
]

# A row-wise kernel keeps one row in registers; past this many bytes per row it would spill.
MAX_FUSED_BYTES = 65536


# Host-side integer helpers. ``triton.cdiv`` / ``triton.next_power_of_2`` are ``@triton.jit`` functions in recent
# Triton releases: called from Python each goes through ``JITFunction.__call__`` (~5 us of host time on an H100
# machine's CPU, measured by scripts/gpu_op_host.py), several per kernel launch. These are plain Python.
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


@functools.lru_cache(maxsize=None)
def _cuda_limits(index: int) -> DeviceLimits:
    return _limits_from_props(torch.cuda.get_device_properties(index), torch.version.hip is not None)


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


def flex_kernel_options(head_dim: int, dtype: torch.dtype, device: torch.device) -> dict | None:
    """FlexAttention launch settings (``flex_attention(kernel_options=...)``) where torch's own default was
    measured slower, else ``None`` (torch's default).

    Measured on an H100 (torch 2.11, ``benchmarks/results/h100-2026-11-23e/flex*/``), forward+backward of one
    layer at B4 T2048, bf16, head size 256: torch's sm90 default for the backward is 64x64 blocks, 2 stages,
    4 warps; 8 warps took gemma-2-2b's shape (8 heads, 4 groups, softcap) from 3.11 to 2.72 ms and gemma-3-1b's
    (4 heads, 1 group, window 512) from 1.36 to 1.05 ms. The forward keeps torch's default: the 128x128 /
    1-stage / 8-warp forward inductor's autotune picked at gemma-2's shape, added to that backward, gave 2.69 ms
    there but 1.23 ms at gemma-3's. Other head sizes keep torch's default (up to 128 it is already 8 warps on
    sm90 for the backward; sizes between 128 and 256 were not measured)."""
    if device.type != "cuda" or torch.version.hip is not None or dtype not in (torch.bfloat16, torch.float16):
        return None
    if device_limits(device).capability != (9, 0) or head_dim != 256:
        return None
    return {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
            "bwd_num_stages": 2, "bwd_num_warps": 8}
