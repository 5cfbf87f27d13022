python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant'
timeout 250 python3 -m benchmarks recipe --models Qwen2.5-1.5B --methods lora --micro_batches 4 --iters 200 --warmup 40 --variants stock,liger --out $OUT/qwen-lora4 2>&1 | grep -v "$F" | tail -3
timeout 300 python3 -m benchmarks recipe --models gemma-2-2b --methods lora --micro_batches 4 --iters 200 --warmup 40 --variants stock,liger --out $OUT/gemma2-lora4 2>&1 | grep -v "$F" | tail -3
python3 .gpu/show.py
