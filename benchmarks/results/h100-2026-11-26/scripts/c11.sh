python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 300 --warmup 40 --variants stock,liger,liger-padded --out $OUT/lora4-300-defaults 2>&1 | grep -v 'warn\|Failed to load\|register_constant' | tail -3
python3 .gpu/show.py
