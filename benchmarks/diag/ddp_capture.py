"""Why a CUDA-graph capture inside ``DistributedDataParallel``'s forward fails (2 GPUs, NCCL), per DDP setting.

Found in ``h200x2-2026-11-27c``: DDP constructed on the default stream makes the parameters' gradient accumulators
there, and the captured backward then makes the legacy stream wait for the capturing one ("operation would make the
legacy stream depend on a capturing blocking stream"). The ``side-stream`` variant is the remedy (not run yet).

    python -m benchmarks diag ddp-capture [VARIANT ...]

Each variant runs in two fresh processes (one per GPU): a 2-layer Llama-3.2-1B-wide LoRA model in bf16, swapped with
CUDA graphs and packing, wrapped in torch's DDP, three micro-batches (two lengths) forward and backward. Prints, per
variant, the captures and replays of rank 0's graph runner, and the first capture failure's whole traceback.

Variants: ``default``; ``side-stream`` (DDP constructed in a ``torch.cuda.stream(torch.cuda.Stream())`` context, as
PyTorch's notes on CUDA graphs ask and Lightning's ``DDPStrategy`` does; the expected fix); ``no-buffers``
(``broadcast_buffers=False``); ``relaxed`` / ``global`` (the capture's ``capture_error_mode``); ``static`` (``static_graph=True``); ``bucket-view`` (``gradient_as_bucket_view=True``);
``no-ddp`` (the same processes and process group, no DDP wrapper: the control).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ("default", "side-stream", "no-buffers", "relaxed", "global", "static", "bucket-view", "no-ddp")


def _rank(rank: int, variant: str, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy

    import lit_liger.runtime.graphs as graphs
    from lit_liger import LigerConfig, apply_liger
    from lit_liger.runtime.graphs import runner_for

    if variant in ("relaxed", "global"):
        graphs.CAPTURE_ERROR_MODE = variant
    cfg = Config.from_name("Llama-3.2-1B", n_layer=2, block_size=512, lora_r=8, lora_alpha=16, lora_query=True,
                           lora_value=True, lora_dropout=0.05)
    torch.manual_seed(0)
    with torch.device("cuda"):
        gpt = GPT(cfg).to(torch.bfloat16)
    mark_only_lora_as_trainable(gpt)
    apply_liger(gpt, LigerConfig(cuda_graphs=True, packing=True))
    kw = {"no-buffers": {"broadcast_buffers": False}, "static": {"static_graph": True},
          "bucket-view": {"gradient_as_bucket_view": True}}.get(variant, {})
    if variant == "no-ddp":
        model = gpt
    else:  # ("side-stream": constructed on a side stream, as PyTorch's notes on CUDA graphs and Lightning do)
        with torch.cuda.stream(torch.cuda.Stream()) if variant == "side-stream" else contextlib.nullcontext():
            model = torch.nn.parallel.DistributedDataParallel(gpt, device_ids=[rank], **kw)
    result = {"variant": variant, "rank": rank}
    try:
        for i, lengths in enumerate([(100, 300, 90), (50, 120), (100, 300, 90)]):
            g = torch.Generator().manual_seed(10 * rank + i)
            x = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
            y = torch.full_like(x, -100)
            for b, n in enumerate(lengths):
                x[b, :n] = torch.randint(1, cfg.vocab_size, (n,), generator=g)
                y[b, :n] = torch.randint(0, cfg.vocab_size, (n,), generator=g)
            loss = chunked_cross_entropy(model(x.cuda())[..., :-1, :], y.cuda()[..., 1:], chunk_size=0)
            loss.backward()
            if variant == "no-ddp":
                for p in gpt.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
        torch.cuda.synchronize()
        result["ok"] = True
    except Exception:  # noqa: BLE001 - reported
        result["ok"] = False
        result["exception"] = traceback.format_exc()[-4000:]
    runner = runner_for(gpt)
    result.update(captures=runner.captures, replays=runner.replays, disabled=runner.disabled,
                  error=(runner.error or "")[-6000:])
    queue.put(result)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    variants = argv or list(VARIANTS)
    ctx = mp.get_context("spawn")
    # (run by ``diag`` as __main__: the spawned processes need the function from an importable module)
    from benchmarks.diag import ddp_capture
    for variant in variants:
        queue = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [ctx.Process(target=ddp_capture._rank, args=(r, variant, port, queue)) for r in range(2)]
        for p in procs:
            p.start()
        results = []
        for _ in procs:
            try:
                results.append(queue.get(timeout=240))
            except Exception:  # noqa: BLE001 - a rank died or hung
                break
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        for r in sorted(results, key=lambda r: r["rank"]):
            short = {k: v for k, v in r.items() if k not in ("error", "exception")}
            print(json.dumps(short), flush=True)
            if r["rank"] == 0:
                for k in ("exception", "error"):
                    if r.get(k):
                        print(f"--- {variant} rank 0 {k}:\n{r[k]}", flush=True)
        if len(results) < 2:
            print(json.dumps({"variant": variant, "ranks_reported": len(results)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
