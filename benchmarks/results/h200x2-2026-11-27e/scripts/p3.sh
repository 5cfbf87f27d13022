# call 3 (issue 47, 2 GPUs): graphs.WARMUP_ONCE as committed (a packed length after a model's first capture is recorded
# without a warm-up pass, guarded against Triton compilations; unpacked shapes still warmed up): GPU tests (packing,
# DDP replicas' pre-capture over NCCL, recapture after a reset), the 1B LoRA / full pairs against every capture warmed
# up (one GPU of the two), and Llama-3.1-8B full fine-tuning zero1 on 2 GPUs (its 17 pre-captured shapes)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/p3.tgz -C /tmp/o . ; }
pt() {  # name timeout args...
n=$1; t=$2; shift 2
timeout $t python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -m gpu "$@" > /tmp/o/p3-pytest-$n.log 2>&1; echo "pytest $n rc=$?"
grep -E "passed|failed|^E |^FAILED" /tmp/o/p3-pytest-$n.log | cut -c1-300 | tail -6; pack; echo "t=$(( $(date +%s) - S ))s"
}
pt packing 40 tests/test_packing.py
pt ddp 100 tests/test_distributed.py
pt buckets 40 tests/test_buckets.py -k "recapture or memory_warmup or accumulation"
rec() {  # name method iters timeout
CUDA_VISIBLE_DEVICES=0 timeout $4 python3 -m benchmarks recipe --models Llama-3.2-1B --methods $2 --micro_batches 4 --variants liger-warmup-each,liger --iters $3 --warmup 40 --work_dir /tmp/work --out /tmp/o/p3-$1 > /tmp/o/p3-$1.log 2>&1; echo "$1 rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f /tmp/o/p3-run-$1-$(basename $(dirname $f)).txt; grep -hE "CUDA graphs:|Error" $f | cut -c1-330; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/p3-$1/recipe.json'))
for r in d['rows']: print('$1', r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_p50','peak_memory_gb','peak_reserved_gb','graph_captures','graph_capture_s','graph_capture_share','graph_warmed')})
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
rec lora lora 200 100
rec full full 200 110
L=$((590 - $(date +%s) + S)); echo "8B full slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.1-8B --methods full --micro_batches 4 --devices 2 --variants liger-dp-zero1 --iters 200 --warmup 50 --work_dir /tmp/work --out /tmp/o/p3-recipe-8b-full 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | cut -c1-260 | tail -3
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/p3-run-$d.txt; grep -E "lit-liger: (CUDA graphs|data parallel|plan)|Error|out of memory|outside the first" $f | cut -c1-330 | head -6; done
pack; echo "t=$(( $(date +%s) - S ))s"
