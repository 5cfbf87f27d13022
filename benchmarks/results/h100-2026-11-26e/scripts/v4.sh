python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 200 python3 -m pytest -q -s tests/test_fp8_fsdp.py::test_gpu_deepspeed_fp8_tensorwise_two_gpus -p no:cacheprovider > $OUT/v4-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/v4-pytest.log | grep -i "passed\|failed\|Error" | cut -c1-600 | tail -4
timeout 230 python3 -m benchmarks strategies --strategies deepspeed3 --variants bf16,fp8 --devices 2 --steps 20 --model Llama-3.1-8B --n_layer 4 --micro_batch_size 2 --seq 2048 --timeout 100 --out $OUT/v4-ds8b 2>&1 | grep -v -i "$F" | tail -8
