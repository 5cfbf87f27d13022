"""End-to-end benchmark: one whole LitGPT training step (forward, backward, fused AdamW).

    python -m benchmarks step [--models Llama-3.2-1B,Qwen3-1.7B,gemma-2-2b] [--batch_size 4]
                              [--seq_len 2048] [--max_batch] [--out DIR] [--quick] [--smoke --tiny]
                              [--n_layer 8] [--sliding_window_size 1024]

Random tokens, a LitGPT config by name, the model built in bf16 on the GPU, variants in one run:

* ``eager``             -- stock LitGPT: ``chunked_cross_entropy(model(x), y)`` as ``litgpt pretrain`` does;
* ``lit-liger``         -- ``apply_liger(model)`` then lit-liger's ``chunked_cross_entropy(model(x), y)``
                           (in training the swapped model returns deferred logits the loss consumes);
* ``compile``           -- ``torch.compile(model)``, loss as eager;
* ``lit-liger+compile`` -- ``apply_liger`` then ``torch.compile``;
* ``liger-kernel``      -- liger-kernel 0.8.5 hand-wired into the same LitGPT model where it applies
                           (RMSNorm, SwiGLU/GeGLU, fused linear cross-entropy): the peer.

``--fp8 tensorwise,rowwise`` adds, per torchao float8 recipe R, the float8 variants of issue 35: the Block
projections (attention ``qkv``/``proj``, MLP ``fc_1``/``fc_2``/``proj``) run their GEMMs in float8, the
embedding, norms and lm_head stay in bf16:

* ``fp8-R+compile``           -- stock LitGPT converted by torchao itself (``convert_to_float8_training`` on the
                                 same projections), then ``torch.compile``: what a user gets without lit-liger;
* ``lit-liger+fp8-R``         -- ``apply_liger(model, LigerConfig(fp8=R))``, eager;
* ``lit-liger+fp8-R+compile`` -- the same, then ``torch.compile``.

Each variant starts from a fresh model (same seed, same tokens), warms up (compiles), then times
``--steps`` steps with CUDA events: median / min / max step time, tokens/s, peak memory, MFU and the
loss of step 1 (before any update: every variant must agree with eager).
"""

from __future__ import annotations

from . import _common as C  # noqa: I001 - first: sets TRITON_INTERPRET on CPU before kernels are imported

import argparse
import json
import math
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch

from lit_liger.config import LigerConfig
from lit_liger.doctor import _default_dtype  # the one default-dtype context manager

DEFAULT_MODELS = ("Llama-3.2-1B", "Qwen3-1.7B", "gemma-2-2b")
VARIANTS = ("eager", "lit-liger", "compile", "lit-liger+compile", "liger-kernel")
FP8_RECIPES = tuple(r for r in LigerConfig.choices()["fp8"] if r != "off")  # torchao's recipe names
ANCHOR_VARIANT = {"eager": "eager", "compile": "compile", "liger-kernel": "liger"}
# --tiny: the named config's family (norms, MLP class, softcaps, qk-norm...) at toy size, for CPU smoke runs
TINY = dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=128,
            padded_vocab_size=512, vocab_size=512, block_size=64)
LOSS_RTOL = 1e-2  # step-1 loss of a variant vs eager (bf16 logits vs fp32-accumulated fused loss)


# ----------------------------------------------------------------------------------------------
# Model, data, FLOPs
# ----------------------------------------------------------------------------------------------


def model_config(name: str, *, tiny: bool, seq_len: int, stock: bool, n_layer: int | None = None,
                 sliding_window_size: int | None = None) -> tuple[Any, dict]:
    """The LitGPT config, and the overrides applied to it (recorded in the results).

    ``n_layer``: keep that many layers (a model's shape at reduced depth). ``sliding_window_size``: the
    window of the configs that have one (e.g. Mistral-7B-v0.1's 4096 shortened below its 4096-token
    ``block_size``, so that a sequence is longer than its window); configs without one are left as they are.
    Unless ``--stock_config``: a sliding window at least as long as the sequence is dropped. The
    attention is identical (every key is inside the window), but LitGPT builds that mask with a
    Python loop over T per layer, per step, which dominates an eager gemma-2 step and makes
    ``torch.compile`` unroll T x n_layer assignments."""
    from litgpt import Config

    from lit_liger.swap.attend import check_window

    overrides = dict(TINY) if tiny else {}
    if n_layer is not None:
        if n_layer < 1:
            raise ValueError(f"--n_layer must be >= 1, got {n_layer}")
        overrides["n_layer"] = n_layer
    config = Config.from_name(name, **overrides)
    if sliding_window_size is not None and config.sliding_window_size is not None:
        check_window(sliding_window_size, "--sliding_window_size")
        overrides["sliding_window_size"] = sliding_window_size
        config = Config.from_name(name, **overrides)
    if not stock and config.sliding_window_size is not None and config.sliding_window_size >= seq_len:
        overrides["sliding_window_size"] = None
        config = Config.from_name(name, **overrides)
    if config.block_size < seq_len:
        raise ValueError(f"{name}: seq_len {seq_len} exceeds block_size {config.block_size}")
    return config, overrides


