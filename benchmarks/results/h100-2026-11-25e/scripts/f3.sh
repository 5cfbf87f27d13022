python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 90 python3 -m pytest tests/test_fp8.py -q -k gpu -x 2>&1 | tail -4
timeout 120 python3 -m benchmarks convergence --fp8 tensorwise,rowwise --out $OUT/conv-fp8 2>&1 | grep -v -i "$F" | tail -14
timeout 250 python3 -m benchmarks step --models Llama-3.1-8B --n_layer 8 --batch_size 2 --seq_len 4096 --variants compile,lit-liger+compile,fp8-tensorwise+compile,lit-liger+fp8-tensorwise+compile --fp8 tensorwise --profile --steps 10 --warmup 3 --variant_timeout 100 --anchor none --out $OUT/step8b-comp 2>&1 | grep -v -i "$F" | tail -5
timeout 150 python3 -m benchmarks step --models Llama-3.2-1B --batch_size 4 --seq_len 2048 --variants compile,lit-liger+compile,lit-liger+fp8-tensorwise+compile,lit-liger+fp8-tensorwise --fp8 tensorwise --steps 10 --warmup 3 --variant_timeout 60 --anchor none --out $OUT/step1b-comp 2>&1 | grep -v -i "$F" | tail -5
