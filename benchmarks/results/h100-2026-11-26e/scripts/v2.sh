python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 420 python3 -m pytest -q tests/test_rms_norm.py tests/test_float8.py tests/test_fp8.py tests/test_stock_code.py tests/test_recompute_mlp.py -p no:cacheprovider > $OUT/v2-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "^E  |passed|failed|FAILED" $OUT/v2-pytest.log | head -12