def build_model(config, *, seq_len: int, dtype: torch.dtype, seed: int):
    """GPT built directly on the device in ``dtype``, LitGPT's init (normal(0, 0.02)), rope cache for T."""
    from litgpt.model import GPT

    torch.manual_seed(seed)
    with torch.device(C.device()), _default_dtype(dtype):
        model = GPT(config)
        model.apply(model._init_weights)
        model.max_seq_length = seq_len  # LitGPT's rope cache for this T (fp32, as litgpt builds it)
    model.train()
    return model


def make_batch(config, B: int, T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    tokens = torch.randint(0, config.vocab_size, (B, T + 1), generator=g).to(C.device())
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # input_ids, targets (B, T)


def flops_per_step(config, n_params: int, n_embedding: int, B: int, T: int) -> int:
    """Training FLOPs of one step, PaLM appendix B convention: 6 * (non-embedding params, lm_head
    included) per token + 12 * (n_head * head_size) * context per layer per token for attention, the
    context being T (the causal half not subtracted) or, in a sliding-window layer, min(T, window) (the
    keys such a layer's queries can see, by the same convention). The embedding lookup is not a matmul
    and is left out."""
    window = config.sliding_window_size
    placed = config.sliding_window_indices if window is not None else None
    context = sum(min(T, window) if placed is not None and placed[i] else T for i in range(config.n_layer))
    attn = 12 * config.n_head * config.head_size * context
    return (6 * (n_params - n_embedding) + attn) * B * T


# ----------------------------------------------------------------------------------------------
# liger-kernel hand-wired into LitGPT (the peer; not lit-liger's code)
# ----------------------------------------------------------------------------------------------
def final_hidden_states(model, idx: torch.Tensor) -> torch.Tensor:
    """``GPT.forward`` for training (no KV cache, no mask) stopping before ``lm_head``: (B, T, n_embd)."""
    cfg = model.config
    T = idx.size(1)
    cos = model.cos[:T].unsqueeze(0)  # (1, T, rope_n_elem)
    sin = model.sin[:T].unsqueeze(0)
    x = model.transformer.wte(idx)  # (B, T, n_embd)
    if cfg.scale_embeddings:
        x = x * torch.tensor(cfg.n_embd**0.5, dtype=x.dtype)
    for i, block in enumerate(model.transformer.h):
        if cfg.rope_indices is not None:
            x = block(x, cos[..., cfg.rope_indices[i]], sin[..., cfg.rope_indices[i]], None, None, None)
        else:
            x = block(x, cos, sin, None, None, None)
    return model.transformer.ln_f(x)  # (B, T, n_embd)


def wire_liger_kernel(model) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]:
    """Route LitGPT's RMSNorm, LLaMAMLP/GemmaMLP elementwise and lm_head+loss through liger-kernel,
    choosing its options as liger's own HF patches do for the family. Returns ``loss_fn(x, y)``."""
    from litgpt.model import GemmaMLP, LLaMAMLP, RMSNorm

    ops = C.liger_kernel_module("liger_kernel.ops")
    flce_mod = C.liger_kernel_module("liger_kernel.transformers.fused_linear_cross_entropy")
    cfg = model.config
    # A post-norm's output feeds a residual add, whose backward hands the *same* gradient tensor to
    # both branches: liger's in-place backward (dX written over dY) would corrupt the other one, so
    # those norms run with in_place=False (what liger does for gemma-2); so does a norm whose output
    # is shared by attention and MLP (parallel residual).
    not_in_place = {id(m) for b in model.transformer.h for m in (b.post_attention_norm, b.post_mlp_norm)}
    counts = {"rms_norm": 0, "swiglu": 0, "geglu": 0}
    for m in model.modules():
        if isinstance(m, RMSNorm):
            in_place = id(m) not in not_in_place and not cfg.parallel_residual
            casting = "gemma" if m.add_unit_offset else "llama"  # liger's choice for gemma / llama-likes
            offset = 1.0 if m.add_unit_offset else 0.0

            def rms_forward(self, x, _in_place=in_place, _casting=casting, _offset=offset):
                return ops.LigerRMSNormFunction.apply(x, self.weight, self.eps, _offset, _casting, _in_place)

            m.forward = types.MethodType(rms_forward, m)
            counts["rms_norm"] += 1
        elif isinstance(m, GemmaMLP):
            if cfg.gelu_approximate != "tanh":  # liger's GEGLU is the tanh approximation only
                continue

            def geglu_forward(self, x):
                return self.proj(ops.LigerGELUMulFunction.apply(self.fc_1(x), self.fc_2(x)))

            m.forward = types.MethodType(geglu_forward, m)
            counts["geglu"] += 1
        elif type(m) is LLaMAMLP:

            def swiglu_forward(self, x):
                return self.proj(ops.LigerSiLUMulFunction.apply(self.fc_1(x), self.fc_2(x)))

            m.forward = types.MethodType(swiglu_forward, m)
            counts["swiglu"] += 1
    flce = flce_mod.LigerFusedLinearCrossEntropyLoss(softcap=cfg.final_logit_softcapping)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = final_hidden_states(model, x)  # (B, T, n_embd)
        return flce(model.lm_head.weight, h.reshape(-1, h.size(-1)), y.reshape(-1), model.lm_head.bias)

    notes = ", ".join(f"{k} x{v}" for k, v in counts.items() if v) + ", fused linear cross-entropy (lm_head)"
    return loss_fn, "liger-kernel: " + notes


