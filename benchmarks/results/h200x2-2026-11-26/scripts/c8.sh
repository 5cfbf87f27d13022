python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant'
timeout 150 python3 -m pytest -q -m gpu tests/test_fp8_fsdp.py -p no:cacheprovider 2>&1 | grep -E "passed|failed|FAILED|Error" | head -8 | tee $OUT/pytest-g8.log
for ag in "" "--liger.fp8_all_gather false"; do
name=$([ -z "$ag" ] && echo fp8-gather-float8 || echo fp8-gather-bf16)
timeout 200 python3 -m benchmarks finetune --devices 2 --methods lora --n_layer 8 --steps 12 --warmup 4 --micro_batch_size 4 --max_seq_length 1024 --liger_args "--liger.fp8 tensorwise $ag" --out $OUT/$name 2>&1 | grep -v "$F" | tail -4
grep -h "all-gather" -r $OUT/$name /tmp 2>/dev/null | head -2 | cut -c1-300
done
find / -path /proc -prune -o -name stdout.txt -print 2>/dev/null | xargs grep -h "FSDP2 float8 all-gather" 2>/dev/null | cut -c1-300 | sort | uniq | head -4
