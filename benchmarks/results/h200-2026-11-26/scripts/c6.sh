python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant'
timeout 200 python3 -m pytest -q -m gpu tests/test_packing.py tests/test_buckets.py tests/test_stock_code.py tests/test_checkpointing.py -p no:cacheprovider 2>&1 | grep -E "passed|failed|FAILED|Error" | head -12 | tee $OUT/pytest-g6.log
timeout 300 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 300 --warmup 40 --variants stock,liger,liger-padded --out $OUT/lora4-300 2>&1 | grep -v "$F" | tail -3
python3 .gpu/show.py
