python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 -m benchmarks step --models Llama-3.2-1B --variants lit-liger+compile,lit-liger+fp8-tensorwise+compile --fp8 tensorwise --profile --steps 10 --warmup 3 --variant_timeout 230 --out $OUT/step1b-fp8-prof 2>&1 | grep -v "warn\|Warn" | tail -30
