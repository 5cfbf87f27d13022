python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 200 python3 -m benchmarks step --models Llama-3.2-1B --batch_size 4 --seq_len 2048 --variants compile,lit-liger+fp8-tensorwise+compile,lit-liger+fp8-tensorwise --fp8 tensorwise --steps 10 --warmup 3 --variant_timeout 80 --anchor none --out $OUT/step1b-fp8 2>&1 | grep -v -i "$F" | tail -5
