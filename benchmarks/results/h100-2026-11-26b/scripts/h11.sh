python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant'
timeout 260 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --iters 300 --warmup 40 --variants stock,liger --out $OUT/full4-300-repeat 2>&1 | grep -v "$F" | tail -2
timeout 150 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 300 --warmup 40 --variants liger --out $OUT/lora4-300-repeat 2>&1 | grep -v "$F" | tail -1
