# call 2: the one-GPU graph tests after the capture code's refactor (graphs._capture), then issue 47's 16k row with
# --liger.activation_checkpointing true (Llama-3.1-8B LoRA, micro-batch 1, documents fill 16k)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -q tests/test_buckets.py -m gpu -p no:cacheprovider > $OUT/m2-pytest-buckets.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed" $OUT/m2-pytest-buckets.log | tail -2
timeout 270 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 1 --lengths long --max_seq_length 16384 --block_size 16384 --global_batch 1 --iters 5 --warmup 2 --variants liger-ckpt --work_dir /tmp/work --out $OUT/m2-16k-ckpt > $OUT/m2-16k-ckpt.log 2>&1; echo "recipe rc=$?"
grep -i "tok/s" $OUT/m2-16k-ckpt.log | tail -2 | cut -c1-300
