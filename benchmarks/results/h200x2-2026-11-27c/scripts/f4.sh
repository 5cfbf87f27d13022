# call 4 (issue 46): Llama-3.1-8B LoRA 1 and 2 GPUs in one call (the 2-GPU row of call 3 against call 2's 1-GPU row were
# two instances); then the Trainer + LigerCallback under DDP, 1 and 2 GPUs (call 3's 2-GPU run ended at an epoch
# boundary before its last timed batch: the benchmark now counts batches over epochs)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/f4.tgz -C /tmp/o . ; }
timeout 215 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 4 --devices 1,2 --variants liger --iters 200 --warmup 40 --work_dir /tmp/work --out /tmp/o/f4-recipe-8b-lora 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | cut -c1-260 | tail -3
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/f4-run-$d.txt; done; pack
echo "t=$(( $(date +%s) - S ))s"
L=$((395 - $(date +%s) + S)); echo "trainer slot ${L}s"
timeout $L python3 -m benchmarks trainer --devices 2,1 --variants liger --batches 500 --warm 100 --timeout 110 --out /tmp/o/f4-trainer 2>&1 | grep -v -i "$F" | cut -c1-300 | tail -6
pack; echo "t=$(( $(date +%s) - S ))s"