# ----------------------------------------------------------------------------------------------
# Variants
# ----------------------------------------------------------------------------------------------
def fp8_variants(recipes: list[str]) -> list[str]:
    """The ``--fp8`` variants of these recipes (see the module docstring)."""
    bad = sorted(set(recipes) - set(FP8_RECIPES))
    if bad:
        raise SystemExit(f"unknown --fp8 recipe(s) {bad}; choose from {list(FP8_RECIPES)}")
    return [v for r in recipes for v in (f"fp8-{r}+compile", f"lit-liger+fp8-{r}", f"lit-liger+fp8-{r}+compile")]


def split_variant(variant: str) -> tuple[str, str | None, bool]:
    """``(base, fp8 recipe or None, compiled)``: ``"lit-liger+fp8-rowwise+compile"`` -> ``("lit-liger", "rowwise",
    True)``, ``"fp8-tensorwise+compile"`` -> ``("eager", "tensorwise", True)``, ``"compile"`` -> ``("eager", None,
    True)``."""
    parts = variant.split("+")
    compiled = parts[-1] == "compile"
    if compiled:
        parts = parts[:-1]
    recipe = next((p[len("fp8-"):] for p in parts if p.startswith("fp8-")), None)
    base = [p for p in parts if not p.startswith("fp8-")]
    return (base[0] if base and base[0] else "eager"), recipe, compiled


