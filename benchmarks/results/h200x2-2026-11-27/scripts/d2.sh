# call 2 (issue 46): Llama-3.2-1B LoRA / full, 1 and 2 GPUs with lit-liger's defaults, stock on 2 GPUs; then a longer
# Llama-3.1-8B full fine-tuning run with zero1 (chunked step and broadcast)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
S=$(date +%s)
timeout 210 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora,full --micro_batches 4 --devices 1,2 --variants liger --iters 500 --warmup 100 --work_dir /tmp/work --out $OUT/d2-recipe-1b 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -6
timeout 150 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full,lora --micro_batches 4 --devices 2 --variants stock --iters 40 --warmup 10 --work_dir /tmp/work --out $OUT/d2-recipe-1b-stock 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
V=liger; [ "$MEM" -gt 100000 ] && V=liger-dp-zero1
L=$((575 - $(date +%s) + S)); echo "8B slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.1-8B --methods full --micro_batches 4 --devices 2 --variants $V --iters 200 --warmup 50 --work_dir /tmp/work --out $OUT/d2-recipe-8b-full 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f $OUT/d2-run-$d.txt; echo "== $d"; grep -E "lit-liger: (data parallel|zero1|CUDA graphs:)|Error|out of memory" $f | cut -c1-200 | head -4; done
