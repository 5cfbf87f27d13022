"""c2: why the first capture after an uncaptured first micro-batch (graphs.EAGER_FIRST) failed in the shipped recipes
(c1: "operation failed due to a previous error during capture"), where tests/test_packing.py's GPU test passed.
One process per variant (env): LAYERS, DROPOUT, GEMM_INTO_GRAD=0, EAGER_FIRST=0, FULL=1. Prints the runner's error."""
import json
import os
import traceback

import torch

from benchmarks.diag._common import recipe_model
from benchmarks.diag.capture_cost import _batches
from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy, graphs

graphs.EAGER_FIRST = os.environ.get("EAGER_FIRST", "1") == "1"
if os.environ.get("GEMM_INTO_GRAD") == "0":
    graphs.GEMM_INTO_GRAD = False
lora = os.environ.get("FULL") != "1"
cfg, model = recipe_model("Llama-3.2-1B", 1024, int(os.environ.get("LAYERS", 16)), lora)
p = float(os.environ.get("DROPOUT", 0.05))
for m in model.modules():
    if isinstance(m, torch.nn.Dropout):
        m.p = p
apply_liger(model)
opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-5, fused=True)
with torch.no_grad():  # (litgpt validates before training: an uncaptured no-grad pass)
    x, y = _batches(cfg.vocab_size, 1, seed=9)[0]
    model.eval()
    model(x)
    model.train()
for i, (x, y) in enumerate(_batches(cfg.vocab_size, 12)):
    loss = chunked_cross_entropy(model(x), y)
    loss.backward()
    if i % 4 == 3:
        opt.step()
        opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
r = graphs.runner_for(model)
print(json.dumps({k: os.environ.get(k) for k in ("LAYERS", "DROPOUT", "GEMM_INTO_GRAD", "EAGER_FIRST", "FULL")}),
      json.dumps({"captures": r.captures, "replays": r.replays, "disabled": r.disabled,
                  "stats": {k: v for k, v in graphs.CAPTURE_STATS.items() if v}}), flush=True)
if r.error:
    print("\n".join(r.error.splitlines()[-40:]))
