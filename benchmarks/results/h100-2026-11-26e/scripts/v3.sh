python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 200 python3 -m pytest -q -s tests/test_fp8_fsdp.py::test_gpu_deepspeed_fp8_tensorwise_two_gpus -p no:cacheprovider > $OUT/v3-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/v3-pytest.log | grep -i "passed\|failed\|Error\|torchao_gemms" | cut -c1-3000 | tail -6
