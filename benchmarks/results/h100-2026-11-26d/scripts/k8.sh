python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
export PYTHONPATH=/tmp/site:.
timeout 170 python3 .gpu/mem8b.py lit-liger+fp8-tensorwise+compile $OUT/mem8b-fp8c.json 2>&1 | grep "^=="
timeout 170 python3 .gpu/mem8b.py lit-liger+compile $OUT/mem8b-bf16c.json 2>&1 | grep "^=="
