# call 2 (one GPU): the Adam kernel with its pointers hinted 16-byte aligned (call 1's build loaded 2 bytes at a time:
# a hint on the integer address before the cast to a pointer is not carried over): GPU tests, diag adam-step with a
# sweep of launch plans (BLOCKxITERSxWARPS)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/q2.tgz -C /tmp/o . ; }
timeout 150 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_adam.py tests/test_grad_into.py tests/test_callback.py -k "adam or fuse or fused or kernel or switched or dtensor" > /tmp/o/q2-pytest-adam.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E |^FAILED" /tmp/o/q2-pytest-adam.log | cut -c1-300 | tail -8; pack; echo "t=$(( $(date +%s) - S ))s"
PLANS=1024x16x4,1024x4x4,2048x8x8,2048x4x4,512x16x2,4096x4x8 timeout 240 python3 -m benchmarks diag adam-step /tmp/o/q2-adam-step.json 2>&1 | grep -v "warn" | tail -24; pack; echo "t=$(( $(date +%s) - S ))s"
DTYPE=float32 MODELS=Llama-3.2-1B timeout 100 python3 -m benchmarks diag adam-step /tmp/o/q2-adam-step-fp32.json 2>&1 | grep -v "warn" | tail -6; pack; echo "t=$(( $(date +%s) - S ))s"
