# call g2: the three tests g1 failed, after their fixes (a full batch's lengths read now and then; the GLU MLP test's
# warm-up with a backward), and the single-GPU `gpu`-marked tests, part 2 (graphs, packing, memory plan, CLI)
CALL=g2; . benchmarks/calls.sh
python3 - <<'PY'
# the chunked GLU MLP's peak above its inputs after a forward-only warm-up and after a forward + backward one
import torch
from lit_liger.kernels.swiglu import glu_mlp
C, I, N = 2048, 8192, 512
w = [torch.randn(I, C, device="cuda", dtype=torch.bfloat16) * 0.02, None,
     torch.randn(I, C, device="cuda", dtype=torch.bfloat16) * 0.02, None,
     torch.randn(C, I, device="cuda", dtype=torch.bfloat16) * 0.02, None]
x = torch.randn(1, N, C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn(1, N, C, device="cuda", dtype=torch.bfloat16)
def peak():
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
    out = glu_mlp(x, *w); torch.autograd.grad(out, (x,), dy); torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20
glu_mlp(x, *w)
print("glu_mlp peak MiB, forward-only warm-up:", peak(), "then:", peak())
PY
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_swiglu.py tests/test_adapter.py tests/test_attention.py \
  -k "real_size_and_memory or no_host_sync" > /tmp/o/g2-pytest-fixed.log 2>&1
echo "fixed rc=$?"; grep -E "passed|failed|FAILED" /tmp/o/g2-pytest-fixed.log | tail -6
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=10 tests/test_buckets.py tests/test_packing.py \
  tests/test_memplan.py tests/test_cli.py -k "not long_document" > /tmp/o/g2-pytest.log 2>&1
echo "part 2 rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/g2-pytest.log | tail -12
pack
