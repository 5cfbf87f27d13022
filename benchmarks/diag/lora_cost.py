"""What a recipe's LoRA layers cost a training iteration on the GPU, per variant of the model or of lit-liger's LoRA
code, all in one process (issue 66).

usage: python -m benchmarks diag lora-cost [OUT.json]
       (env: VARIANTS=recipe,nodrop,one-stream,...  MODEL=gemma-2-2b  LAYERS=26  B=2  T=256  ITERS=40  ROUNDS=2,
        TRACE_DIR=DIR TRACE=recipe,...: a torch.profiler trace of 3 iterations of those variants, once each)

gemma2-2b's shipped LoRA recipe (every projection and the head, r 8, alpha 16, dropout 0.1) runs at ~500 rows a
micro-batch, where the frozen GEMMs fill a fraction of the GPU and each LoRA layer adds ~10 small kernels. A profile of
the CLI run cannot say which of them are on the critical path (the branch runs on a second stream beside the frozen
GEMM, and CUPTI slows the graphs' launches). This builds the recipe's model with lit-liger's CUDA graphs (``B`` x ``T``
random tokens, fixed shape), and times, with CUDA events, whole iterations (forward, litgpt's chunked loss through
lit-liger's fused loss, backward; no optimizer), each captured graph replayed alone, and an iteration's sections
(forward call, loss, backward: GPU time between CUDA events and the host's time in each), for each variant:

* ``recipe``: the recipe as shipped;

or the recipe with ``+``-separated changes (``llt+bcarve16``):

* ``nodrop``: LoRA dropout 0 (what the dropout's draw, bits and backward pass cost on the critical path);
* ``nohead``: no LoRA on the head (what the head's LoRA costs the fused loss);
* ``one-stream``: the LoRA branch on the capturing stream (``lora._branch_stream`` off);
* ``no-postfuse``: Gemma-2's post-norms as separate kernels (a norm, then the add, or the add and the next norm:
  ``kernels.rms_norm.rms_norm_add`` not used, ``Block._liger_post_rms`` false);
* ``lt``: cuBLASLt preferred for every GEMM (``torch.backends.cuda.preferred_blas_library``: the path where PyTorch
  applies an SM carveout; cuBLAS's own path ignores it); ``llt`` / ``flt`` / ``blt``: only while the LoRA layers'
  forward and backward / forward / backward run (``_LoRAFn``);
* ``no-carve``: the LoRA layers' frozen input-gradient GEMMs without the SM carveout lit-liger gives them while
  captured (``kernels._launch.LORA_BRANCH_MAX_ROWS`` 0);
* ``carveN``: every cuBLASLt GEMM leaves N SMs free (``torch._C._set_sm_carveout_experimental``), for the LoRA
  branch's kernels beside the frozen GEMM; ``lcarveN`` / ``fcarveN`` / ``bcarveN``: only while the LoRA layers'
  forward and backward / forward / backward run.

The variants run in turns (``ROUNDS`` rounds, a fresh model each time) and the table gives each one's median.
Prints a table and writes the rows to OUT.json.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys

import torch


@contextlib.contextmanager
def _settings(lt: bool, carve: int | None):
    """cuBLASLt preferred (``lt``) and ``carve`` SMs left free by cuBLASLt's GEMMs, for the body."""
    blas, old = torch.backends.cuda.preferred_blas_library(), torch._C._get_sm_carveout_experimental()
    if lt:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    if carve is not None:
        torch._C._set_sm_carveout_experimental(carve)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(blas)
        torch._C._set_sm_carveout_experimental(old)


