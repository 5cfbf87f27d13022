python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 150 python3 -m pytest -q -s tests/test_fp8_fsdp.py::test_gpu_deepspeed_fp8_tensorwise_two_gpus -p no:cacheprovider > $OUT/m3-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/m3-pytest.log | grep -i "passed\|failed\|Error\|{'float8" | cut -c1-1500 | tail -5
CUDA_VISIBLE_DEVICES=0 timeout 380 python3 -m benchmarks convergence --fp8 tensorwise,rowwise --n_layer 4 --n_embd 2048 --n_head 32 --n_query_groups 8 --intermediate_size 8192 --batch_size 16 --seq_len 512 --lr 3e-4 --out $OUT/m3-conv-1bw 2>&1 | grep -v -i "$F" | tail -12
