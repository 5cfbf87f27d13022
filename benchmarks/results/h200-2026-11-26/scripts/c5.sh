python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant'
timeout 150 python3 -m pytest -q -m gpu tests/test_packing.py tests/test_buckets.py -x -p no:cacheprovider 2>&1 | tail -2 | tee $OUT/pytest-g5.log
for it in 100 300; do
timeout 110 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters $it --warmup 40 --variants liger-padded,liger-packed-direct --out $OUT/lora4-$it 2>&1 | grep -v "$F" | tail -2
done
timeout 110 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --iters 100 --warmup 40 --variants liger-padded,liger-packed-direct --out $OUT/full4 2>&1 | grep -v "$F" | tail -2
python3 .gpu/show.py
