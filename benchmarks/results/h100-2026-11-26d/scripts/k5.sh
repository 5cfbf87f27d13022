python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 100 python3 -m pytest -q tests/test_float8.py "tests/test_fp8.py::test_gpu_fp8_composition_under_compile" 2>&1 | tee $OUT/pytest.log | grep -E "^E  |passed|failed|FAILED" | head -8
export PYTHONPATH=/tmp/site:.
timeout 60 python3 .gpu/fp8check.py  # = h100-2026-11-26c/scripts/fp8check.py 2>&1 | grep -v -i "$F" | tail -4
timeout 150 python3 -m benchmarks step --models Llama-3.2-1B --batch_size 4 --seq_len 2048 --variants lit-liger,lit-liger+fp8-tensorwise --fp8 tensorwise --steps 10 --warmup 3 --variant_timeout 60 --anchor none --out $OUT/step1b-eager 2>&1 | grep -v -i "$F" | tail -3
timeout 120 python3 .gpu/prof2.py lora-fused-fp8 2>&1 | grep -v -i "$F" | tail -2
timeout 200 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 200 --warmup 40 --variants stock,liger,liger-fp8 --out $OUT/lora4-fp8 2>&1 | grep -v "$F" | tail -3
