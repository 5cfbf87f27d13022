# call 2 (issue 46): the Trainer under DDP after the token counts stay boxed through DDP's move of the inputs (call 1's
# cProfile: a pageable copy that waited for the GPU at every batch), 1 and 2 GPUs on one instance; torch's DDP GPU test
# with its expectation of the first step's pre-capture; the host profile again
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/g2.tgz -C /tmp/o . ; }
timeout 200 python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 500 --warm 100 --timeout 95 --out /tmp/o/g2-trainer 2>&1 | grep -v -i "$F" | cut -c1-300 | grep "^{"
pack; echo "t=$(( $(date +%s) - S ))s"
timeout 100 python3 -m pytest -q tests/test_distributed.py -m gpu -k ddp_replica -p no:cacheprovider > /tmp/o/g2-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" /tmp/o/g2-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -4; pack
echo "t=$(( $(date +%s) - S ))s"
LIT_LIGER_BENCH_CPROFILE=/tmp/o/g2-cprofile,100,60 timeout 100 python3 -m benchmarks trainer --devices 2 --variants liger --batches 200 --warm 40 --timeout 80 --out /tmp/o/g2-trainer-cprofiled 2>&1 | grep -v -i "$F" | cut -c1-200 | grep "^{"
for f in /tmp/o/g2-cprofile/*.txt; do echo "== $f"; sed -n 1,16p $f | cut -c1-160; done
pack; echo "t=$(( $(date +%s) - S ))s"
