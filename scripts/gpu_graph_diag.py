"""Why a CUDA-graph capture fails in a LoRA step with dropout: tries capture modes, prints the failure."""
import copy, sys, traceback
import torch
from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
from lit_liger import apply_liger, chunked_cross_entropy
from lit_liger import graphs as G
from lit_liger.graphs import runner_for

for mode in sys.argv[1:2] or ["thread_local"]:
    for dropout in [float(d) for d in (sys.argv[2:3] or ["0.05"])]:
        G.CAPTURE_ERROR_MODE = mode
        cfg = Config.from_name("Llama-3.2-1B", n_layer=2, lora_r=8, lora_alpha=16, lora_query=True, lora_value=True,
                               lora_dropout=dropout, block_size=512)
        with torch.device("cuda"):
            m = GPT(cfg).to(torch.bfloat16)
        mark_only_lora_as_trainable(m)
        apply_liger(m)
        r = runner_for(m)
        try:
            for i, T in enumerate((100, 300, 100, 300, 200)):
                print(f"  step {i} T={T} captures so far {r.captures}", flush=True)
                x = torch.randint(0, 1000, (4, T), device="cuda")
                out = m(x, lm_head_chunk_size=128)
                out[-1] = out[-1][..., :-1, :]
                chunked_cross_entropy(out, x[..., 1:]).backward()
            torch.cuda.synchronize()
            print(f"{mode} dropout={dropout}: captures {r.captures} replays {r.replays} disabled {r.disabled}", flush=True)
        except Exception as e:
            print(f"{mode} dropout={dropout}: FAILED {type(e).__name__}: {str(e)[:200]}; runner: {r.disabled}")
        if r.error:
            print(r.error[-3000:])
        del m, r
        torch.cuda.empty_cache()
