python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
F='warn\|Failed to load\|register_constant'
timeout 120 python3 -m pytest -q -m gpu tests/test_packing.py tests/test_buckets.py -x -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/pytest-g1.log
timeout 110 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 100 --warmup 40 --variants liger-padded,liger-packed-direct --out $OUT/lora4 2>&1 | grep -v "$F" | tail -6
python3 .gpu/show.py
timeout 150 python3 -m benchmarks recipe --models Qwen2.5-1.5B --methods lora --micro_batches 4 --iters 100 --warmup 40 --variants stock,liger-padded --out $OUT/qwen4 2>&1 | grep -v "$F" | tail -5
timeout 200 python3 -m benchmarks recipe --models gemma-2-2b --methods lora --micro_batches 4 --iters 60 --warmup 20 --variants stock,liger --out $OUT/gemma4 2>&1 | grep -v "$F" | tail -5
python3 .gpu/show.py
