python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
export PYTHONPATH=/tmp/site:.
TORCH_LOGS=aot_graphs timeout 100 python3 .gpu/mem8b.py lit-liger+fp8-tensorwise+compile $OUT/mem1l-fp8c.json 1 > $OUT/mem1l-fp8c.out 2> $OUT/aot1l-fp8c.log; tail -30 $OUT/mem1l-fp8c.out
timeout 150 python3 .gpu/mem8b.py lit-liger+fp8-tensorwise+compile $OUT/mem8b-fp8c.json 2>&1 | grep -v -i "$F" | grep -v "^     \|kernels:"
timeout 100 python3 .gpu/mem8b.py lit-liger+fp8-tensorwise $OUT/mem8b-fp8e.json 2>&1 | grep -v -i "$F" | grep -v "^     \|kernels:"
timeout 200 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --iters 120 --warmup 30 --variants liger,liger-fp8 --out $OUT/full4-fp8 2>&1 | grep -v "$F" | tail -3
