"""A LoRA layer's backward after its dropout (its mask kept as bits) on the GPU: ``kernels.dropout.dropped_lora_grads``
(one pass: ``dx += (dh @ lora_A) * kept * scale`` and ``lora_A``'s gradient) against the three launches it replaces
(``dh @ lora_A``, ``dropped_from_bits`` writing ``dropout(x)``, ``dhᵀ @ dropout(x)``), at the shapes of gemma2-2b's
shipped LoRA recipe (~500 and ~1,000 token slots; inputs 2,304 / 2,048 / 9,216 wide, ``n·r`` 24 or 8), the 1B
headline recipe (q and v: ``n·r`` 16) and a long document (262,144 tokens of Llama-3.1-8B), CUDA-graph timed; the
plan's launch and a sweep of column blocks and row splits, each result checked against the three steps.
Writes ``dropped_lora.json``.

    python -m benchmarks diag dropped-lora --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from lit_liger.kernels import dropout as D
from lit_liger.kernels._launch import dropped_lora_plan
from .attn_sweep import graph_median_ms

SHAPES = [  # (what, rows, columns, n·r, GLU source)
    ("gemma2 qkv B2", 500, 2304, 24, False), ("gemma2 proj B2", 500, 2048, 8, False),
    ("gemma2 fc B2", 500, 2304, 8, False), ("gemma2 mlp.proj B2", 500, 9216, 8, True),
    ("gemma2 qkv B4", 1000, 2304, 24, False), ("gemma2 mlp.proj B4", 1000, 9216, 8, True),
    ("1B qkv B4", 2000, 2048, 16, False), ("8B qkv 262k", 262144, 4096, 16, False),
]


def _three(bits, scale, dh, lora_a, x, glu, dx):
    xd = D.dropped_from_bits(bits, scale, x=x, glu=glu, dx=dx, dxd=dh @ lora_a)
    return dh.t() @ xd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--long", action="store_true", help="also the 262k-token shape")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    dt, scale = torch.bfloat16, 1 / 0.9
    for what, N, C, R, glu in SHAPES:
        if N > 100_000 and not a.long:
            continue
        torch.manual_seed(0)
        x = torch.randn(N, C, device="cuda", dtype=dt)
        b = torch.randn(N, C, device="cuda", dtype=dt) if glu else None
        g = (x, b, "gelu_tanh") if glu else None
        xs = None if glu else x
        bits = D.pack_kept(torch.rand(N, C, device="cuda") < 0.9)
        dh = torch.randn(N, R, device="cuda", dtype=dt) / 8
        lora_a = torch.randn(R, C, device="cuda", dtype=dt) / 8
        dx0 = torch.randn(N, C, device="cuda", dtype=dt)
        dx_ref = dx0.clone()
        da_ref = _three(bits, scale, dh, lora_a, xs, g, dx_ref)
        dx = dx0.clone()
        plan = dropped_lora_plan(N, C, R, x.device)
        row = {"what": what, "rows": N, "cols": C, "n_r": R,
               "plan": {"block_cols": plan.block_cols, "splits": plan.splits},
               "three_us": round(graph_median_ms(lambda: _three(bits, scale, dh, lora_a, xs, g, dx0.clone()), a.n)
                                 * 1e3, 2)}
        da = D.dropped_lora_grads(bits, scale, dh, lora_a, x=xs, glu=g, dx=dx)
        row["da_rel_err"] = ((da.float() - da_ref.float()).norm() / da_ref.float().norm()).item()
        row["dx_rel_err"] = ((dx.float() - dx_ref.float()).norm() / dx_ref.float().norm()).item()
        copy_us = graph_median_ms(lambda: dx0.clone(), a.n) * 1e3  # both timings include one clone of dx
        row["clone_us"] = round(copy_us, 2)
        sweep = {}
        for bc in (16, 32, 64):
            for sp in (None, 1, 2, 4, 8):
                p = dropped_lora_plan(N, C, R, x.device, bc, sp)
                key = f"bc{bc}-s{p.splits}"
                if key in sweep:
                    continue
                sweep[key] = round(graph_median_ms(lambda: D.dropped_lora_grads(
                    bits, scale, dh, lora_a, x=xs, glu=g, dx=dx0.clone(), block_cols=bc, splits=sp), a.n) * 1e3, 2)
        row["one_pass_us"] = sweep[f"bc{plan.block_cols}-s{plan.splits}"]
        row["sweep_us"] = sweep
        row["best"] = min(sweep, key=sweep.get)
        res["rows"].append(row)
        print(row, flush=True)
    (out / "dropped_lora.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
