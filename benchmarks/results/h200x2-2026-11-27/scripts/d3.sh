# call 3 (issue 46): what call 2's time slots cut: Llama-3.2-1B full fine-tuning 1 and 2 GPUs (defaults), stock LoRA on 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
timeout 230 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --devices 1,2 --variants liger --iters 500 --warmup 100 --work_dir /tmp/work --out /tmp/o/d3-recipe-1b-full 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
timeout 100 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --devices 2 --variants stock --iters 30 --warmup 10 --work_dir /tmp/work --out /tmp/o/d3-recipe-1b-lora-stock 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -4
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/d3-run-$d.txt; grep -E "lit-liger: (data parallel|CUDA graphs:)|Error|out of memory" $f | cut -c1-200 | head -3; done
tar czf $OUT/d3.tgz -C /tmp/o .
