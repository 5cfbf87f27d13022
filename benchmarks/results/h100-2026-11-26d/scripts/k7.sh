python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 240 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --iters 120 --warmup 30 --variants liger,liger-fp8 --out $OUT/full4-fp8 2>&1 | grep -v "$F" | tail -2
timeout 200 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 1 --iters 150 --warmup 40 --variants liger,liger-fp8 --out $OUT/lora1-fp8 2>&1 | grep -v "$F" | tail -2
