"""The CUDA-graph pool's growth per captured length, for tests/test_memplan.py's pool-budget test (LoRA, 2 layers of
Llama-3.2-1B, bf16, 30 lengths 64..1920, the pool's budget set out of reach): prints one line per length with the
runner's pool bytes, the reserved and allocated memory, and the captures so far.

    cd tests && python ../benchmarks/calls/pool_growth.py        (a CUDA GPU; the tests' helpers are imported)
"""
import sys

import torch

sys.path.insert(0, ".")
from test_buckets import _gpu_models  # noqa: E402
from test_checkpointing import _step  # noqa: E402

from lit_liger import LigerConfig, apply_liger  # noqa: E402
from lit_liger.runtime import graphs  # noqa: E402

cfg, model, _ = _gpu_models(True, block_size=2048)
apply_liger(model, LigerConfig(cuda_graphs=True, seq_buckets=False, packing=False))
graphs.POOL_FRACTION = 0.9
runner = graphs.runner_for(model)
torch.cuda.synchronize()
start = torch.cuda.memory_reserved()
print("T  pool_MiB  reserved_MiB(+start)  allocated_MiB  captures")
for T in [64 * (i + 1) for i in range(30)]:
    x = torch.randint(0, cfg.vocab_size, (1, T), device="cuda")
    loss, _ = _step(model, x, x)
    torch.cuda.synchronize()
    print(T, round(runner.pool_bytes / 2**20, 1), round((torch.cuda.memory_reserved() - start) / 2**20, 1),
          round(torch.cuda.memory_allocated() / 2**20, 1), runner.captures, flush=True)
