python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=60
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 80 python3 -m pytest -q tests/test_distributed.py -k "gpu_replica" -p no:cacheprovider > $OUT/c3-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/c3-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -6
STEPS=10 timeout 90 python3 -m benchmarks diag replica-step $OUT/c3-replica-step-full.json 2>&1 | grep -v -i "$F" | tail -3
timeout 200 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 4 --devices 1,2 --variants liger --iters 160 --warmup 40 --out $OUT/c3-recipe-8b 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
timeout 150 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora,full --micro_batches 4 --devices 2 --variants stock --iters 60 --warmup 20 --out $OUT/c3-recipe-stock 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
LORA=1 SEGMENTS=4 STEPS=10 timeout 45 python3 -m benchmarks diag replica-step $OUT/c3-replica-step-lora.json 2>&1 | grep -v -i "$F" | tail -3
