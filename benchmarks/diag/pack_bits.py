"""The LoRA dropout's mask packed into bits (``kernels.dropout.pack_kept``) on the GPU: the kernel as it is against
the one before 2026-12-03 (eight loads strided by 8 bytes, one per bit), at the shapes of gemma2-2b's shipped LoRA
recipe (a micro-batch of ~1,000 token slots; LoRA inputs of width 2,304 and 9,216), CUDA-graph timed, each result
checked against the reference. Writes ``pack_bits.json``.

    python -m benchmarks diag pack-bits --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from lit_liger.kernels import dropout as D
from lit_liger.kernels._launch import elementwise_plan
from .attn_sweep import graph_median_ms


@triton.jit
def _strided_pack_kernel(M, BITS, n, n_bytes, BLOCK: tl.constexpr):  # the kernel before: one strided load per bit
    byte = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for j in tl.static_range(8):
        i = byte * 8 + j
        m = tl.load(M + i, mask=i < n, other=0)
        acc = acc | ((m != 0).to(tl.int32) << j)
    tl.store(BITS + byte, acc.to(tl.uint8), mask=byte < n_bytes)


def _before(mask: torch.Tensor) -> torch.Tensor:
    n = mask.numel()
    n_bytes = (n + 7) // 8
    bits = torch.empty(n_bytes, dtype=torch.uint8, device=mask.device)
    plan = elementwise_plan(n_bytes, mask.device)
    _strided_pack_kernel[plan.grid](mask.view(torch.uint8), bits, n, n_bytes, BLOCK=plan.block,
                                    num_warps=plan.num_warps)
    return bits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=30)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    for rows, width in ((1024, 2304), (1024, 9216), (512, 2304), (512, 9216), (4096, 2048)):
        mask = torch.rand(rows, width, device="cuda") < 0.9  # lora_dropout 0.1: 90% kept
        ref = D._pack_reference(mask)
        ok_new, ok_old = torch.equal(D.pack_kept(mask), ref), torch.equal(_before(mask), ref)
        new_ms = graph_median_ms(lambda: D.pack_kept(mask), a.n)
        old_ms = graph_median_ms(lambda: _before(mask), a.n)
        row = {"rows": rows, "width": width, "before_us": round(old_ms * 1e3, 2), "now_us": round(new_ms * 1e3, 2),
               "now_GBps": round(mask.numel() * 1.125 / (new_ms * 1e-3) / 1e9, 1), "equal_reference": ok_new and ok_old}
        res["rows"].append(row)
        print(row, flush=True)
    (out / "pack_bits.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
