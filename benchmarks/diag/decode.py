"""litgpt's sample generation (``litgpt.generate.base.generate``, what its fine-tuning recipes' evaluations run): the
time per new token of stock LitGPT, of lit-liger uncaptured and of lit-liger with its decode graph
(``lit_liger.runtime.decode``), and where the host spends it.

usage: python -m benchmarks diag decode [OUT.json]   (env: MODEL=Llama-3.2-1B, BLOCK=512, PROMPT=60, NEW=100, TOP=25,
                                                       MODES=stock,liger-uncaptured,liger[,liger-whole-cache])

One GPU, bf16, the recipe's LoRA model, random weights, ``set_kv_cache(batch_size=1)`` as litgpt's
``generate_example`` does, temperature 0.8, no stop token (every new token made). Per mode: a fresh model, three
calls on the same prompt (seconds each; the first makes every first call: attention plans, cuBLAS, the capture),
per new token (the third), then one more call under cProfile (the functions with the most own time).
``liger-whole-cache``: the decode graphs attend over the whole cache at every token (``decode.MIN_KEYS`` past the
cache's length), as the first decode graph did, for comparison with the key lengths rounded up to a power of two.
"""

from __future__ import annotations

import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time

import torch

from ._common import recipe_model


def _generate(model, prompt, new: int) -> float:
    from litgpt.generate.base import generate

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    generate(model, prompt, max_returned_tokens=len(prompt) + new, temperature=0.8, eos_id=None)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _mode(mode: str, name: str, block: int, n_prompt: int, new: int, top: int) -> dict:
    from lit_liger import apply_liger
    from lit_liger.runtime import decode
    from lit_liger.swap.state import state_of

    torch.cuda.reset_peak_memory_stats()
    cfg, model = recipe_model(name, block)
    if mode != "stock":  # (liger-uncaptured: every kernel, no decode graphs)
        apply_liger(model, {"cuda_graphs": mode in ("liger", "liger-whole-cache")})
    decode.MIN_KEYS = 1 << 40 if mode == "liger-whole-cache" else 256
    model.max_seq_length = block
    model.eval()
    with torch.device("cuda"):
        model.set_kv_cache(batch_size=1)
    torch.manual_seed(0)
    prompt = torch.randint(1, cfg.padded_vocab_size, (n_prompt,), device="cuda")
    counts = state_of(model).decode
    captures = counts["captures"]
    calls = [round(_generate(model, prompt, new), 3) for _ in range(3)]
    prof = cProfile.Profile()
    prof.enable()
    _generate(model, prompt, new)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    del model
    gc.collect()  # (the model and its caches go before the next mode's peak is measured)
    torch.cuda.empty_cache()
    return {"mode": mode, "generate_s": calls, "s_per_token": round(calls[-1] / new, 5),
            "first_call_s_per_token": round(calls[0] / new, 5), "captures": counts["captures"] - captures,
            "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
            "profile_tottime": text.getvalue().splitlines()}


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    name = os.environ.get("MODEL", "Llama-3.2-1B")
    block, n_prompt, new, top = (int(os.environ.get(k, d)) for k, d in
                                 (("BLOCK", 512), ("PROMPT", 60), ("NEW", 100), ("TOP", 25)))
    result: dict = {"model": name, "block": block, "prompt": n_prompt, "new_tokens": new,
                    "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for mode in os.environ.get("MODES", "stock,liger-uncaptured,liger").split(","):
        row = _mode(mode, name, block, n_prompt, new, top)
        result["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "profile_tottime"}), flush=True)
        print("\n".join(row["profile_tottime"][:top + 12]), flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
