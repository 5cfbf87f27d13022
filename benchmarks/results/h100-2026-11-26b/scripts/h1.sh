python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -x tests/test_grad_into.py tests/test_buckets.py -k "grad_into or fuse or full_training or accumulate or linear" -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/pytest-h1.log
timeout 330 python3 .gpu/prof2.py full-foreach-after full-fused-after full-fused 2>&1 | grep -v "warn\|Warn" | tail -8
