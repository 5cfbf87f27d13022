python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 300 python3 -m benchmarks step --models Llama-3.2-1B --batch_size 4 --seq_len 2048 --variants lit-liger+compile,lit-liger+fp8-tensorwise+compile --fp8 tensorwise --steps 10 --warmup 3 --variant_timeout 140 --anchor none --out $OUT/step1b 2>&1 | grep -v -i "$F" | tail -4
export PYTHONPATH=/tmp/site:.
timeout 250 python3 .gpu/prof2.py lora-fused lora-fused-fp8 2>&1 | grep -v -i "$F" | tail -12
