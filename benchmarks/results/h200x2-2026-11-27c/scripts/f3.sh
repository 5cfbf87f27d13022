# call 3 (issue 46): the Trainer + LigerCallback under DDP, 1 and 2 GPUs, graphs on (call 2's profile hook on the GPT
# had turned them off), per-rank profiles inside the warm-up; Llama-3.1-8B LoRA on 2 GPUs with per-rank profiles (call
# 2's step iterations took 150-300 ms against 70-100 in h200x2-2026-11-27b); each GPU's clocks and throttle reasons
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader
nvidia-smi topo -m | head -4
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/f3.tgz -C /tmp/o . ; }
LIT_LIGER_PROFILE=/tmp/o/prof-trainer,60,16 timeout 230 python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 600 --warm 100 --out /tmp/o/f3-trainer 2>&1 | grep -v -i "$F" | cut -c1-300 | tail -8
grep -h "profile rank\|pre-capture\|captured at the first\|input shapes" /tmp/o/f3-trainer/*.log | cut -c1-250; rm -f /tmp/o/prof-trainer/*trace*; pack
echo "t=$(( $(date +%s) - S ))s"
L=$((440 - $(date +%s) + S)); echo "8B slot ${L}s"
LIT_LIGER_PROFILE=/tmp/o/prof-8b-lora,20,12 timeout $L python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 4 --devices 2 --variants liger --iters 200 --warmup 40 --work_dir /tmp/work --out /tmp/o/f3-recipe-8b-lora2 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback\|profile rank" | cut -c1-260 | tail -4
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/f3-run-$d.txt; done
rm -f /tmp/o/prof-8b-lora/*trace*; pack
nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader
echo "t=$(( $(date +%s) - S ))s"
