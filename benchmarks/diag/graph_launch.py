"""What one CUDA graph launch costs the host, per node and per kind of node (issue 66).

usage: python -m benchmarks diag graph-launch [OUT.json]   (env: NODES=256,1024, REPS=30, KINDS=..., LAYERS=26)

gemma2-2b's recipe replays two graphs an iteration (~950 and ~1,300 nodes) and its profile put 1.2-5.6 ms of host
time in each ``cudaGraphLaunch``, the GPU idle until the call returned (h200-2026-12-03e l4). This captures graphs of
``NODES`` nodes of one kind each and times ``replay()`` on the host (perf_counter around the call), the GPU idle before
it (synchronized) and the GPU busy (a sleep kernel queued ahead), the median of ``REPS``:

* ``aten``: an elementwise aten kernel per node (``cudaLaunchKernel`` at capture);
* ``triton``: a one-line Triton kernel per node (``cuLaunchKernelEx``);
* ``aten+memcpy``: as ``aten`` with every 8th node a device-to-device copy (a memcpy node);
* ``aten+memset``: as ``aten`` with every 8th node a 4-byte ``cudaMemsetAsync`` (a memset node; cuBLAS issues such);
* ``two-streams``: as ``aten`` forked onto a second stream and joined every 16 nodes (a graph that is not a line);
* ``gemm``: small bf16 matrix products (cuBLAS, whatever nodes it records);
* ``gemm-recipe``: bf16 products at gemma2-2b's recipe shapes (512 rows; the projections' widths, forward and the
  input's gradient), cuBLAS's own choice of kernels;
* ``dropout``: ``torch.native_dropout`` at (512, 2304) (PyTorch's generator, graph-safe);
* ``rms-norm``: lit-liger's Triton RMSNorm forward at (512, 2304);
* ``real:NAME``: lit-liger's own graphs of a LoRA model as gemma2-2b's recipe trains it (every projection and the
  head, r 8, dropout 0.1; ``LAYERS`` layers, micro-batch 2 x 256 tokens), each graph's replay timed (its node count
  unknown: ``nodes`` is 0), for NAME ``gemma`` (gemma-2-2b), ``gemma-nodrop`` (dropout 0), ``llama``
  (Llama-3.2-1B's widths).

Prints a table and writes the rows (host µs per launch and per node) to OUT.json.
"""
from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _bump(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def _cudart():
    """libcudart's ``cudaMemsetAsync``, from the library this torch loaded, or None."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = lib.cudaMemsetAsync
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        return fn
    return None


def _body(kind: str, nodes: int, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
          side: torch.cuda.Stream, memset) -> None:
    cur = torch.cuda.current_stream()
    i = 0
    while i < nodes:
        if kind == "triton":
            _bump[(1,)](x, x.numel(), BLOCK=1024)
        elif kind == "gemm":
            torch.mm(a, b, out=y.view(a.shape[0], b.shape[1]))
        elif kind == "gemm-recipe":
            w = _RECIPE_W[i % len(_RECIPE_W)]
            if (i // len(_RECIPE_W)) % 2 == 0:
                torch.nn.functional.linear(_RECIPE_X[w.shape[1]], w)
            else:
                torch.mm(_RECIPE_X[w.shape[0]], w)
        elif kind == "dropout":
            torch.native_dropout(_RECIPE_X[2304], 0.1, True)
        elif kind == "rms-norm":
            from lit_liger.kernels.rms_norm import rms_norm

            rms_norm(_RECIPE_X[2304], _RECIPE_NORM_W)
        elif kind == "aten+memcpy" and i % 8 == 7:
            y.copy_(x)
        elif kind == "aten+memset" and i % 8 == 7:
            rc = memset(ctypes.c_void_p(y.data_ptr()), 0, 4, ctypes.c_void_p(cur.cuda_stream))
            assert rc == 0, f"cudaMemsetAsync returned {rc}"
        elif kind == "two-streams" and i % 16 == 0:
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                for _ in range(8):
                    x.add_(1.0)
            for _ in range(7):
                y.add_(1.0)
            cur.wait_stream(side)
            i += 15
        else:
            x.add_(1.0)
        i += 1


_RECIPE_W: list[torch.Tensor] = []
_RECIPE_X: dict[int, torch.Tensor] = {}
_RECIPE_NORM_W: torch.Tensor | None = None


def _recipe_tensors() -> None:
    global _RECIPE_NORM_W
    if _RECIPE_W:
        return
    for out_f, in_f in ((4096, 2304), (2304, 2048), (9216, 2304), (9216, 2304), (2304, 9216)):
        _RECIPE_W.append(torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.02)
    for width in (2048, 2304, 4096, 9216):
        _RECIPE_X[width] = torch.randn(512, width, device="cuda", dtype=torch.bfloat16)
    _RECIPE_NORM_W = torch.ones(2304, device="cuda", dtype=torch.bfloat16)


def _time_replays(graph: torch.cuda.CUDAGraph, reps: int) -> tuple[float, float]:
    """Median host seconds of ``graph.replay()``, the GPU idle before it and the GPU busy (a sleep queued ahead)."""
    idle, busy = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        idle.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # (~10 ms of queued GPU work ahead of the launch)
        t0 = time.perf_counter()
        graph.replay()
        busy.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return statistics.median(idle), statistics.median(busy)


def measure_real(name: str, reps: int) -> list[dict]:
    """Each of lit-liger's captured graphs of a recipe-like LoRA model (see the module's docstring), replay timed."""
    from lit_liger import chunked_cross_entropy
    from lit_liger.runtime.graphs import runner_for

    from ._common import gemma2_recipe_model

    model_name = {"gemma": "gemma-2-2b", "gemma-nodrop": "gemma-2-2b", "llama": "Llama-3.2-1B"}[name]
    cfg, model = gemma2_recipe_model(model_name, int(os.environ.get("LAYERS", "26")),
                                     dropout=0.0 if name == "gemma-nodrop" else 0.1)
    for _ in range(4):
        x = torch.randint(0, cfg.vocab_size, (2, 256), device="cuda")
        out = model(x, lm_head_chunk_size=128)
        out[-1] = out[-1][..., :-1, :]
        chunked_cross_entropy(out, x[..., 1:]).backward()
    torch.cuda.synchronize()
    rows = []
    for key, graphs in runner_for(model).graphs.items():
        for label, graph in [("fwd", graphs.fwd)] + [(f"bwd{j}", g) for j, g in enumerate(graphs.bwds)]:
            t_idle, t_busy = _time_replays(graph, reps)
            rows.append({"kind": f"real:{name}:{label}", "nodes": 0, "host_us_idle": t_idle * 1e6,
                         "host_us_busy": t_busy * 1e6, "us_per_node_idle": None, "us_per_node_busy": None})
    del model
    torch.cuda.empty_cache()
    return rows


def measure(kind: str, nodes: int, reps: int, memset) -> dict:
    x = torch.zeros(1024, device="cuda")
    y = torch.zeros(1024, device="cuda")
    a = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros(16 * 64, device="cuda", dtype=torch.bfloat16) if kind == "gemm" else y
    if kind in ("gemm-recipe", "dropout", "rms-norm"):
        _recipe_tensors()
    side = torch.cuda.Stream()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):  # (warm-up: Triton compiles, cuBLAS picks its kernels)
        _body(kind, min(nodes, 32), x, y, a, b, side, memset)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        _body(kind, nodes, x, y, a, b, side, memset)
    torch.cuda.synchronize()
    graph.replay()  # (the first launch uploads the graph)
    torch.cuda.synchronize()
    t_idle, t_busy = _time_replays(graph, reps)
    row = {"kind": kind, "nodes": nodes, "host_us_idle": t_idle * 1e6, "host_us_busy": t_busy * 1e6}
    row["us_per_node_idle"] = row["host_us_idle"] / nodes
    row["us_per_node_busy"] = row["host_us_busy"] / nodes
    return row


def main(argv: list[str]) -> None:
    out = argv[0] if argv else None
    nodes_list = [int(n) for n in os.environ.get("NODES", "256,1024").split(",")]
    reps = int(os.environ.get("REPS", "30"))
    memset = _cudart()
    kinds = os.environ.get("KINDS", "aten,triton,aten+memcpy,aten+memset,two-streams,gemm,gemm-recipe,dropout,"
                                    "rms-norm,real:gemma,real:gemma-nodrop,real:llama").split(",")
    rows = []
    print(f"{'kind':<14} {'nodes':>6} {'idle us':>9} {'busy us':>9} {'us/node idle':>13} {'us/node busy':>13}")
    for kind in kinds:
        if kind.startswith("real:"):
            for row in measure_real(kind.split(":", 1)[1], reps):
                rows.append(row)
                print(f"{row['kind']:<14} {'?':>6} {row['host_us_idle']:>9.0f} {row['host_us_busy']:>9.0f}", flush=True)
            continue
        if kind == "aten+memset" and memset is None:
            print(f"{kind:<14} skipped: no libcudart to call cudaMemsetAsync")
            continue
        for nodes in nodes_list:
            row = measure(kind, nodes, reps, memset)
            rows.append(row)
            print(f"{kind:<14} {nodes:>6} {row['host_us_idle']:>9.0f} {row['host_us_busy']:>9.0f} "
                  f"{row['us_per_node_idle']:>13.3f} {row['us_per_node_busy']:>13.3f}", flush=True)
    from lit_liger.runtime.graphs import _driver_version

    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__, "driver": _driver_version()}
    if out:
        with open(out, "w") as f:
            json.dump({"env": env, "rows": rows, "command": " ".join(sys.argv)}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
