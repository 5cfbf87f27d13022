"""Plumbing shared by the kernel and step benchmarks: device set-up, timing, memory, ceilings, files.

Importing this module first matters: without a CUDA GPU it sets ``TRITON_INTERPRET=1`` before any
lit-liger kernel module is imported (``triton.jit`` decides at decoration time whether a kernel runs
compiled or in the interpreter), so ``--smoke`` runs the real Triton kernels on CPU tensors.
"""

from __future__ import annotations

import datetime
import gc
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Running from a checkout (``python -m benchmarks``, or an editable install): this folder is the
#: repository's ``benchmarks/``. Installed from a wheel it is ``site-packages/lit_liger/benchmarks``.
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and Path(__file__).resolve().parent.name == "benchmarks"
#: Real runs: the checkout's committed results folder, or ``./lit-liger-bench-results`` for an installed package.
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" if IN_CHECKOUT else Path.cwd() / "lit-liger-bench-results"
SMOKE_DIR = Path("/tmp/lit-liger-bench")
#: This package's import name (``benchmarks`` from a checkout, ``lit_liger.benchmarks`` installed): the
#: benchmarks that start fresh processes run ``python -m {PACKAGE}.<module>``.
PACKAGE = __package__ or "benchmarks"
#: How the user started the benchmarks, for ``--help`` and the command lines written into results.
PROG = "python -m benchmarks" if PACKAGE == "benchmarks" else "lit-liger bench"

MiB = 1024**2
GiB = 1024**3


class Unavailable(Exception):
    """A variant that cannot run here (module missing, package not installed, no CUDA): recorded, not raised."""


# ----------------------------------------------------------------------------------------------
# Device and environment
# ----------------------------------------------------------------------------------------------
def device() -> torch.device:
    return torch.device("cuda" if CUDA else "cpu")


def device_name() -> str:
    return torch.cuda.get_device_name() if CUDA else "cpu (triton interpreter)" if interpret_mode() else "cpu"


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode != 0:
            return None
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_with_timeout(cmd: list[str], timeout: float, **kwargs: Any) -> tuple[int, str, str]:
    """``cmd`` in a session of its own: ``(returncode, stdout, stderr)``; past ``timeout`` seconds its whole process
    group is killed (the processes a distributed run launched too: killed alone, the first leaves the others holding
    their GPUs, waiting on it) and the return code is 124, with what it printed until then."""
    import signal

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return 124, out or "", (err or "") + f"\ntimeout after {timeout:g} s"


def environment() -> dict[str, Any]:
    """Everything a reader needs to reproduce or compare a result file."""
    import triton

    env: dict[str, Any] = {
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "liger_kernel": _version("liger-kernel"),
        "litgpt": _version("litgpt"),
        "lightning": _version("lightning"),
        "deepspeed": _version("deepspeed"),
        "lit_liger": _version("lit-liger"),
        "lit_liger_commit": _git_commit(),
        "python": sys.version.split()[0],
        "date": datetime.date.today().isoformat(),
        "triton_interpret": interpret_mode(),
    }
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        env.update(
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            total_memory_GiB=round(props.total_memory / GiB, 2),
        )
        gpus = _gpu_state()
        if gpus:
            env["gpus"] = gpus
    return env


def _gpu_state() -> list[str]:
    """Each visible GPU's clocks, power limit and throttle reasons as ``nvidia-smi`` reports them now (empty without
    it): two instances of one machine kind once ran the same 2-GPU recipe at 15,878 and 28,415 tok/s
    (results/h200x2-2026-11-27c), and nothing in the JSON told them apart."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    fields = "index,name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def default_out_dir(smoke: bool) -> Path:
    """``benchmarks/results/<device>-<date>/`` for real runs; smoke runs go to /tmp, never into results/."""
    name = f"{slug(device_name())}-{datetime.date.today().isoformat()}"
    return SMOKE_DIR / f"{name}-smoke" if smoke else RESULTS_DIR / name


# ----------------------------------------------------------------------------------------------
# Timing, memory, failures
# ----------------------------------------------------------------------------------------------
def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], Any], *, quick: bool = False, smoke: bool = False) -> float:
    """Median milliseconds of ``fn()``. CUDA: ``triton.testing.do_bench`` (it warms up first and
    clears L2 before every timed call). CPU (smoke): ``time.perf_counter`` over a few calls."""
    if CUDA:
        import triton.testing

        warmup, rep = (5, 20) if smoke else (10, 40) if quick else (25, 100)
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    if not smoke:  # smoke callers have just run fn once already
        fn()
    times = []
    for _ in range(1 if smoke else 5):  # smoke: each of the two timings is one call
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gpu_kernel_ms(fn: Callable[[], Any], n: int = 10) -> float:
    """Mean milliseconds of GPU kernel time per ``fn()`` call (torch.profiler's CUDA kernel events),
    without the host's launch overhead that ``do_bench`` also sees."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        sync()
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return total_us / n / 1e3


def is_oom(exc: BaseException) -> bool:
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), torch.cuda.OutOfMemoryError) if t)
    return isinstance(exc, oom_types) or "out of memory" in str(exc).lower()


