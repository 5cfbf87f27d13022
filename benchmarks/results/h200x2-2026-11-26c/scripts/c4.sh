python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=60
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -q tests/test_distributed.py -k "gpu_replica" -p no:cacheprovider > $OUT/c4-pytest.log 2>&1; echo "pytest rc=$?"
grep -i "passed\|failed\|assert" $OUT/c4-pytest.log | grep -v -i warn | cut -c1-300 | tail -6
timeout 60 python3 -m pytest -q tests/test_distributed.py -k "gpu_ddp" -p no:cacheprovider > $OUT/c4-pytest-ddp.log 2>&1; echo "pytest ddp rc=$?"
grep -i "passed\|failed\|Error" $OUT/c4-pytest-ddp.log | grep -v -i warn | cut -c1-400 | tail -12
