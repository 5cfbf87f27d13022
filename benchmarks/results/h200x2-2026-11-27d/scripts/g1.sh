# call 1 (issue 46): what the last session left unrun on GPUs: torch's DDP built on a side stream (diag + GPU test),
# the Trainer under DDP with the side-stream SIGTERM check (1 and 2 GPUs, same instance), then the same with the
# host's Python profiled (cProfile, batches 100-160 per rank) to attribute the host time DDP adds
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/g1.tgz -C /tmp/o . ; }
timeout 200 python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 500 --warm 100 --timeout 95 --out /tmp/o/g1-trainer 2>&1 | grep -v -i "$F" | cut -c1-300 | tail -8
pack; echo "t=$(( $(date +%s) - S ))s"
LIT_LIGER_BENCH_CPROFILE=/tmp/o/g1-cprofile,100,60 timeout 170 python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 200 --warm 40 --timeout 80 --out /tmp/o/g1-trainer-cprofiled 2>&1 | grep -v -i "$F" | cut -c1-200 | tail -4
for f in /tmp/o/g1-cprofile/*.txt; do echo "== $f"; sed -n 1,22p $f | cut -c1-180; done
pack; echo "t=$(( $(date +%s) - S ))s"
timeout 120 python3 -m benchmarks diag ddp-capture default side-stream > /tmp/o/g1-ddp-capture.log 2>&1
grep '^{' /tmp/o/g1-ddp-capture.log | cut -c1-250; grep -B2 -A2 "Error" /tmp/o/g1-ddp-capture.log | cut -c1-200 | head -16; pack
echo "t=$(( $(date +%s) - S ))s"
L=$((560 - $(date +%s) + S)); echo "pytest slot ${L}s"
timeout $L python3 -m pytest -q tests/test_distributed.py -m gpu -p no:cacheprovider > /tmp/o/g1-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" /tmp/o/g1-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -6; pack
echo "t=$(( $(date +%s) - S ))s"
