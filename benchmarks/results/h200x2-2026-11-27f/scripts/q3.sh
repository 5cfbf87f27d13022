# call 3 (2 GPUs): lit-liger's Adam kernel (kernels/adam.py) against PyTorch's fused kernel (liger-torch-fused-adam):
# Llama-3.2-1B full fine-tuning on 1 and 2 GPUs (the replica plan) through litgpt's CLI; the Trainer under FSDP2
# (ModelParallelStrategy), where the switch now takes DTensors (bf16) against the AdamW as built (bf16-foreach-adam);
# GPU tests of the kernel
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/q3.tgz -C /tmp/o . ; }
timeout 70 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_adam.py > /tmp/o/q3-pytest-adam.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^FAILED" /tmp/o/q3-pytest-adam.log | cut -c1-300 | tail -4; pack; echo "t=$(( $(date +%s) - S ))s"
timeout 330 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --devices 1,2 --variants liger-torch-fused-adam,liger --iters 240 --warmup 60 --work_dir /tmp/work --out /tmp/o/q3-recipe-full > /tmp/o/q3-recipe-full.log 2>&1; echo "full rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/q3-run-$d.txt; grep -hE "steps with|keeps its|lit-liger: data parallel|Error" $f | cut -c1-200 | head -3; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/q3-recipe-full/recipe.json'))
for r in d['rows']: print(r.get('devices'), r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','scaling_efficiency','iter_ms_p50','peak_memory_gb')}, 'losses', (r.get('losses') or [None])[:1], (r.get('losses') or [None])[-2:])
" 2>&1 | tail -5; pack; echo "t=$(( $(date +%s) - S ))s"
L=$((585 - $(date +%s) + S)); echo "strategies slot ${L}s"
timeout $L python3 -m benchmarks strategies --strategies modelparallel --variants bf16,bf16-foreach-adam --devices 2 --steps 30 --timeout 100 --out /tmp/o/q3-strategies > /tmp/o/q3-strategies.log 2>&1; echo "strategies rc=$?"
grep -v -i "$F" /tmp/o/q3-strategies.log | tail -8 | cut -c1-250; cat /tmp/o/q3-strategies/strategies.md 2>/dev/null | head -12; pack; echo "t=$(( $(date +%s) - S ))s"
