# call 1 (issue 46): why a capture inside DDP's forward fails (diag ddp-capture), the GPU tests of the replica and
# zero1 over NCCL, the Trainer + LigerCallback under strategy="ddp" (1 and 2 GPUs, before any fix), and which
# micro-batch a 2-GPU recipe run captures outside the pre-capture ladder (the iteration-89 stall); a tarball after each
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/f1.tgz -C /tmp/o . ; }
timeout 170 python3 -m benchmarks diag ddp-capture default no-buffers global no-ddp > /tmp/o/f1-ddp-capture.log 2>&1
grep '^{' /tmp/o/f1-ddp-capture.log | cut -c1-250; grep -A3 "Error\|error" /tmp/o/f1-ddp-capture.log | grep -v "^--$" | cut -c1-200 | head -12; pack
timeout 120 python3 -m pytest -q tests/test_distributed.py -m gpu -k "zero1 or replica" -p no:cacheprovider > /tmp/o/f1-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" /tmp/o/f1-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -4; pack
echo "t=$(( $(date +%s) - S ))s"
timeout 200 python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 240 --warm 40 --out /tmp/o/f1-trainer 2>&1 | grep -v -i "$F" | cut -c1-300 | tail -12; pack
echo "t=$(( $(date +%s) - S ))s"
L=$((480 - $(date +%s) + S)); echo "recipe slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --devices 2 --variants liger --iters 140 --warmup 20 --work_dir /tmp/work --out /tmp/o/f1-recipe-lora2 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | cut -c1-260 | tail -3
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/f1-run-$d.txt; grep -E "lit-liger: CUDA graphs|Error|out of memory" $f | cut -c1-260 | head -4; done
pack; echo "t=$(( $(date +%s) - S ))s"
