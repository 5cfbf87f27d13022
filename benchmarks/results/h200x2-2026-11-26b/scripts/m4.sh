python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
for ag in "" "--liger.fp8_all_gather false"; do
name=$([ -z "$ag" ] && echo m4-lora-gather-float8 || echo m4-lora-gather-bf16)
timeout 175 python3 -m benchmarks finetune --devices 2 --methods lora --n_layer 8 --steps 10 --warmup 3 --micro_batch_size 4 --max_seq_length 1024 --liger_args "--liger.fp8 tensorwise $ag" --out $OUT/$name 2>&1 | grep -v "$F" | tail -4
done