def _float8_on_stock(model, recipe: str) -> str:
    """torchao's own conversion of the Block projections lit-liger's ``fp8`` converts (``FP8_PROJECTIONS``)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise C.Unavailable(f"skipped: torchao missing ({exc})") from exc
    from lit_liger.swap.fp8 import FP8_PROJECTIONS, fp8_why

    why = fp8_why(recipe)
    if why is not None:
        raise C.Unavailable(f"skipped: {why}")
    names = {f"transformer.h.{i}.{p}" for i in range(len(model.transformer.h)) for p in FP8_PROJECTIONS}
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda m, fqn: fqn in names)
    n = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    return f"torchao convert_to_float8_training({recipe!r}): {n} Block projections in float8"


def make_loss_fn(variant: str, model, liger_config: dict | None = None
                 ) -> tuple[Callable[[torch.Tensor, torch.Tensor], torch.Tensor], str]:
    """``loss_fn(x, y)`` for a variant (modifies ``model`` in place); raises ``C.Unavailable``."""
    from litgpt.utils import chunked_cross_entropy

    base, recipe, compiled = split_variant(variant)
    if variant == "eager":
        return (lambda x, y: chunked_cross_entropy(model(x), y)), ""
    if variant == "compile" or (base == "eager" and recipe is not None):
        notes = _float8_on_stock(model, recipe) if recipe is not None else ""
        fwd = torch.compile(model) if compiled else model
        return (lambda x, y: chunked_cross_entropy(fwd(x), y)), notes
    if base == "lit-liger":
        try:
            from lit_liger import apply_liger
            from lit_liger import chunked_cross_entropy as liger_ce
        except Exception as exc:  # noqa: BLE001 - being written: report, do not stop
            raise C.Unavailable(f"missing: lit_liger.apply_liger ({type(exc).__name__}: {exc})") from exc
        cfg = dict(liger_config or {})  # None: LigerConfig() defaults, everything on
        if recipe is not None:
            cfg["fp8"] = recipe
            from lit_liger.swap.fp8 import fp8_why

            if fp8_why(recipe) is not None:  # lit-liger would run it in bf16: not an fp8 row
                raise C.Unavailable(f"skipped: {fp8_why(recipe)}")
        report = apply_liger(model, cfg or None)
        fwd = torch.compile(model) if compiled else model
        return (lambda x, y: liger_ce(fwd(x), y)), str(report)
    if variant == "liger-kernel":
        return wire_liger_kernel(model)
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def _optimizer(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=C.CUDA)


def train_steps(step: Callable[[], torch.Tensor], n: int) -> list[float]:
    """Milliseconds of each of ``n`` steps (CUDA events; perf_counter on CPU)."""
    if not C.CUDA:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def run_one(config, variant: str, B: int, T: int, opts, *, steps: int, warmup: int) -> dict[str, Any]:
    """Fresh model + optimizer for ``variant`` at micro-batch B: warm up, time ``steps`` steps.
    Raises on failure (OOM included); everything it allocated is gone once it returns or raises."""
    model = build_model(config, seq_len=T, dtype=opts.dtype, seed=opts.seed)
    n_params = sum(p.numel() for p in model.parameters())
    n_embedding = model.transformer.wte.weight.numel()
    loss_fn, notes = make_loss_fn(variant, model, opts.liger_config)
    optimizer = _optimizer(model)
    x, y = make_batch(config, B, T, opts.seed)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    t0 = time.perf_counter()
    first_loss = float(step())  # step 1: the same weights and tokens for every variant
    for _ in range(warmup - 1):
        step()
    C.sync()
    warmup_s = time.perf_counter() - t0
    if C.CUDA:
        torch.cuda.reset_peak_memory_stats()
    times = train_steps(step, steps)
    res = {
        "step_ms": statistics.median(times), "step_ms_min": min(times), "step_ms_max": max(times),
        "loss": first_loss, "warmup_s": warmup_s, "n_params": n_params, "n_embedding_params": n_embedding,
        "notes": notes,
    }
    if C.CUDA:
        # a step replayed as CUDA graphs keeps its activations in the graphs' pool, where nothing is allocated
        # while it replays: counted in the peak (before 2026-11-26d, peak_GiB left it out)
        pool = C.graph_pool_idle_bytes()
        res["peak_allocated_GiB"] = torch.cuda.max_memory_allocated() / C.GiB
        res["graph_pool_GiB"] = pool / C.GiB
        res["peak_GiB"] = (torch.cuda.max_memory_allocated() + pool) / C.GiB
        res["peak_reserved_GiB"] = torch.cuda.max_memory_reserved() / C.GiB
    if getattr(opts, "profile", False):
        res["profile"] = profile_step(loss_fn, optimizer, x, y)
    return res


# Kernel-name patterns -> category, first match wins (lower-case substrings).
PROFILE_CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("lit-liger attention", ("_attn_fwd_kernel", "_attn_delta_kernel", "_attn_dkdv_kernel", "_attn_dq_kernel")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "_mm_", "matmul", "splitk")),
    ("lit-liger triton", ("_rms_fwd_kernel", "_rms_bwd_kernel", "_ln_fwd_kernel", "_ln_bwd_kernel", "_rope_kernel",
                          "_rope_norm_bwd_kernel", "_glu_fwd_kernel", "_glu_bwd_kernel", "_flce_")),
    ("liger-kernel triton", ("liger", "_rms_norm_", "_swiglu_", "_geglu_", "element_mul_kernel")),
    ("inductor triton", ("triton_",)),
    ("copy / cast / fill", ("copy", "cast", "fill", "cat", "index")),
)


def _kernel_category(name: str) -> str:
    low = name.lower()
    if low.startswith("triton_"):  # inductor's kernels (their names may contain an op's, e.g. "lit_liger")
        return "inductor triton"
    for cat, keys in PROFILE_CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other elementwise / reduction"


def profile_step(loss_fn, optimizer, x: torch.Tensor, y: torch.Tensor, n: int = 3) -> dict[str, Any]:
    """Where one step's GPU time and memory go: kernel time per category, the 12 costliest kernels and every
    kernel's (torch.profiler, mean of ``n`` steps), plus memory allocated at the end of forward and its peak."""
    if not C.CUDA:
        return {}
    from torch.profiler import ProfilerActivity, profile

    optimizer.zero_grad(set_to_none=True)
    C.sync()
    torch.cuda.reset_peak_memory_stats()
    loss = loss_fn(x, y)
    C.sync()
    fwd_end, fwd_peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    loss.backward()
    optimizer.step()
    C.sync()
    mem = {"end_of_forward_GiB": fwd_end / C.GiB, "forward_peak_GiB": fwd_peak / C.GiB,
           "step_peak_GiB": torch.cuda.max_memory_allocated() / C.GiB}

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(x, y).backward()
        optimizer.step()

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        C.sync()
    per_kernel = [(e.key, e.device_time_total / n / 1e3, e.count // n) for e in prof.key_averages()
                  if e.device_type.name == "CUDA" and e.device_time_total > 0]
    cats: dict[str, float] = {}
    for name, ms, _ in per_kernel:
        cat = _kernel_category(name)
        cats[cat] = cats.get(cat, 0.0) + ms
    top = sorted(per_kernel, key=lambda t: -t[1])[:12]
    return {"kernel_ms_per_step": sum(cats.values()), "categories_ms": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": k[:120], "ms": ms, "calls": c, "category": _kernel_category(k)}
                            for k, ms, c in top],
            # every kernel (JSON only), to compare two variants' steps kernel by kernel
            "kernels": [[k[:120], round(ms, 4), c] for k, ms, c in sorted(per_kernel, key=lambda t: -t[1])],
            "memory": mem}


