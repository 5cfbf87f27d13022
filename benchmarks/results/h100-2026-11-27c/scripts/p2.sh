# call 2 (issue 47): the same pairs after the fix of call 1's failure (an uncaptured first micro-batch cannot allocate
# to the graphs' pool from the default stream: it now runs on the capture stream, as a warm-up does); the GPU tests in
# parts, each with its own time limit
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/p2.tgz -C /tmp/o . ; }
pt() {  # name timeout files...
n=$1; t=$2; shift 2
timeout $t python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -m gpu "$@" > /tmp/o/p2-pytest-$n.log 2>&1; echo "pytest $n rc=$?"
grep -E "passed|failed|^E |^FAILED|growth" /tmp/o/p2-pytest-$n.log | cut -c1-300 | tail -8; pack; echo "t=$(( $(date +%s) - S ))s"
}
pt buckets 170 -s tests/test_buckets.py
pt memplan 100 tests/test_memplan.py
pt packing 60 tests/test_packing.py
rec() {  # name method extra-args iters timeout
timeout $5 python3 -m benchmarks recipe --models Llama-3.2-1B --methods $2 $3 --micro_batches 4 --variants liger-warmup-each,liger --iters $4 --warmup 40 --work_dir /tmp/work --out /tmp/o/p2-$1 > /tmp/o/p2-$1.log 2>&1; echo "$1 rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f /tmp/o/p2-run-$1-$(basename $(dirname $f)).txt; grep -hE "CUDA graphs:|Error" $f | cut -c1-330; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/p2-$1/recipe.json'))
for r in d['rows']: print('$1', r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_p50','peak_memory_gb','peak_reserved_gb','graph_captures','graph_capture_s','graph_capture_share','graph_deferred')})
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
L=$((585 - 240 - $(date +%s) + S)); [ $L -gt 60 ] && rec lora lora "" 200 $L
L=$((585 - $(date +%s) + S)); [ $L -gt 60 ] && rec full full "" 200 $L
