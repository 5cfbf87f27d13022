"""``lit-liger doctor`` (what runs natively here, and why) and ``lit-liger check`` (parity on a model).

``doctor`` reads the device the way the kernels do (``lit_liger.kernels._launch``: warp size,
thread limit, SM count, bf16 support), lists the versions that matter, and for each kernel says
which path it takes here -- Triton on the GPU, Triton's CPU interpreter, or the PyTorch reference
math -- and why; where Triton runs it also runs the kernel once, forward and backward, on small
random inputs against plain PyTorch.

``check`` swaps a copy of a LitGPT model (random init from a config name, or a checkpoint), runs
one forward/backward on random tokens with and without lit-liger, and compares the loss and every
parameter's gradient. It exits with status 1 when the worst relative error is above the tolerance.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from .config import LigerConfig

__all__ = ["OPTIONAL", "TOLERANCE", "check", "doctor", "kernel_paths", "optional_pieces"]

#: Whole-model tolerance of ``check`` (relative error of the loss and of each parameter gradient).
#: Each kernel matches its reference to ~1e-5 (fp32) / ~1e-2 (bf16) on its own (DESIGN.md). Across a
#: model the small differences in reduction order and rounding points (e.g. one rounding of the
#: fused residual add + norm instead of two) go through every block forward and again backward,
#: so the whole-model bound is looser: 1e-4 in fp32 (fp32 matmuls run in full fp32 during the check,
#: TF32 would add ~1e-3 of its own), 2e-2 in bf16 (8 mantissa bits: one rounding is up to 2^-9 ~ 2e-3
#: relative, and the two paths round at different points in each of n_layer blocks), 1e-2 in fp16.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_KERNELS = ("rms_norm", "layer_norm", "rope", "swiglu", "geglu", "softcap_attention", "fused_linear_cross_entropy")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; NaN/inf gives inf; 0 when both are zero."""
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf")
    num, den = (out - ref).norm().item(), ref.norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


