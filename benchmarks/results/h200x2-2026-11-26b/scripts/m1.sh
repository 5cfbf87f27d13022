python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import deepspeed, torchao; print('deepspeed', deepspeed.__version__, 'torchao', torchao.__version__)" 2>&1 | tail -1
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 200 python3 -m pytest -q -s tests/test_fp8_fsdp.py -k "gpu" -p no:cacheprovider > $OUT/m1-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/m1-pytest.log | grep -i "passed\|failed\|error\|{'float8" | tail -8
timeout 200 python3 -m benchmarks strategies --strategies modelparallel --init meta --variants bf16,fp8,fp8-bf16-gather --devices 2 --steps 20 --model Llama-3.1-8B --n_layer 4 --micro_batch_size 2 --seq 2048 --timeout 90 --out $OUT/m1-mp8b 2>&1 | grep -v -i "$F" | tail -9
timeout 150 python3 -m benchmarks strategies --strategies deepspeed3 --variants bf16,fp8 --devices 2 --steps 20 --model Llama-3.1-8B --n_layer 4 --micro_batch_size 2 --seq 2048 --timeout 100 --out $OUT/m1-ds8b 2>&1 | grep -v -i "$F" | tail -7
