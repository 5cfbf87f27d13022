# call 4 (issue 46): the replica's lengths captured together at the first step (PRECAPTURE_REPLICAS): GPU test, then
# Llama-3.2-1B LoRA 1 and 2 GPUs (defaults), as call 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=60
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
timeout 100 python3 -m pytest -q tests/test_distributed.py -k "gpu_replica" -p no:cacheprovider > /tmp/o/d4-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" /tmp/o/d4-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -6
timeout 170 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --devices 1,2 --variants liger --iters 500 --warmup 100 --work_dir /tmp/work --out /tmp/o/d4-recipe-1b-lora 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/d4-run-$d.txt; grep -E "lit-liger: (data parallel|CUDA graphs)|Error|out of memory" $f | cut -c1-220 | head -4; done
tar czf $OUT/d4.tgz -C /tmp/o .
