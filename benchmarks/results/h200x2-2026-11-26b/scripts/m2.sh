python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 220 python3 -m pytest -q -s tests/test_float8.py tests/test_fp8.py tests/test_fp8_fsdp.py::test_gpu_fsdp2_float8_all_gather_two_gpus tests/test_fp8_fsdp.py::test_gpu_deepspeed_fp8_tensorwise_two_gpus -p no:cacheprovider > $OUT/m2-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/m2-pytest.log | grep -i "passed\|failed\|error\|{'losses" | cut -c1-900 | tail -8
timeout 170 python3 -m benchmarks strategies --strategies modelparallel --init meta --variants fp8,fp8-bf16-gather --devices 2 --steps 20 --model Llama-3.1-8B --n_layer 4 --micro_batch_size 2 --seq 2048 --timeout 80 --out $OUT/m2-mp8b 2>&1 | grep -v -i "$F" | tail -7
timeout 200 python3 -m benchmarks strategies --strategies deepspeed3 --variants fp8 --devices 2 --steps 20 --model Llama-3.1-8B --n_layer 4 --micro_batch_size 2 --seq 2048 --timeout 95 --out $OUT/m2-ds8b 2>&1 | grep -v -i "$F" | tail -6
