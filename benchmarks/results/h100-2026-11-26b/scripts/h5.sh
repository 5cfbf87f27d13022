python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
F='warn\|Failed to load\|register_constant'
LIT_LIGER_BENCH_SYNC_DEBUG=$OUT/syncs-full.txt timeout 150 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --iters 300 --warmup 40 --variants liger --out $OUT/full-syncdebug 2>&1 | grep -v "$F" | tail -1
LIT_LIGER_BENCH_SYNC_DEBUG=$OUT/syncs-lora.txt timeout 150 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --iters 300 --warmup 40 --variants liger --out $OUT/lora-syncdebug 2>&1 | grep -v "$F" | tail -1
for f in $OUT/syncs-*.txt; do echo "#### $f"; grep -c "===" $f; awk '/^=== /{n++} n<=4' $f | grep -v "^$" | grep "===\|File" | head -40; done