def graph_pool_idle_bytes() -> int:
    """Bytes that CUDA graphs' private memory pools (lit-liger's ``cuda_graphs``) hold without an allocation in them
    now: the activations of a replayed step live there. A replay allocates nothing, so ``max_memory_allocated`` over
    replayed steps leaves them out; a peak of such steps is that maximum plus these bytes."""
    if not CUDA:
        return 0
    return sum(s["total_size"] - s["allocated_size"] for s in torch.cuda.memory._snapshot()["segments"]
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


def n_params(config) -> int:
    """The parameter count of LitGPT's ``GPT(config)``, built on the meta device (no memory)."""
    from litgpt import GPT

    with torch.device("meta"):
        return sum(p.numel() for p in GPT(config).parameters())


def free_memory() -> None:
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()


def reset_compile() -> None:
    """Forget every compiled graph, so each variant/case compiles for its own shapes (no dynamic-shape reuse)."""
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - best effort on exotic builds
        pass


def failure_status(exc: BaseException) -> str:
    """One line for a table cell: "OOM" or "error: Type: message"; the traceback goes to stderr."""
    if is_oom(exc):
        return "OOM"
    traceback.print_exception(type(exc), exc, exc.__traceback__, limit=6, file=sys.stderr)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"error: {type(exc).__name__}: {msg[:160]}"


def lit_liger_attr(name: str, modules: Sequence[str] = ()) -> Any:
    """``lit_liger.kernels.<name>``, falling back to ``lit_liger.kernels.<module>.<name>`` (an op whose
    module exists but is not exported yet). Raises ``Unavailable("missing: ...")`` otherwise."""
    try:
        pkg = importlib.import_module("lit_liger.kernels")
        fn = getattr(pkg, name, None)
    except Exception as exc:  # noqa: BLE001 - a half-written module must not stop the harness
        raise Unavailable(f"missing: lit_liger.kernels ({type(exc).__name__}: {exc})") from exc
    reasons = []
    for mod_name in modules if fn is None else ():
        try:
            fn = getattr(importlib.import_module(f"lit_liger.kernels.{mod_name}"), name, None)
        except Exception as exc:  # noqa: BLE001
            reasons.append(f"{mod_name}: {type(exc).__name__}")
            continue
        if fn is not None:
            break
    if fn is None:
        raise Unavailable(f"missing: lit_liger.kernels.{name}" + (f" ({', '.join(reasons)})" if reasons else ""))
    return fn


def liger_kernel_module(module: str) -> Any:
    """Import a liger-kernel module for a peer variant; CPU runs skip it (its kernels need a GPU)."""
    if not CUDA:
        raise Unavailable("skipped: no CUDA")
    if importlib.util.find_spec("liger_kernel") is None:
        raise Unavailable("not installed (pip install lit-liger[bench])")
    return importlib.import_module(module)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| accumulated in fp64 over chunks (no full-size fp32 copies of big grads);
    NaN/inf anywhere gives inf."""
    out, ref = out.detach().reshape(-1), ref.detach().reshape(-1)
    if out.numel() != ref.numel():
        return float("inf")
    num = den = 0.0
    step = 1 << 24
    for s in range(0, out.numel(), step):
        o, r = out[s : s + step].double(), ref[s : s + step].double()
        num += float((o - r).square().sum())
        den += float(r.square().sum())
    if not (math.isfinite(num) and math.isfinite(den)):
        return float("inf")
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return math.sqrt(num / den)


# ----------------------------------------------------------------------------------------------
# Ceilings measured in the same run
# ----------------------------------------------------------------------------------------------
def copy_bandwidth_GBps(*, smoke: bool = False, quick: bool = False) -> float:
    """Device-to-device copy of a large fp32 tensor: (bytes read + bytes written) / time."""
    n = (1 << 20) if smoke else (1 << 28)  # 1 GiB on the GPU: far beyond L2

    def measure() -> float:
        src = torch.randn(n, device=device())
        dst = torch.empty_like(src)
        return time_ms(lambda: dst.copy_(src), quick=quick, smoke=smoke)

    ms = measure()
    free_memory()
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def matmul_TFLOPs(m: int, n: int, k: int, *, dtype: torch.dtype = torch.bfloat16, smoke: bool = False,
                  quick: bool = False) -> float:
    """``F.linear(x (m, k), w (n, k))`` as an lm_head does: 2*m*n*k / time."""

    def measure() -> float:
        x = torch.randn(m, k, device=device(), dtype=dtype)
        w = torch.randn(n, k, device=device(), dtype=dtype)
        return time_ms(lambda: torch.nn.functional.linear(x, w), quick=quick, smoke=smoke)

    ms = measure()
    free_memory()
    return 2 * m * n * k / (ms * 1e-3) / 1e12


# Dense bf16 tensor-core peak (no sparsity), TFLOP/s, by device name fragment (first match wins).
NOMINAL_BF16_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("H200", 989.4),
    ("H800", 989.4),
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("MI300X", 1307.0),
]


def nominal_bf16_TFLOPs(name: str) -> float | None:
    for frag, tflops in NOMINAL_BF16_TFLOPS:
        if frag.lower() in name.lower():
            return tflops
    return None


# ----------------------------------------------------------------------------------------------
# Reference numbers (the anchor file beside DESIGN.md), optional
# ----------------------------------------------------------------------------------------------
def load_anchor(path: str | None) -> tuple[dict | None, str | None]:
    """``--anchor PATH``, or the newest ``../shared/anchors/*.json`` next to the repository if present.
    ``--anchor none`` disables it."""
    if path and path.lower() == "none":
        return None, None
    candidates = [path] if path else sorted(glob.glob(str(REPO_ROOT.parent / "shared" / "anchors" / "*.json")))
    for cand in reversed(candidates):
        try:
            with open(cand) as f:
                return json.load(f), str(cand)
        except (OSError, ValueError):
            continue
    return None, None


# ----------------------------------------------------------------------------------------------
# Output: stdout table, markdown, JSON, PNG
# ----------------------------------------------------------------------------------------------
def fmt(value: Any) -> str:
    """Numbers for tables: ~3 significant digits, integers as they are, None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    a = abs(value)
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    if a >= 0.01 or a == 0:
        return f"{value:.3f}"
    return f"{value:.1e}"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join((c if isinstance(c, str) else fmt(c)).replace("|", "/") for c in r) + " |")
    return "\n".join(out)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def throughput_memory_charts(out_dir: Path, stem: str, tput: dict[str, dict[str, float]],
                             mem: dict[str, dict[str, float]], *, title: str, mem_unit: str) -> list[Path]:
    """``<stem>_throughput.png`` (tokens/s) and ``<stem>_memory.png`` (peak memory) per panel; the paths
    written (none without matplotlib or data)."""
    written = []
    for name, panels, what, ylabel in ((f"{stem}_throughput.png", tput, "tokens/s (higher is better)", "tokens/s"),
                                       (f"{stem}_memory.png", mem, "peak memory", mem_unit)):
        if bar_charts(out_dir / name, panels, title=f"{title}: {what}", ylabel=ylabel):
            written.append(out_dir / name)
    return written


def bar_charts(
    path: Path,
    panels: dict[str, dict[str, float]],
    *,
    title: str,
    ylabel: str,
    hlines: dict[str, float] | None = None,
    hline_label: str = "floor",
) -> bool:
    """One subplot per panel (an op shape or a model), one bar per variant. Returns False (and writes
    nothing) when matplotlib is not installed or there is nothing to plot."""
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    variants = list(dict.fromkeys(v for p in panels.values() for v in p))
    colors = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(variants)}
    n = len(panels)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, bars) in zip(axes.flat, panels.items()):
        labels = list(bars)
        values = [bars[v] for v in labels]
        ax.bar(range(len(labels)), values, color=[colors[v] for v in labels])
        for i, val in enumerate(values):
            ax.text(i, val, fmt(val), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        if hlines and hlines.get(name):
            ax.axhline(hlines[name], color="k", linestyle="--", linewidth=0.8, label=hline_label)
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