def _cleanup() -> None:
    C.free_memory()
    C.reset_compile()


def attempt(config, variant: str, B: int, T: int, opts, **kw) -> tuple[dict | None, str]:
    """run_one, catching failures: (result or None, status). Memory is freed before it returns."""
    res, status = None, "ok"
    try:
        if (split_variant(variant)[2] or variant == "liger-kernel") and not C.CUDA:
            raise C.Unavailable("skipped: no CUDA")
        res = run_one(config, variant, B, T, opts, **kw)
    except C.Unavailable as exc:
        status = str(exc)
    except Exception as exc:  # noqa: BLE001 - OOM or a broken variant: record, free, carry on
        status = C.failure_status(exc)
    _cleanup()  # outside the except blocks: the traceback (and the model it holds) is gone by now
    return res, status


def attempt_isolated(config, variant: str, B: int, T: int, opts, **kw) -> tuple[dict | None, str]:
    """:func:`attempt` in a fresh (spawned) process, the default on CUDA: whatever one variant leaves
    behind (the allocator's cache and fragmentation, a leak, compiled graphs, global hooks) cannot make a
    later variant run out of memory or run differently, and a variant whose process dies (an abort in a
    library) is a row, not the end of the benchmark."""
    return run_isolated(attempt, (config, variant, B, T, opts), kw, getattr(opts, "variant_timeout", None))


