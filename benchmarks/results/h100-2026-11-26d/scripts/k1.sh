python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
export PYTHONPATH=/tmp/site:.
for v in lit-liger+fp8-tensorwise+compile lit-liger+compile; do
  timeout 170 python3 .gpu/mem8b.py $v $OUT/mem8b-$v.json 2>&1 | grep -v -i "$F" | tail -26
done
timeout 230 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 200 --warmup 40 --variants liger,liger-fp8 --out $OUT/lora4-fp8 2>&1 | grep -v "$F" | tail -3
