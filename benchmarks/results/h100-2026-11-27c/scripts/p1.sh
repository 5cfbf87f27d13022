# call 1 (issue 47: capture time <= 5% of a recipe's run): graphs.WARMUP_ONCE (a later shape's first micro-batch is its
# warm-up, captured at its second without a warm-up pass) against every capture warmed up (liger-warmup-each), same
# instance, Llama-3.2-1B LoRA / full / QLoRA micro-batch 4; the GPU tests of the graphs
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/p1.tgz -C /tmp/o . ; }
timeout 230 python3 -m pytest -q -rs tests/test_memplan.py tests/test_buckets.py tests/test_packing.py tests/test_qlora.py tests/test_attention.py -m gpu -p no:cacheprovider -s > /tmp/o/p1-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E |^FAILED|growth" /tmp/o/p1-pytest.log | cut -c1-300 | tail -14; pack; echo "t=$(( $(date +%s) - S ))s"
rec() {  # name method extra-args iters
timeout $5 python3 -m benchmarks recipe --models Llama-3.2-1B --methods $2 $3 --micro_batches 4 --variants liger-warmup-each,liger --iters $4 --warmup 40 --work_dir /tmp/work --out /tmp/o/p1-$1 > /tmp/o/p1-$1.log 2>&1; echo "$1 rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do grep -hE "CUDA graphs:" $f | cut -c1-330; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/p1-$1/recipe.json'))
for r in d['rows']: print('$1', r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_p50','peak_reserved_gb','graph_captures','graph_capture_s','graph_capture_share','graph_deferred')})
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
rec lora lora "" 200 110
rec full full "" 200 130
L=$((590 - $(date +%s) + S)); echo "qlora slot ${L}s"
[ $L -gt 60 ] && rec qlora lora "--quantize bnb.nf4-dq" 200 $L
