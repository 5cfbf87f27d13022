python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 200 python3 -m benchmarks convergence --fp8 tensorwise,rowwise --out $OUT/conv-fp8 2>&1 | grep -v -i "$F" | tail -8
