python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 130 python3 -m pytest -q -s tests/test_fp8_fsdp.py::test_gpu_deepspeed_fp8_tensorwise_two_gpus -p no:cacheprovider > $OUT/m5-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/m5-pytest.log | grep -i "passed\|failed\|Error" | cut -c1-300 | tail -3
timeout 150 python3 -m benchmarks strategies --strategies modelparallel --init meta --variants fp8 --devices 2 --steps 20 --model Llama-3.1-8B --n_layer 4 --micro_batch_size 2 --seq 2048 --timeout 90 --out $OUT/m5-mp8b-auto 2>&1 | grep -v -i "$F" | tail -3
grep -o "float8 all-gather [a-z]*: [^(]*" $OUT/m5-mp8b-auto/strategies.md | head -1
