"""Where a replica's optimizer step goes on several GPUs (issue 46): accumulation iteration, synchronizing iteration
(its all-reduce), optimizer step, per count of backward segments (``lit_liger._dist.SEGMENTS``: 1 = the whole
all-reduce after backward; 4 = each upper segment's started under the backward of the ones below).

usage: python -m benchmarks diag replica-step [OUT.json]   (env: MODEL=Llama-3.2-1B, B=4, T=512, ACCUM=2, STEPS=12,
                                                            SEGMENTS=1,4, LORA=0)

Each of the GPUs (``torch.cuda.device_count()``) runs a process (NCCL) holding the whole model, swapped by lit-liger
(bf16, CUDA graphs, packing off, fixed shape ``B x T``), under ``lit_liger.parallel.dataparallel.ReplicaStrategy``'s
``setup_module`` / ``backward`` / ``no_backward_sync``, AdamW fused, ``ACCUM`` micro-batches per step. Times are CUDA
events on rank 0 around each phase, medians over ``STEPS`` steps after 3 warm-up steps; one process alone (no
reduction) is the reference for the phases' own cost.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, port: int, segments: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group("nccl", rank=rank, world_size=world)
    from lightning.fabric.plugins import Precision
    from litgpt.lora import GPT as LoRAGPT
    from litgpt.lora import Config as LoRAConfig
    from litgpt.lora import mark_only_lora_as_trainable
    from litgpt.model import GPT, Config

    from lit_liger import LigerConfig, _dist, apply_liger, chunked_cross_entropy
    from lit_liger.parallel.dataparallel import replica_class

    _dist.SEGMENTS = segments
    name, B, T = os.environ.get("MODEL", "Llama-3.2-1B"), int(os.environ.get("B", 4)), int(os.environ.get("T", 512))
    accum, steps, lora = int(os.environ.get("ACCUM", 2)), int(os.environ.get("STEPS", 12)), os.environ.get("LORA") == "1"
    torch.manual_seed(0)
    with torch.device("cuda"):
        if lora:
            model = LoRAGPT(LoRAConfig.from_name(name, lora_r=8, lora_alpha=16, lora_query=True, lora_value=True))
            mark_only_lora_as_trainable(model)
        else:
            model = GPT(Config.from_name(name))
    model = model.to(torch.bfloat16)
    model.max_seq_length = T
    apply_liger(model, LigerConfig(packing=False))
    strategy = None
    if world > 1:
        strategy = replica_class()()
        strategy.precision = Precision()
        model = strategy.setup_module(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    x = torch.randint(0, 32000, (B, T), device="cuda")
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    rows = []
    for step in range(steps + 3):
        marks = [ev() for _ in range(accum + 2)]
        marks[0].record()
        for i in range(accum):
            sync = i == accum - 1
            ctx = (strategy._backward_sync_control.no_backward_sync(model, not sync) if strategy
                   else torch.enable_grad())
            with ctx:
                loss = chunked_cross_entropy(model(x), x)
                if strategy:
                    strategy.backward(loss / accum, None)
                else:
                    (loss / accum).backward()
            marks[i + 1].record()
        opt.step()
        opt.zero_grad()
        marks[-1].record()
        torch.cuda.synchronize()
        if step >= 3:
            t = [marks[i].elapsed_time(marks[i + 1]) for i in range(accum + 1)]
            rows.append({"accumulate_ms": statistics.fmean(t[:-2]) if accum > 1 else None, "sync_ms": t[-2],
                         "optimizer_ms": t[-1], "step_ms": sum(t)})
    if world > 1:
        dist.barrier()
    if rank == 0:
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if rows[0][k] is not None}
        med.update(world=world, segments=segments, early_segments_per_step=(strategy.early / (steps + 3) if strategy
                                                                             else 0))
        queue.put(med)
    if world > 1:
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    from benchmarks.diag import replica_step  # (spawned workers import it by name: this file runs as __main__)

    ctx = mp.get_context("spawn")
    out = []
    world = torch.cuda.device_count()
    for n, seg in [(1, 1)] + [(world, int(s)) for s in os.environ.get("SEGMENTS", "1,4").split(",")]:
        if n < 2 and out:
            continue
        queue = ctx.Queue()
        mp.start_processes(replica_step._worker, args=(n, _port(), seg, queue), nprocs=n, join=True, start_method="spawn")
        row = queue.get(timeout=60)
        out.append(row)
        print(json.dumps(row), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"env": {k: os.environ.get(k) for k in ("MODEL", "B", "T", "ACCUM", "LORA")},
                       "device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