@contextlib.contextmanager
def _full_fp32_matmuls() -> Iterator[None]:
    """Compare in real fp32: the CLI turns TF32 on (``high``), which would add its own ~1e-3."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA/ROCm GPU")
    return dev


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...] | None = None) -> str:
    allrows = ([head] if head else []) + rows
    w = [max(len(r[i]) for r in allrows) for i in range(len(allrows[0]) - 1)]
    fmt = lambda r: "  ".join([c.ljust(x) for c, x in zip(r, w)] + [r[-1]]).rstrip()
    lines = [fmt(r) for r in allrows]
    if head:
        lines.insert(1, "  ".join("-" * x for x in w + [len(head[-1])]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# optional pieces
# ----------------------------------------------------------------------------------------------
#: What lit-liger can use but does not install by default: (distribution, import name, extra, what for).
OPTIONAL = (
    ("liger-kernel", "liger_kernel", "bench", "the liger-kernel peer in `lit-liger bench kernels|step`"),
    ("matplotlib", "matplotlib", "bench", "the PNG charts of `lit-liger bench`"),
    ("deepspeed", "deepspeed", "deepspeed", "DeepSpeed ZeRO-2/3 strategies (Trainer + LigerCallback)"),
    ("bitsandbytes", "bitsandbytes", "qlora", "QLoRA: `lit-liger finetune_lora --quantize bnb.nf4|nf4-dq|fp4|fp4-dq`"),
    ("torchao", "torchao", "fp8", "float8 GEMMs of the Block projections: `--liger.fp8 tensorwise|rowwise|...`"),
)


def _install_line(extra: str) -> str:
    """The pip command that adds ``extra``: from the checkout for an editable install, else from the index."""
    try:
        from importlib.metadata import distribution

        record = json.loads(distribution("lit-liger").read_text("direct_url.json") or "{}")  # PEP 610
        url = record.get("url", "")
        if record.get("dir_info", {}).get("editable") and url.startswith("file://"):
            from urllib.parse import unquote, urlparse

            path = Path(unquote(urlparse(url).path))
            where = "." if path.resolve() == Path.cwd().resolve() else str(path)
            return f'pip install -e "{where}[{extra}]"'
    except Exception:  # not installed, or no PEP 610 record: the index form
        pass
    return f'pip install "lit-liger[{extra}]"'


def optional_pieces() -> list[dict[str, str]]:
    """One row per optional package: installed version or ``missing``, what it is for, the install line."""
    import importlib.util

    rows = []
    for dist, module, extra, what in OPTIONAL:
        present = importlib.util.find_spec(module) is not None
        rows.append({
            "package": dist,
            "status": _version(dist) if present else "missing",
            "for": what,
            "fix": "" if present else _install_line(extra),
        })
    return rows


# ----------------------------------------------------------------------------------------------
# doctor
# ----------------------------------------------------------------------------------------------
def _smoke_cases(device: torch.device) -> dict[str, Callable[[Any], float]]:
    """One small fwd+bwd per kernel against plain PyTorch; each returns the worst relative error."""
    g = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device).requires_grad_(True)

    def compare(run: Callable, ref: Callable, inputs: list[torch.Tensor]) -> float:
        out = run(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        grads_out = [torch.randn(o.shape, generator=g).to(device) for o in outs]
        got = torch.autograd.grad(outs, inputs, grads_out)
        r = ref(*inputs)
        rs = r if isinstance(r, tuple) else (r,)
        want = torch.autograd.grad(rs, inputs, grads_out)
        return max([_rel_err(a, b) for a, b in zip(outs, rs)] + [_rel_err(a, b) for a, b in zip(got, want)])

    def rms(k):
        return compare(
            lambda x, w: k(x, w, 1e-6, 0.0),
            lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
            [rnd(6, 40), rnd(40)],
        )

    def ln(k):
        return compare(
            lambda x, w, b: k(x, w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, (40,), w, b, 1e-5),
            [rnd(6, 40), rnd(40), rnd(40)],
        )

    def rope(k):
        from litgpt.model import apply_rope

        cos, sin = torch.randn(1, 5, 16, generator=g).to(device), torch.randn(1, 5, 16, generator=g).to(device)
        return compare(
            lambda q, kk: k(q, kk, cos, sin),
            lambda q, kk: (apply_rope(q, cos, sin), apply_rope(kk, cos, sin)),
            [rnd(2, 4, 5, 16), rnd(2, 2, 5, 16)],
        )

    def swiglu(k):
        return compare(k, lambda a, b: F.silu(a) * b, [rnd(6, 40), rnd(6, 40)])

    def geglu(k):
        return compare(
            lambda a, b: k(a, b, approximate="tanh"),
            lambda a, b: F.gelu(a, approximate="tanh") * b,
            [rnd(6, 40), rnd(6, 40)],
        )

    def softcap_attention(k):
        from .kernels.attention import reference

        return compare(lambda q, kk, v: k(q, kk, v, 0.5, 5.0), lambda q, kk, v: reference(q, kk, v, 0.5, 5.0),
                       [rnd(2, 4, 20, 16), rnd(2, 2, 20, 16), rnd(2, 2, 20, 16)])

    def flce(k):
        t = torch.randint(0, 50, (12,), generator=g).to(device)
        return compare(lambda x, w: k(x, w, t), lambda x, w: F.cross_entropy(x @ w.t(), t), [rnd(12, 24), rnd(50, 24)])

    return {
        "rms_norm": rms,
        "layer_norm": ln,
        "rope": rope,
        "swiglu": swiglu,
        "geglu": geglu,
        "softcap_attention": softcap_attention,
        "fused_linear_cross_entropy": flce,
    }


def kernel_paths(device: torch.device | str | None = None, run: bool = True) -> list[dict[str, Any]]:
    """For each kernel: the path it takes on ``device`` (``triton``, ``interpreter``, ``reference``
    or ``missing``), why, and -- where Triton runs and ``run`` -- a small fwd+bwd check."""
    device = _resolve_device("auto" if device is None else str(device))
    out: list[dict[str, Any]] = []
    try:
        kernels = importlib.import_module("lit_liger.kernels")
        from .kernels._launch import device_limits, interpret_mode, use_triton
    except Exception as e:  # triton missing or broken: everything is unavailable
        return [
            {"kernel": k, "path": "missing", "why": f"lit_liger.kernels does not import: {e}", "check": ""}
            for k in _KERNELS
        ]

    probe = torch.empty(0, device=device)
    native = use_triton(probe)
    if device.type == "cuda":
        lim = device_limits(device)
        path = "triton"
        why = f"{'ROCm' if lim.is_hip else 'CUDA'} GPU, warp {lim.warp_size}, {lim.sm_count} SMs"
        if not lim.supports_bf16:
            why += f"; bf16 needs sm_80+ (this is sm_{lim.capability[0]}{lim.capability[1]}): use fp16/fp32"
    elif native and interpret_mode():
        path, why = "interpreter", "TRITON_INTERPRET=1: Triton code runs on CPU (correctness only, slow)"
    else:
        path, why = "reference", "no CUDA/ROCm GPU: PyTorch reference math (correct, not faster)"
    cases = _smoke_cases(device)
    for name in _KERNELS:
        fn = getattr(kernels, name, None)
        if fn is None:
            try:
                fn = getattr(importlib.import_module(f"lit_liger.kernels.{name}"), name)
            except Exception as e:
                out.append(
                    {"kernel": name, "path": "missing", "why": f"not in this build ({type(e).__name__})", "check": ""}
                )
                continue
        row = {"kernel": name, "path": path, "why": why, "check": ""}
        if run and native:
            try:
                with _full_fp32_matmuls():
                    err = cases[name](fn)
                row["check"] = f"ok (rel err {err:.1e})" if err <= 1e-4 else f"MISMATCH (rel err {err:.1e})"
            except Exception as e:  # report, do not crash the doctor
                row["check"] = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        out.append(row)
    return out


def doctor(device: str = "auto", run: bool = True) -> list[dict[str, Any]]:
    """Print the device, the versions that matter, and which path each lit-liger kernel takes here.

    Args:
        device: ``cuda``, ``cuda:N``, ``cpu``, or ``auto`` (the GPU when there is one).
        run: Where Triton runs (GPU or interpreter), also run each kernel once, forward and backward,
            on small random inputs against plain PyTorch (fp32).
    """
    dev = _resolve_device(device)
    lines = ["lit-liger doctor", ""]
    info: list[tuple[str, str]] = []
    if dev.type == "cuda":
        from .kernels._launch import device_limits

        lim = device_limits(dev)
        props = torch.cuda.get_device_properties(dev)
        info += [
            ("device", f"{lim.name} ({dev})"),
            ("backend", f"ROCm {torch.version.hip}" if lim.is_hip else f"CUDA {torch.version.cuda}"),
            (
                "compute capability",
                f"{lim.capability[0]}.{lim.capability[1]}"
                + (f" ({props.gcnArchName})" if lim.is_hip and hasattr(props, "gcnArchName") else ""),
            ),
            ("warp size", str(lim.warp_size)),
            ("max threads per block", str(lim.max_threads_per_block)),
            ("multiprocessors", str(lim.sm_count)),
            ("memory", f"{props.total_memory / 2**30:.1f} GiB"),
            (
                "bf16",
                "yes"
                if lim.supports_bf16
                else f"no (sm_{lim.capability[0]}{lim.capability[1]} < sm_80): train in fp16/fp32",
            ),
            ("GPUs visible", str(torch.cuda.device_count())),
        ]
    else:
        from .kernels._launch import interpret_mode

        info += [
            ("device", f"cpu ({platform.processor() or platform.machine()})"),
            (
                "GPU",
                "none visible to torch"
                if not torch.cuda.is_available()
                else f"{torch.cuda.get_device_name(0)} (not selected)",
            ),
            (
                "TRITON_INTERPRET",
                "1 (Triton kernels run in the CPU interpreter)"
                if interpret_mode()
                else "unset (kernels take the reference path)",
            ),
            ("bf16", "n/a on CPU (the reference path computes in the input dtype)"),
        ]
    info += [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("triton", _version("triton")),
        ("lightning", _version("lightning")),
        ("litgpt", _version("litgpt")),
        ("jsonargparse", _version("jsonargparse")),
        ("lit-liger", _version("lit-liger")),
    ]
    lines.append(_table([(k, v) for k, v in info]))
    rows = kernel_paths(dev, run=run)
    lines += ["", "kernels"]
    lines.append(
        _table(
            [(r["kernel"], r["path"], r["check"] or "-", r["why"]) for r in rows],
            head=("kernel", "path here", "check", "why"),
        )
    )
    opt = optional_pieces()
    lines += ["", "optional pieces"]
    lines.append(
        _table(
            [(r["package"], r["status"], r["for"] + (f"; to add it: {r['fix']}" if r["fix"] else "")) for r in opt],
            head=("package", "installed", "used for"),
        )
    )
    if dev.type != "cuda":
        lines += [
            "",
            (
                "The kernels are for CUDA/ROCm GPUs. On CPU, lit-liger is correct but not faster; "
                "TRITON_INTERPRET=1 runs the Triton code on CPU for testing."
            ),
        ]
    print("\n".join(lines))
    return rows


# ----------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------
def check(
    model: str | None = None,
    checkpoint_dir: Path | None = None,
    n_layer: int | None = None,
    device: str = "auto",
    dtype: Literal["float32", "bfloat16", "float16"] = "float32",
    batch_size: int = 2,
    seq_len: int = 64,
    seed: int = 0,
    liger: bool | LigerConfig = True,
    tolerance: float | None = None,
    sliding_window_size: int | None = None,
) -> dict[str, Any]:
    """Parity of a lit-liger-swapped LitGPT model against the untouched one: loss and every gradient.

    Builds the model (random init from a LitGPT config name, or the weights of ``checkpoint_dir``),
    swaps a copy, runs one forward/backward on the same random tokens through both (LitGPT's
    ``chunked_cross_entropy`` on the logits vs lit-liger's fused loss) and prints the swap report,
    the loss difference and the worst relative gradient error. Exits with status 1 above tolerance.

    Args:
        model: A LitGPT config name (``litgpt.Config.from_name``), e.g. ``Llama-3.2-1B``.
        checkpoint_dir: A LitGPT checkpoint (``model_config.yaml`` + ``lit_model.pth``) instead of ``model``.
        n_layer: Keep only this many layers (smaller, faster check of the same layer shapes).
        device: ``cuda``, ``cpu`` or ``auto``. On CPU set ``TRITON_INTERPRET=1`` to check the Triton
            code (else the kernels' reference path is what runs).
        dtype: Parameter and activation dtype of both models.
        batch_size: Sequences in the random batch.
        seq_len: Tokens per sequence.
        seed: Seed of the weights (random init) and tokens.
        liger: Which kernels (as ``--liger`` of the training commands).
        tolerance: Relative error allowed; default per dtype: fp32 1e-4, bf16 2e-2, fp16 1e-2.
        sliding_window_size: Shorten the sliding window of a model that has one (Gemma-2/3, Mistral-7B-v0.1,
            Phi-3 ...) below ``--seq_len``, so that the check exercises the window (at the default
            ``--seq_len`` every real window covers the whole sequence, which is then causal attention).
    """
    from litgpt.model import GPT, Config
    from litgpt.utils import chunked_cross_entropy as litgpt_chunked_cross_entropy

    from . import apply_liger
    from . import chunked_cross_entropy
    from .swap.attend import check_window

    if (model is None) == (checkpoint_dir is None):
        raise ValueError("pass exactly one of --model (a LitGPT config name) and --checkpoint_dir")
    dev, dt = _resolve_device(device), _DTYPES[dtype]
    tol = tolerance if tolerance is not None else TOLERANCE[dt]
    overrides = {"n_layer": n_layer} if n_layer else {}
    if checkpoint_dir is not None:
        config = Config.from_file(Path(checkpoint_dir) / "model_config.yaml", **overrides)
    else:
        config = Config.from_name(model, **overrides)
    if sliding_window_size is not None:
        if config.sliding_window_size is None or not any(config.sliding_window_indices or []):
            raise ValueError(f"--sliding_window_size: {config.name} has no sliding-window layers")
        check_window(sliding_window_size, "--sliding_window_size")
        config.sliding_window_size = sliding_window_size  # read by each attention layer at every call
    if seq_len > config.block_size:
        raise ValueError(f"--seq_len {seq_len} is longer than the model's block_size {config.block_size}")

    torch.manual_seed(seed)
    with torch.device(dev), _default_dtype(dt):  # built in its dtype: no fp32 copy of a large model
        ref = GPT(config)
    note = "random init"
    if checkpoint_dir is not None:
        sd = torch.load(Path(checkpoint_dir) / "lit_model.pth", map_location=dev, mmap=True, weights_only=True)
        sd = sd.get("model", sd)
        missing, unexpected = ref.load_state_dict(sd, strict=False)
        if missing:
            raise ValueError(f"{checkpoint_dir}/lit_model.pth lacks {len(missing)} weights, e.g. {missing[:3]}")
        note = f"weights of {checkpoint_dir}" + (f" (first {config.n_layer} layers)" if unexpected else "")
    ref = ref.to(dt)
    ref.max_seq_length = seq_len  # rope cache for seq_len only
    swapped = copy.deepcopy(ref)
    report = apply_liger(swapped, LigerConfig.from_value(liger))
    print(
        f"lit-liger check: {config.name}, {config.n_layer} layers, {note}, {dtype} on {dev}, "
        f"batch {batch_size} x {seq_len} tokens"
        + (f", sliding window {config.sliding_window_size}" if sliding_window_size is not None else "") + "\n"
    )
    print(report, "\n")

    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=g).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    with _full_fp32_matmuls() if dt == torch.float32 else contextlib.nullcontext():
        loss_ref = litgpt_chunked_cross_entropy(ref(x), y, chunk_size=0)
        loss_ref.backward()
        out = swapped(x)
        loss_liger = chunked_cross_entropy(out, y)
        loss_liger.backward()

    loss_err = _rel_err(loss_liger, loss_ref)
    ref_params = dict(ref.named_parameters())
    errors = []
    for name, p in swapped.named_parameters():
        q = ref_params[name]
        if q.grad is None and p.grad is None:
            continue
        if q.grad is None or p.grad is None:
            errors.append((name, float("inf")))
            continue
        errors.append((name, _rel_err(p.grad, q.grad)))
    errors.sort(key=lambda e: -e[1])
    worst_name, worst = errors[0] if errors else ("-", 0.0)
    ok = loss_err <= tol and worst <= tol
    rows = [
        (
            "loss",
            f"stock {loss_ref.item():.6f}",
            f"lit-liger {loss_liger.item():.6f}",
            f"|diff| {abs(loss_liger.item() - loss_ref.item()):.2e}, rel {loss_err:.2e}",
        ),
        ("gradients", f"{len(errors)} parameters", f"worst rel err {worst:.2e}", worst_name),
    ]
    rows += [("", "", f"{e:.2e}", n) for n, e in errors[1:4]]
    print(_table(rows))
    kernels_ran = "reference path (no GPU, TRITON_INTERPRET unset)" if not _triton_ran(x) else "Triton kernels"
    verdict = "PASS" if ok else "FAIL"
    print(f"\n{verdict}: tolerance {tol:.0e} ({dtype}; see lit_liger.doctor.TOLERANCE for why), {kernels_ran}")
    result = {
        "ok": ok,
        "loss_ref": loss_ref.item(),
        "loss_liger": loss_liger.item(),
        "loss_rel_err": loss_err,
        "worst_grad_rel_err": worst,
        "worst_param": worst_name,
        "tolerance": tol,
        "report": report,
    }
    if not ok:
        raise SystemExit(1)
    return result


def _triton_ran(t: torch.Tensor) -> bool:
    from .kernels._launch import use_triton

    return use_triton(t)
