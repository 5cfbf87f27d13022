"""A LoRA layer's backward after its dropout (its mask kept as bits) on the GPU: ``dh @ lora_A`` formed inside the
dropout's backward pass (``kernels.dropout.dropped_from_bits(..., lora=(dh, lora_A))``, ``_dropped_dh_kernel``)
against the GEMM and the pass that reads its output back, each followed by ``lora_A``'s gradient GEMM as in
``lit_liger.swap.lora``; at the shapes of gemma2-2b's shipped LoRA recipe (~500 and ~1,000 token slots; inputs
2,304 / 2,048 / 9,216 wide, ``n·r`` 24 or 8), the 1B headline recipe (q and v: ``n·r`` 16) and, with ``--long``, a
long document (262,144 tokens of Llama-3.1-8B); CUDA-graph timed, with a sweep of the kernel's tiles, each result
checked against the GEMM path. Writes ``dropped_lora.json``.

    python -m benchmarks diag dropped-lora --out DIR [--long]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from lit_liger.kernels import dropout as D
from lit_liger.kernels._launch import cdiv, dropped_tile_plan
from lit_liger.kernels.swiglu import ACTIVATIONS
from .attn_sweep import graph_median_ms

SHAPES = [  # (what, rows, columns, n·r, GLU source)
    ("gemma2 qkv B2", 500, 2304, 24, False), ("gemma2 proj B2", 500, 2048, 8, False),
    ("gemma2 fc B2", 500, 2304, 8, False), ("gemma2 mlp.proj B2", 500, 9216, 8, True),
    ("gemma2 qkv B4", 1000, 2304, 24, False), ("gemma2 mlp.proj B4", 1000, 9216, 8, True),
    ("1B qkv B4", 2000, 2048, 16, False), ("8B qkv 262k", 262144, 4096, 16, False),
]
TILES = [(16, 128, 4), (32, 128, 4), (32, 256, 4), (64, 128, 4), (64, 64, 4), (32, 128, 8)]


def _gemm_path(bits, scale, dh, lora_a, x, glu, dx):
    xd = D.dropped_from_bits(bits, scale, x=x, glu=glu, dx=dx, dxd=dh @ lora_a)
    return dh.t() @ xd


def _in_pass(bits, scale, dh, lora_a, x, glu, dx, tile=None):
    if tile is None:
        xd = D.dropped_from_bits(bits, scale, x=x, glu=glu, dx=dx, lora=(dh, lora_a))
    else:  # the kernel at another tile (the wrapper's checks done by the default run)
        bm, bc, warps = tile
        src = x if x is not None else glu[0]
        xd = torch.empty_like(src)
        D._dropped_dh_kernel[(cdiv(src.shape[0], bm), cdiv(src.shape[1], bc))](
            dx, dh, lora_a, bits, src, src if glu is None else glu[0], src if glu is None else glu[1], xd,
            src.shape[0], src.shape[1], float(scale), R=dh.shape[1], WRITE_XD=True, GLU=glu is not None,
            ACTIVATION=ACTIVATIONS[glu[2] if glu else "silu"], BM=bm, BC=bc, num_warps=warps)
    return dh.t() @ xd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--long", action="store_true", help="also the 262k-token shape")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "plan": dropped_tile_plan(torch.device("cuda")), "rows": []}
    dt, scale = torch.bfloat16, 1 / 0.9
    for what, N, C, R, glu in SHAPES:
        if N > 100_000 and not a.long:
            continue
        torch.manual_seed(0)
        x = torch.randn(N, C, device="cuda", dtype=dt)
        g = (x, torch.randn(N, C, device="cuda", dtype=dt), "gelu_tanh") if glu else None
        xs = None if glu else x
        bits = D.pack_kept(torch.rand(N, C, device="cuda") < 0.9)
        dh = torch.randn(N, R, device="cuda", dtype=dt) / 8
        lora_a = torch.randn(R, C, device="cuda", dtype=dt) / 8
        dx0 = torch.randn(N, C, device="cuda", dtype=dt)
        dx_ref, dx = dx0.clone(), dx0.clone()
        da_ref = _gemm_path(bits, scale, dh, lora_a, xs, g, dx_ref)
        da = _in_pass(bits, scale, dh, lora_a, xs, g, dx)

        def err(u, v):
            return ((u.float() - v.float()).norm() / v.float().norm()).item()

        row = {"what": what, "rows": N, "cols": C, "n_r": R, "da_equal": torch.equal(da, da_ref),
               "dx_rel_err": err(dx, dx_ref),
               # every timing includes one clone of dx (the pass writes it in place)
               "clone_us": round(graph_median_ms(lambda: dx0.clone(), a.n) * 1e3, 2),
               "gemm_path_us": round(graph_median_ms(lambda: _gemm_path(bits, scale, dh, lora_a, xs, g, dx0.clone()),
                                                     a.n) * 1e3, 2),
               "in_pass_us": round(graph_median_ms(lambda: _in_pass(bits, scale, dh, lora_a, xs, g, dx0.clone()),
                                                   a.n) * 1e3, 2)}
        sweep = {}
        for tile in TILES:
            sweep["x".join(map(str, tile))] = round(graph_median_ms(
                lambda: _in_pass(bits, scale, dh, lora_a, xs, g, dx0.clone(), tile), a.n) * 1e3, 2)
        row["tiles_us"] = sweep
        row["best_tile"] = min(sweep, key=sweep.get)
        res["rows"].append(row)
        print(row, flush=True)
    (out / "dropped_lora.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