@contextlib.contextmanager
def _variant(name: str):
    """The variant's settings: ``+``-separated tokens (see the module's docstring)."""
    from lit_liger.kernels import _launch
    from lit_liger.swap import block, lora

    saved = (lora._branch_stream, lora._LoRAFn.forward, lora._LoRAFn.backward)
    post_rms = block._BlockMixin._liger_post_rms
    knobs = [(_launch, "LORA_BRANCH_MAX_ROWS", 0, "no-carve")]
    kept = [(obj, key, getattr(obj, key)) for obj, key, _, _ in knobs]
    tokens = set(name.split("+"))
    for obj, key, value, token in knobs:
        if token in tokens:
            setattr(obj, key, value)
    whole = {"lt": "lt" in tokens, "carve": None}
    fn_set = {"forward": [False, None], "backward": [False, None]}  # LoRA layers' forward / backward: (lt, carve)
    for t in tokens:
        if t == "one-stream":
            lora._branch_stream = lambda x: None
        elif t == "no-postfuse":
            block._BlockMixin._liger_post_rms = lambda self, norm: False
        elif t.startswith("carve"):
            whole["carve"] = int(t[5:])
        elif t in ("llt", "flt", "blt"):  # cuBLASLt in the LoRA layers' forward and backward / forward / backward
            for d in ("forward", "backward"):
                fn_set[d][0] |= t == "llt" or t[0] == d[0]
        elif t.startswith(("lcarve", "fcarve", "bcarve")):
            for d in ("forward", "backward"):
                if t[0] == "l" or t[0] == d[0]:
                    fn_set[d][1] = int(t[6:])

    def wrapped(fn, lt, carve):
        def call(*args, **kwargs):
            with _settings(lt, carve):
                return fn(*args, **kwargs)
        return staticmethod(call)

    if fn_set["forward"] != [False, None]:
        lora._LoRAFn.forward = wrapped(saved[1], *fn_set["forward"])
    if fn_set["backward"] != [False, None]:
        lora._LoRAFn.backward = wrapped(saved[2], *fn_set["backward"])
    try:
        with _settings(whole["lt"], whole["carve"]):
            yield
    finally:
        for obj, key, value in kept:
            setattr(obj, key, value)
        lora._branch_stream = saved[0]
        block._BlockMixin._liger_post_rms = post_rms
        lora._LoRAFn.forward, lora._LoRAFn.backward = staticmethod(saved[1]), staticmethod(saved[2])


def _model(name: str, model_name: str, layers: int, T: int):
    from ._common import gemma2_recipe_model

    tokens = name.split("+")
    cfg, model = gemma2_recipe_model(model_name, layers, dropout=0.0 if "nodrop" in tokens else 0.1,
                                     head="nohead" not in tokens, block_size=max(T, 512))
    return model, cfg


def _step(model, x):
    from lit_liger import chunked_cross_entropy

    out = model(x, lm_head_chunk_size=128)
    out[-1] = out[-1][..., :-1, :]
    chunked_cross_entropy(out, x[..., 1:]).backward()


def _events_ms(fn, n: int) -> float:
    """The median GPU milliseconds of ``fn()`` over ``n`` calls, each between two CUDA events."""
    from ._common import cuda_median_ms

    return cuda_median_ms(fn, n, warmup=0)


_TRACED: dict[str, bool] = {}


def _sections(model, xs, iters: int) -> dict:
    """Median GPU and host milliseconds of an iteration's sections: the model's forward call (the forward graph),
    the loss (``chunked_cross_entropy``: lit-liger's fused loss, eager), the backward (the backward graphs and the
    eager ops around them). GPU: CUDA events recorded between the sections on the current stream (they include the
    GPU's idle time where the host is late); host: the time the host spent in each call."""
    import time

    from lit_liger import chunked_cross_entropy

    gpu = {k: [] for k in ("fwd", "loss", "bwd")}
    host = {k: [] for k in ("fwd", "loss", "bwd")}
    for i in range(iters):
        x = xs[i % 4]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        t = [time.perf_counter()]
        ev[0].record()
        out = model(x, lm_head_chunk_size=128)
        ev[1].record()
        t.append(time.perf_counter())
        out[-1] = out[-1][..., :-1, :]
        loss = chunked_cross_entropy(out, x[..., 1:])
        ev[2].record()
        t.append(time.perf_counter())
        loss.backward()
        ev[3].record()
        t.append(time.perf_counter())
        ev[3].synchronize()
        for j, k in enumerate(("fwd", "loss", "bwd")):
            gpu[k].append(ev[j].elapsed_time(ev[j + 1]))
            host[k].append((t[j + 1] - t[j]) * 1e3)
    out = {}
    for k in gpu:
        out[f"gpu_{k}_ms"] = statistics.median(gpu[k])
        out[f"host_{k}_ms"] = statistics.median(host[k])
    return out


