# call 4 (issue 47): QLoRA (bitsandbytes 4-bit weights) with graphs.WARMUP_ONCE: its GPU tests, and the 1B QLoRA pair
# against every capture warmed up, same instance
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/p4.tgz -C /tmp/o . ; }
timeout 60 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -m gpu tests/test_qlora.py > /tmp/o/p4-pytest-qlora.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E |^FAILED" /tmp/o/p4-pytest-qlora.log | cut -c1-300 | tail -6; pack; echo "t=$(( $(date +%s) - S ))s"
L=$((265 - $(date +%s) + S)); echo "qlora slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --quantize bnb.nf4-dq --micro_batches 4 --variants liger-warmup-each,liger --iters 200 --warmup 40 --work_dir /tmp/work --out /tmp/o/p4-qlora > /tmp/o/p4-qlora.log 2>&1; echo "qlora rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f /tmp/o/p4-run-qlora-$(basename $(dirname $f)).txt; grep -hE "CUDA graphs|Error" $f | cut -c1-330; done
python3 -c "
import json; d=json.load(open('/tmp/o/p4-qlora/recipe.json'))
for r in d['rows']: print('qlora', r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_p50','peak_memory_gb','peak_reserved_gb','graph_captures','graph_capture_s','graph_capture_share','graph_warmed')})
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
