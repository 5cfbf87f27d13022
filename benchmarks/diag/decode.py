"""litgpt's sample generation (``litgpt.generate.base.generate``, what its fine-tuning recipes' evaluations run): the
time per new token, where the host spends it, and what one CUDA graph of the one-token KV-cache step would make of it.

usage: python -m benchmarks diag decode [OUT.json]   (env: MODEL=Llama-3.2-1B, BLOCK=512, PROMPT=60, NEW=100, TOP=25,
                                                       LIGER=1: lit-liger's defaults applied, as the recipe's model)

One GPU, bf16, the recipe's LoRA model, random weights, ``set_kv_cache(batch_size=1)`` as litgpt's
``generate_example`` does. Rows:
1. litgpt's ``generate`` (temperature 0.8, no stop token: every new token made), three calls: seconds each, and
   per new token;
2. the third call again under cProfile: the functions with the most own time (host);
3. the one-token step captured in a CUDA graph (litgpt's forward with ``input_pos_maxp1=None``: attention over the
   whole cache, masked, fixed shapes; litgpt passes None itself for Thunder modules), then the same loop as litgpt's
   ``generate_fn`` (sample, ``.item()`` per token) around its replays: seconds per new token; and the largest
   difference of its logits from the eager step's at the same positions.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

from ._common import recipe_model


def _generate(model, prompt, new: int) -> tuple[float, torch.Tensor]:
    from litgpt.generate.base import generate

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = generate(model, prompt, max_returned_tokens=len(prompt) + new, temperature=0.8, eos_id=None)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


@torch.inference_mode()
def _graph_decode(model, prompt, new: int) -> dict:
    from litgpt.generate.base import sample

    n = len(prompt)
    dev = prompt.device
    # prefill, eager (as litgpt: input_pos_maxp1 = the prompt's length)
    logits = model(prompt.view(1, -1), torch.arange(n, device=dev), input_pos_maxp1=n)
    token = sample(logits, temperature=0.8).to(torch.int64)
    static_x = token.view(1, 1).clone()
    static_pos = torch.tensor([n], device=dev)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # (writes position n of the cache, which the first replay writes again)
            model(static_x, static_pos)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_logits = model(static_x, static_pos)
    # the same positions eagerly, for the logits' difference: replayed and eager agree on the first new token
    graph.replay()
    eager = model(static_x, static_pos, input_pos_maxp1=n + 1)
    diff = float((static_logits.float() - eager.float()).abs().max())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(new - 1):
        static_x.copy_(token.view(1, 1))
        static_pos.fill_(n + i)
        graph.replay()
        token = sample(static_logits, temperature=0.8).to(torch.int64)
        token.item()  # (litgpt's generate_fn reads each token for its stop sequences)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / max(1, new - 1)
    del graph
    return {"graph_s_per_token": round(per, 5), "graph_vs_eager_logits_max_abs_diff": diff}


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    name = os.environ.get("MODEL", "Llama-3.2-1B")
    block, n_prompt, new = (int(os.environ.get(k, d)) for k, d in (("BLOCK", 512), ("PROMPT", 60), ("NEW", 100)))
    cfg, model = recipe_model(name, block)
    if os.environ.get("LIGER", "1") == "1":
        from lit_liger import apply_liger

        apply_liger(model)
    model.max_seq_length = block
    model.eval()
    model.set_kv_cache(batch_size=1)
    torch.manual_seed(0)
    prompt = torch.randint(1, cfg.padded_vocab_size, (n_prompt,), device="cuda")
    rows: dict = {"model": name, "block": block, "prompt": n_prompt, "new_tokens": new,
                  "liger": os.environ.get("LIGER", "1") == "1", "device": torch.cuda.get_device_name()}
    calls = []
    for _ in range(3):
        s, _ = _generate(model, prompt, new)
        calls.append(round(s, 3))
    rows["generate_s"] = calls
    rows["eager_s_per_token"] = round(calls[-1] / new, 5)
    print(json.dumps(rows), flush=True)
    prof = cProfile.Profile()
    prof.enable()
    _generate(model, prompt, new)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(int(os.environ.get("TOP", "25")))
    rows["profile_tottime"] = text.getvalue().splitlines()
    print("\n".join(rows["profile_tottime"][:45]), flush=True)
    rows.update(_graph_decode(model, prompt, new))
    rows["graph_speedup_per_token"] = round(rows["eager_s_per_token"] / rows["graph_s_per_token"], 2)
    print(json.dumps({k: rows[k] for k in rows if k != "profile_tottime"}), flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