def _trace(model, xs, path: str) -> None:
    """A torch.profiler trace (CUDA kernels and the host's calls) of 3 iterations, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(2):
        _step(model, xs[i % 4])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            _step(model, xs[i % 4])
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)


def measure(name: str, model_name: str, layers: int, B: int, T: int, iters: int) -> dict:
    from lit_liger.runtime.graphs import runner_for

    with _variant(name):
        model, cfg = _model(name, model_name, layers, T)
        g = torch.Generator(device="cuda").manual_seed(1)
        xs = [torch.randint(0, min(cfg.vocab_size, 8192), (B, T), device="cuda", generator=g) for _ in range(4)]
        for i in range(8):  # warm-up: the eager steps, the captures
            _step(model, xs[i % 4])
        torch.cuda.synchronize()
        it = [0]

        def one():
            _step(model, xs[it[0] % 4])
            it[0] += 1

        row = {"variant": name, "model": model_name, "layers": layers, "B": B, "T": T,
               "iter_ms": _events_ms(one, iters)}
        row.update(_sections(model, xs, iters))
        trace = os.environ.get("TRACE_DIR")
        if trace and name in os.environ.get("TRACE", "recipe").split(",") and not _TRACED.get(name):
            _TRACED[name] = True
            _trace(model, xs, os.path.join(trace, f"trace-{name}.json"))
        graphs = list(runner_for(model).graphs.values())
        if graphs:
            gr = graphs[0]
            row["fwd_graph_ms"] = _events_ms(gr.fwd.replay, iters)
            row["bwd_graph_ms"] = sum(_events_ms(b.replay, iters) for b in gr.bwds)
        row["tok_s"] = B * T / row["iter_ms"] * 1e3
    for p in model.parameters():
        p.grad = None
    model = xs = None  # (freed before the next variant's model)
    torch.cuda.empty_cache()
    return row


def main(argv: list[str]) -> None:
    out = argv[0] if argv else None
    variants = os.environ.get("VARIANTS", "recipe,nodrop,nohead,one-stream").split(",")
    model_name = os.environ.get("MODEL", "gemma-2-2b")
    layers, B, T = int(os.environ.get("LAYERS", "26")), int(os.environ.get("B", "2")), int(os.environ.get("T", "256"))
    iters, rounds = int(os.environ.get("ITERS", "40")), int(os.environ.get("ROUNDS", "2"))
    rows = []
    for r in range(rounds):
        for v in variants:
            row = measure(v, model_name, layers, B, T, iters)
            row["round"] = r
            rows.append(row)
            print(f"round {r} {v:12s} iter {row['iter_ms']:.3f} ms  fwd graph {row.get('fwd_graph_ms', 0):.3f}  "
                  f"bwd graphs {row.get('bwd_graph_ms', 0):.3f}  {row['tok_s']:.0f} tok/s; sections GPU / host ms: "
                  + ", ".join(f"{k} {row[f'gpu_{k}_ms']:.3f} / {row[f'host_{k}_ms']:.3f}" for k in ("fwd", "loss", "bwd")),
                  flush=True)
    print(f"\n{'variant':12s} {'iter ms':>8s} {'fwd ms':>7s} {'bwd ms':>7s} {'rest ms':>8s} {'vs recipe':>9s}")
    base = None
    for v in variants:
        mine = [r for r in rows if r["variant"] == v]
        med = {k: statistics.median(r.get(k, 0.0) for r in mine) for k in ("iter_ms", "fwd_graph_ms", "bwd_graph_ms")}
        base = med["iter_ms"] if v == variants[0] else base
        rest = med["iter_ms"] - med["fwd_graph_ms"] - med["bwd_graph_ms"]
        print(f"{v:12s} {med['iter_ms']:8.3f} {med['fwd_graph_ms']:7.3f} {med['bwd_graph_ms']:7.3f} {rest:8.3f} "
              f"{med['iter_ms'] / base:9.3f}")
    if out:
        with open(out, "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
