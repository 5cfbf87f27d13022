# call 1 (issue 47): the memory plan at MEMORY_FRACTION 0.75 with its MLP level: 16k-token documents (the issue's
# targets: completes with merge_lora, >= 1.2x stock's 9,496 tok/s, peak <= 64 GB), the GPU tests of the plan, the 1B
# LoRA headline recipe with and without issue 47's governance (same instance), then 32k if time is left
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/n1.tgz -C /tmp/o . ; }
long() {  # tokens timeout
timeout $2 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 1 --lengths long --max_seq_length $1 --block_size 32768 --global_batch 1 --iters 8 --warmup 2 --variants liger --work_dir /tmp/work --out /tmp/o/n1-$1 > /tmp/o/n1-$1.log 2>&1; echo "recipe $1 rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f /tmp/o/n1-run-$1-$(basename $(dirname $f)).txt; grep -E "lit-liger: (memory plan|training ended)|Error|Saved merged" $f | cut -c1-250 | head -5; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/n1-$1/recipe.json'))
for r in d['rows']: print($1, {k: r.get(k) for k in ('status','completed','tokens_per_s','mfu_nominal','mfu_nominal_with_attention','peak_memory_gb','peak_reserved_gb','iter_ms_p50')})
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
long 16384 230
timeout 120 python3 -m pytest -q tests/test_memplan.py -m gpu -p no:cacheprovider > /tmp/o/n1-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E " /tmp/o/n1-pytest.log | cut -c1-300 | tail -6; pack; echo "t=$(( $(date +%s) - S ))s"
L=$((470 - $(date +%s) + S)); echo "1B slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 --variants liger-no-plan,liger --iters 200 --warmup 40 --work_dir /tmp/work --out /tmp/o/n1-1b-lora > /tmp/o/n1-1b-lora.log 2>&1; echo "1B rc=$?"
grep -i "tok/s" /tmp/o/n1-1b-lora.log | tail -4 | cut -c1-250; rm -rf /tmp/work/recipe-runs; pack; echo "t=$(( $(date +%s) - S ))s"
L=$((585 - $(date +%s) + S)); echo "32k slot ${L}s"
[ $L -gt 90 ] && long 32768 $L
