python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
for seed in 1234 7; do
timeout 280 python3 -m benchmarks convergence --fp8 tensorwise,rowwise --n_layer 4 --n_embd 2048 --n_head 32 --n_query_groups 8 --intermediate_size 8192 --batch_size 16 --seq_len 512 --lr 3e-4 --seed $seed --out $OUT/v1-conv-1bw-s$seed 2>&1 | grep -v -i "$F" | tail -14
done
