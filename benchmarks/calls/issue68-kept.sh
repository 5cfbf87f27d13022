# Issue 68: a recomputed Block's attention output kept for its rerun (MemPlan.attn). The GPU tests of the kept path
# (tests/test_kept_attention.py) and of the memory plan, the kernel PyTorch picks for Llama-3.1-8B's GQA call per
# length (the one the kept path calls apart), after building the 8B checkpoint and 262k documents for the next
# call (issue68-long-mem.sh with RUN=1, while the machine is warm).
#   run: CALL=k1 bash benchmarks/calls/issue68-kept.sh     (carry: .whl)
CALL=${CALL:-k}
# (first: the script's own setup empties /tmp/o)
BUILD=1 CALL=$CALL LEN=${LEN:-262144} bash benchmarks/calls/issue68-long-mem.sh 2>&1 | tail -3
. benchmarks/calls.sh
timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kept_attention.py tests/test_memplan.py -k "kept or pair or offload" \
  > "/tmp/o/$NAME-pytest.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
python3 - <<'PY' 2>&1 | tee "/tmp/o/$NAME-backend.txt"
import torch
from lit_liger.swap import attend
for T in (16384, 65536, 131072, 262144, 524288):
    q = torch.empty(1, 32, T, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(1, 8, T, 128, device="cuda", dtype=torch.bfloat16)
    print(f"{T} tokens: PyTorch's choice {torch._fused_sdp_choice(q, k, k, None, 0.0, True, scale=128 ** -0.5, enable_gqa=True)}"
          f" -> kept backend {attend._kept_backend(q, k, k, 128 ** -0.5)}")
    del q, k
PY
echo "done ($(( $(date +%s) - S )) s)"
pack
