"""What a CUDA-graph capture costs on the host, and where that time goes (issue 47: captures ≤ 5% of a run).

usage: python -m benchmarks diag capture-cost [OUT.json]   (env: MODEL=Llama-3.2-1B, LAYERS=16, METHOD=lora|full,
                                                            STEPS=200, TOP=30, LADDERS=)

One GPU, bf16, lit-liger's defaults (packing, buckets, automatic graphs), micro-batch 4 with Alpaca-shaped lengths
(lognormal, median ~190 tokens, at most 1,024), accumulation 4, fused AdamW. The same micro-batches run three times:
1. captured, as a run would (cold: every kernel's first call in the first warm-up), then replayed: the loop's time
   with every shape captured; then, after :func:`lit_liger.runtime.graphs.release` each, captured again (warm), captured with
   ``EMPTY_CACHE_BEFORE_CAPTURE`` off, and replayed again. Per pass: the model's ``ModelState.captures`` per
   phase, the CUDA graphs' instantiation (``CUDAGraph.capture_end``) timed apart from the recording, and the wall
   time of the loop; what the captures add to a loop is its time less the replayed pass's;
2. captured again, with ``cProfile`` on during the recordings only: the functions that take the recordings' host
   time (``tottime`` and ``cumtime``, top ``TOP``);
3. uncaptured (``cuda_graphs=False``): the host time of a micro-batch's forward, loss and backward, for the same
   shapes, the work a capture records (the uncaptured step is host-bound here; the one host sync a packed step makes,
   reading its lengths, falls in it).

``LADDERS=4,8`` instead: per granularity of the packed ladder (:data:`lit_liger.swap.buckets.PACKED_PER_DOUBLING`), the
padding it computes, then the same micro-batches captured and replayed twice: what finer buckets save per replayed
micro-batch against the captures they add.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import random
import sys
import time

import torch

from ._common import alpaca_length, recipe_model


def _batches(vocab: int, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input ids, targets) as litgpt's collate pads them: ids 0 and targets -100 after each sample's end."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lengths = [alpaca_length(rng, 1024) for _ in range(4)]
        x = torch.zeros(4, max(lengths), dtype=torch.int64)
        y = torch.full_like(x, -100)
        for i, t in enumerate(lengths):
            x[i, :t] = torch.randint(1, vocab, (t,))
            y[i, :t - 1] = x[i, 1:t]
        out.append((x.cuda(), y.cuda()))
    return out


def _loop(model, opt, batches, host: list | None = None) -> float:
    from lit_liger import chunked_cross_entropy

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        h0 = time.perf_counter()
        loss = chunked_cross_entropy(model(x), y)
        loss.backward()
        if host is not None:
            host.append(time.perf_counter() - h0)
        if i % 4 == 3:
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    from lit_liger import LigerConfig, apply_liger
    from lit_liger.runtime import graphs
    from lit_liger.swap.state import state_of

    name, n_layer = os.environ.get("MODEL", "Llama-3.2-1B"), int(os.environ.get("LAYERS", 16))
    lora = os.environ.get("METHOD", "lora") == "lora"
    steps, top = int(os.environ.get("STEPS", 200)), int(os.environ.get("TOP", 30))
    cfg, model = recipe_model(name, 1024, n_layer, lora)
    apply_liger(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    batches = _batches(cfg.vocab_size, steps)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": name,
              "n_layer": n_layer, "method": "lora" if lora else "full", "micro_batches": steps}

    inst = {"n": 0, "s": 0.0}
    capture_end = torch.cuda.CUDAGraph.capture_end

    def timed_end(self):
        t = time.perf_counter()
        capture_end(self)
        inst["n"] += 1
        inst["s"] += time.perf_counter() - t

    torch.cuda.CUDAGraph.capture_end = timed_end

    def phase(label: str, prof: cProfile.Profile | None = None) -> None:
        counts = state_of(model).captures
        before, i0 = dict(counts), dict(inst)
        record = graphs._Graphs._capture_graphs
        if prof is not None:
            def profiled(self, *a, **k):
                prof.enable()
                try:
                    return record(self, *a, **k)
                finally:
                    prof.disable()

            graphs._Graphs._capture_graphs = profiled
        try:
            wall = _loop(model, opt, batches)
        finally:
            graphs._Graphs._capture_graphs = record
        graphs.settle_waits(graphs.runner_for(model), block=True)  # (the GPU's waits for this pass's captures)
        stats = {k: counts[k] - before[k] for k in counts}
        stats.update(wall_s=wall, instantiate_s=inst["s"] - i0["s"], graphs_instantiated=inst["n"] - i0["n"])
        result[label] = stats
        print(label, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}),
              flush=True)

    ladders = [int(v) for v in os.environ.get("LADDERS", "").split(",") if v.strip()]
    if ladders:  # the packed ladder's granularity: captures against padding
        from lit_liger.swap import buckets

        phase("captured")  # (cold: first calls)
        for pd in ladders:
            buckets.PACKED_PER_DOUBLING = pd
            graphs.release(model)
            padded = sum(buckets.packed_bucket_length(int((x != 0).sum())) for x, _ in batches)
            real = sum(int((x != 0).sum()) for x, _ in batches)
            result[f"ladder{pd}_padding"] = padded / real - 1
            print(f"ladder {pd} per doubling: padding {padded / real - 1:.1%}", flush=True)
            phase(f"ladder{pd}_captured")
            phase(f"ladder{pd}_replayed")
            phase(f"ladder{pd}_replayed_again")
        if len(sys.argv) > 1:
            with open(sys.argv[1], "w") as f:
                json.dump(result, f, indent=1)
        return
    phase("captured")  # (a cold start: the first-call work of every kernel is in its warm-up)
    phase("replayed")  # (the same shapes again: no capture, the loop's time when every shape is captured)
    graphs.release(model)
    phase("captured_again")
    graphs.release(model)
    graphs.EMPTY_CACHE_BEFORE_CAPTURE = False
    phase("captured_again_no_empty_cache")
    graphs.EMPTY_CACHE_BEFORE_CAPTURE = True
    phase("replayed_again")
    graphs.release(model)
    prof = cProfile.Profile()
    phase("captured_profiled", prof)
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(top)
        text = s.getvalue()
        result[f"profile_{key}"] = text
        print(text[text.find("ncalls") - 200 if "ncalls" in text else 0:], flush=True)
    graphs.release(model)
    apply_liger(model, LigerConfig(cuda_graphs=False))
    host: list[float] = []
    _loop(model, opt, batches[:8])
    result["uncaptured_wall_s"] = _loop(model, opt, batches, host)
    result["uncaptured_host_ms_per_micro_batch"] = 1e3 * sum(host) / len(host)
    print("uncaptured", json.dumps({"wall_s": round(result["uncaptured_wall_s"], 3),
                                    "host_ms_per_micro_batch": round(result["uncaptured_host_ms_per_micro_batch"], 2)}),
          flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