def run_isolated(fn, args: tuple, kw: dict, timeout: float | None) -> tuple[dict | None, str]:
    """``fn(*args, **kw)`` (returning ``(result, status)``) in a spawned process. A process that dies is a
    "failed" row; one still running after ``timeout`` seconds (``--variant_timeout``: a compile that does not
    finish, e.g. stock LitGPT's sliding-window mask loop under torch.compile) is killed and becomes a "timeout"
    row, so the benchmark records the bound instead of hanging until the command's own limit."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import os

    ex = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                initializer=_exit_with_parent, initargs=(os.getpid(),))
    try:
        return ex.submit(fn, *args, **kw).result(timeout=timeout)
    except cf.TimeoutError:
        for proc in list(getattr(ex, "_processes", {}).values()):
            proc.kill()
        return None, f"timeout: not finished in {timeout:g} s"
    except cf.process.BrokenProcessPool as exc:
        return None, f"failed: the variant's process died ({exc})"
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _exit_with_parent(parent: int) -> None:
    """In a variant's process: exit as soon as the benchmark's process is gone (killed by a time limit, for
    one), instead of holding the GPU while the next command runs."""
    import os
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _attempt(config, variant: str, B: int, T: int, opts, **kw) -> tuple[dict | None, str]:
    run = attempt_isolated if getattr(opts, "isolate", False) else attempt
    return run(config, variant, B, T, opts, **kw)


def find_max_batch(config, variant: str, T: int, opts) -> dict[str, Any]:
    """Largest micro-batch that runs (doubling, then bisection), with its tokens/s and peak memory."""
    kw = {"steps": opts.max_batch_steps, "warmup": 2}
    good, good_res, bad = 0, None, None
    b = 1
    while b <= opts.max_batch_limit:
        res, status = _attempt(config, variant, b, T, opts, **kw)
        if res is None:
            if status != "OOM":
                return {"max_batch_status": status}
            bad = b
            break
        good, good_res = b, res
        b *= 2
    if bad is not None:
        while bad - good > 1:
            mid = (good + bad) // 2
            res, status = _attempt(config, variant, mid, T, opts, **kw)
            if res is None and status != "OOM":
                return {"max_batch_status": status, "max_batch": good}
            good, good_res, bad = (mid, res, bad) if res is not None else (good, good_res, mid)
    out: dict[str, Any] = {"max_batch": good, "max_batch_status": "ok" if good else "OOM at 1",
                           "max_batch_capped": bad is None}
    if good_res:
        out["max_batch_tok_per_s"] = good * T / (good_res["step_ms"] * 1e-3)
        out["max_batch_peak_GiB"] = good_res.get("peak_GiB")
    return out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
COLUMNS = ["model", "B", "T", "variant", "step ms", "min", "max", "spread %", "tok/s", "x eager tok/s",
           "x compile tok/s", "peak GiB", "x eager mem", "MFU meas", "MFU nominal", "loss@1", "loss vs eager", "max B",
           "tok/s @max B", "anchor tok/s", "status"]


def _table_rows(result: dict) -> list[list[Any]]:
    rows = []
    for r in result["rows"]:
        rows.append([r["model"], r["B"], r["T"], r["variant"], r.get("step_ms"), r.get("step_ms_min"),
                     r.get("step_ms_max"), r.get("spread_pct"), r.get("tok_per_s"), r.get("speedup_vs_eager"),
                     r.get("speedup_vs_compile"), r.get("peak_GiB"), r.get("memory_vs_eager"), r.get("mfu_measured"),
                     r.get("mfu_nominal"), r.get("loss"), r.get("loss_rel_diff_vs_eager"), r.get("max_batch"),
                     r.get("max_batch_tok_per_s"), r.get("anchor_tok_per_s"), r["status"]])
    return rows


def render(result: dict, out_dir: Path) -> list[Path]:
    env, ceil = result["environment"], result["ceilings"]
    md = [
        f"# Training-step benchmark: {env['device']}, {env['date']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, liger-kernel {env['liger_kernel']}, "
        f"lit-liger {env['lit_liger']} ({env.get('lit_liger_commit')}), dtype {result['dtype']}, "
        f"{result.get('settings', {}).get('optimizer', 'AdamW')}"
        + (" — SMOKE RUN (tiny config, not a measurement)" if result.get("smoke") else ""),
        "",
        f"Peak bf16 rate for MFU: measured {C.fmt(ceil.get('bf16_mm_TFLOPs'))} TFLOP/s (8192³ matmul in this run), "
        f"nominal {C.fmt(ceil.get('nominal_bf16_TFLOPs'))} TFLOP/s. FLOPs: 6·(non-embedding params)·tokens + "
        "12·n_layer·n_head·head_size·T·tokens.",
        "",
        "step ms = median of the timed steps (min/max beside it); tok/s = B·T / median; peak GiB = "
        "max_memory_allocated over the timed steps plus what CUDA graphs' pools hold unallocated (a replayed step's "
        "activations; lit-liger's cuda_graphs); loss@1 = loss of the first step (same weights and tokens "
        "for every variant).",
        "",
        C.markdown_table(COLUMNS, _table_rows(result)),
        "",
    ]
    for m, cfg in result.get("models", {}).items():
        if cfg.get("overrides"):
            md.append(f"- {m}: config overrides {cfg['overrides']}")
    profiled = [r for r in result["rows"] if r.get("profile")]
    if profiled:
        md += ["", "## Where the step's GPU time goes (torch.profiler, mean of 3 steps)", "",
               "kernel ms = sum of GPU kernel time per step (gaps between kernels excluded); memory at the end of "
               "forward (loss computed, before backward) vs the step's peak.", ""]
        cats = sorted({c for r in profiled for c in r["profile"]["categories_ms"]})
        cols = ["model", "variant", "step ms", "kernel ms", *cats, "GiB end of fwd", "GiB peak"]
        rows = [[r["model"], r["variant"], r.get("step_ms"), r["profile"]["kernel_ms_per_step"],
                 *[r["profile"]["categories_ms"].get(c) for c in cats],
                 r["profile"]["memory"]["end_of_forward_GiB"], r["profile"]["memory"]["step_peak_GiB"]]
                for r in profiled]
        md += [C.markdown_table(cols, rows), ""]
        for r in profiled:
            md += [f"{r['model']} / {r['variant']}: costliest kernels", "",
                   C.markdown_table(["kernel", "category", "calls", "ms/step"],
                                    [[k["name"], k["category"], k["calls"], k["ms"]]
                                     for k in r["profile"]["top_kernels"]]), ""]
    notes = [(r["model"], r["variant"], r["notes"]) for r in result["rows"] if r.get("notes")]
    if notes:
        md += ["", "## What each variant swapped", ""]
        for model, variant, note in notes:
            md += [f"{model} / {variant}:", "", "```", note, "```", ""]
    path = out_dir / "step.md"
    path.write_text("\n".join(md))
    written = [path]
    tput, mem = {}, {}
    for r in result["rows"]:
        if r["status"] == "ok":
            panel = f"{r['model']} B={r['B']} T={r['T']}"
            tput.setdefault(panel, {})[r["variant"]] = r["tok_per_s"]
            if r.get("peak_GiB") is not None:
                mem.setdefault(panel, {})[r["variant"]] = r["peak_GiB"]
    title = f"{env['device']} — LitGPT training step, {result['dtype']}"
    return written + C.throughput_memory_charts(out_dir, "step", tput, mem, title=title, mem_unit="GiB")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{C.PROG} step", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated LitGPT config names")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--batch_size", type=int, default=None, help="micro-batch B (default 4; smoke 1)")
    p.add_argument("--seq_len", type=int, default=None, help="sequence length T (default 2048; smoke 16)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; quick 5; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps incl. compilation (default 3; smoke 1)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--max_batch", action="store_true", help="also find the largest micro-batch that fits per variant")
    p.add_argument("--max_batch_limit", type=int, default=None, help="stop doubling here (default 256; smoke 4)")
    p.add_argument("--max_batch_steps", type=int, default=3, help="timed steps at each try of --max_batch")
    p.add_argument("--peak_tflops", type=float, default=None, help="nominal bf16 TFLOP/s for MFU (default: by name)")
    p.add_argument("--fp8", default=None,
                   help=f"comma-separated torchao float8 recipes ({','.join(FP8_RECIPES)}): add each one's variants "
                        "fp8-R+compile, lit-liger+fp8-R, lit-liger+fp8-R+compile (see the module docstring), or "
                        "only those of them that --variants names")
    p.add_argument("--liger_config", type=json.loads, default=None,
                   help='lit-liger variants: LigerConfig switches as JSON, e.g. \'{"flce_mode": "lean"}\'')
    p.add_argument("--profile", action="store_true",
                   help="after timing, profile 3 steps per variant: GPU kernel time by category, the costliest "
                        "kernels, memory at the end of forward")
    p.add_argument("--n_layer", type=int, default=None, help="keep this many layers of each model (reduced depth)")
    p.add_argument("--sliding_window_size", type=int, default=None,
                   help="the window of the models that have one (e.g. 1024 for Mistral-7B-v0.1 at T 2048)")
    p.add_argument("--tiny", action="store_true", help=f"shrink each config to a toy size ({TINY})")
    p.add_argument("--stock_config", action="store_true",
                   help="keep a sliding window that covers the whole sequence (see model_config)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: benchmarks/results/<device>-<date>/)")
    p.add_argument("--quick", action="store_true", help="first model only, fewer steps")
    p.add_argument("--smoke", action="store_true", help="harness test: small B/T/steps (use with --tiny on CPU)")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                   help="run each variant (and each --max_batch try) in its own process (default: on with CUDA, "
                        "so no variant inherits another's memory; off on CPU, where the smoke runs are small)")
    p.add_argument("--variant_timeout", type=float, default=None,
                   help="with --isolate: seconds a variant's process may run before it is killed and reported as a "
                        "timeout row (e.g. a torch.compile that does not finish); default: no limit")
    p.add_argument("--anchor", default=None,
                   help="reference JSON to quote (default: newest ../shared/anchors/*.json; 'none' to skip)")
    return p


def main(argv: list[str] | None = None) -> dict:
    opts = build_parser().parse_args(argv)
    models = [m.strip() for m in opts.models.split(",") if m.strip()]
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    fp8 = fp8_variants([r.strip() for r in opts.fp8.split(",") if r.strip()]) if opts.fp8 else []
    bad = sorted(set(variants) - set(VARIANTS) - set(fp8))
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; choose from {list(VARIANTS)} (float8 variants: --fp8)")
    if not set(variants) & set(fp8):  # --variants naming some of them: just those
        variants += fp8
    if "eager" in variants:  # eager first: the others' loss and ratios refer to it
        variants.remove("eager")
        variants.insert(0, "eager")
    if opts.quick:
        models = models[:1]
    B = opts.batch_size or (1 if opts.smoke else 4)
    T = opts.seq_len or (16 if opts.smoke else 2048)
    steps = opts.steps or (2 if opts.smoke else 5 if opts.quick else 10)
    warmup = max(1, opts.warmup or (1 if opts.smoke else 3))
    opts.max_batch_limit = opts.max_batch_limit or (4 if opts.smoke else 256)
    opts.dtype = getattr(torch, opts.dtype)
    if opts.isolate is None:
        opts.isolate = C.CUDA
    if opts.variant_timeout is not None and not opts.isolate:
        raise SystemExit("benchmarks step: --variant_timeout needs --isolate (each variant in its own process, the "
                         "default with CUDA): an in-process variant cannot be stopped")
    out_dir = opts.out or C.default_out_dir(opts.smoke)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_float32_matmul_precision("high")
    anchor, anchor_path = C.load_anchor(opts.anchor)
    anchor_rows = {(e["model"], e["B"], e["T"], e["variant"]): e for e in (anchor or {}).get("e2e", [])}

    env = C.environment()
    print(f"# lit-liger step benchmark on {env['device']} (torch {env['torch']}, liger-kernel {env['liger_kernel']})"
          f" -> {out_dir}", flush=True)
    big = 256 if opts.smoke else 8192
    ceilings = {"bf16_mm_TFLOPs": C.matmul_TFLOPs(big, big, big, smoke=opts.smoke, quick=opts.quick),
                "nominal_bf16_TFLOPs": opts.peak_tflops or C.nominal_bf16_TFLOPs(env["device"])}
    print(f"# bf16 matmul {C.fmt(ceilings['bf16_mm_TFLOPs'])} TFLOP/s measured, "
          f"{C.fmt(ceilings['nominal_bf16_TFLOPs'])} nominal", flush=True)
    result: dict[str, Any] = {
        "kind": "step", "environment": env, "dtype": str(opts.dtype).replace("torch.", ""), "smoke": opts.smoke,
        "quick": opts.quick, "anchor": anchor_path, "ceilings": ceilings, "models": {}, "rows": [], "e2e": [],
        "settings": {"B": B, "T": T, "steps": steps, "warmup": warmup, "seed": opts.seed, "tiny": opts.tiny,
                     "optimizer": "AdamW(fused=True)" if C.CUDA else "AdamW", "max_batch": opts.max_batch,
                     "liger_config": opts.liger_config, "fp8": opts.fp8, "stock_config": opts.stock_config,
                     "profile": opts.profile, "isolate": opts.isolate, "variant_timeout": opts.variant_timeout},
    }
    json_path = out_dir / "step.json"
    print("  ".join(COLUMNS), flush=True)

    for name in models:
        try:
            config, overrides = model_config(name, tiny=opts.tiny, seq_len=T, stock=opts.stock_config,
                                             n_layer=opts.n_layer, sliding_window_size=opts.sliding_window_size)
        except Exception as exc:  # noqa: BLE001 - an unknown name: record and go on
            result["rows"].append({"model": name, "B": B, "T": T, "variant": "-", "status": C.failure_status(exc)})
            continue
        result["models"][name] = {"overrides": overrides, "n_layer": config.n_layer, "n_embd": config.n_embd,
                                  "vocab": config.padded_vocab_size}
        eager_row = compile_row = None
        for variant in variants:
            row: dict[str, Any] = {"model": name, "B": B, "T": T, "variant": variant}
            res, row["status"] = _attempt(config, variant, B, T, opts, steps=steps, warmup=warmup)
            if C.CUDA and not opts.isolate:  # what the variant left behind after its cleanup (in one process)
                row["left_allocated_GiB"] = torch.cuda.memory_allocated() / C.GiB
                if row["left_allocated_GiB"] > 0.5:
                    print(f"# {name} {variant}: {row['left_allocated_GiB']:.2f} GiB still allocated after cleanup",
                          flush=True)
            if res:
                row.update(res)
                row["tok_per_s"] = B * T / (res["step_ms"] * 1e-3)
                row["spread_pct"] = 100 * (res["step_ms_max"] - res["step_ms_min"]) / res["step_ms"]
                flops = flops_per_step(config, res["n_params"], res["n_embedding_params"], B, T)
                row["flops_per_step"] = flops
                row["TFLOPs"] = flops / (res["step_ms"] * 1e-3) / 1e12
                for k, peak in (("mfu_measured", ceilings["bf16_mm_TFLOPs"]),
                                ("mfu_nominal", ceilings["nominal_bf16_TFLOPs"])):
                    row[k] = row["TFLOPs"] / peak if peak and C.CUDA else None
                if variant == "compile":
                    compile_row = row
                elif compile_row is not None:  # (the float8 targets of issue 35 are against bf16 compile)
                    row["speedup_vs_compile"] = row["tok_per_s"] / compile_row["tok_per_s"]
                if variant == "eager":
                    eager_row = row
                elif eager_row is not None:
                    row["speedup_vs_eager"] = row["tok_per_s"] / eager_row["tok_per_s"]
                    if row.get("peak_GiB") and eager_row.get("peak_GiB"):
                        row["memory_vs_eager"] = row["peak_GiB"] / eager_row["peak_GiB"]
                    diff = abs(row["loss"] - eager_row["loss"]) / max(abs(eager_row["loss"]), 1e-12)
                    row["loss_rel_diff_vs_eager"] = diff
                    if not math.isfinite(row["loss"]) or diff > LOSS_RTOL:
                        row["status"] = f"LOSS MISMATCH ({row['loss']:.4f} vs eager {eager_row['loss']:.4f})"
                ref = anchor_rows.get((name, B, T, ANCHOR_VARIANT.get(variant, "")))
                if ref:
                    row["anchor_tok_per_s"], row["anchor_step_ms"] = ref.get("tok_per_s"), ref.get("step_ms")
                    row["anchor_peak_GiB"] = ref.get("peak_GiB")
                result["e2e"].append({k: row.get(k) for k in ("model", "B", "T", "variant", "step_ms", "tok_per_s",
                                                              "peak_GiB", "loss")})
            if opts.max_batch and res is not None:
                row.update(find_max_batch(config, variant, T, opts))
            result["rows"].append(row)
            C.write_json(json_path, result)  # after every variant: a run cut short keeps its numbers
            print("  ".join(C.fmt(v) for v in _table_rows({"rows": [row]})[0]), flush=True)

    print()
    print(C.text_table(COLUMNS, _table_rows(result)))
    C.write_json(json_path, result)
    written = [json_path] + render(result, out_dir)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
