# call 1 (2 GPUs): the devices' micro-batches dealt by length (LigerConfig.balance_ranks, the default now) against
# litgpt's order (liger-no-balance), Llama-3.2-1B full fine-tuning and LoRA on 2 GPUs; the token embedding's gradient
# into .grad (liger-embedding-into) on 1 and 2 GPUs, with its GPU test. A short run first fills the Triton cache.
# Per run: the mean iteration in the timed window with and without the iterations over a threshold (captures)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/r1.tgz -C /tmp/o . ; }
iters() {  # file warmup threshold_ms
python3 - "$@" <<'PY'
import re, sys, statistics as st
f, warm, big = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ts = [(int(m.group(1)), float(m.group(2))) for m in (re.search(r"iter (\d+).*?iter time: ([\d.]+)\s*ms", l) for l in open(f)) if m]
w = [t for i, t in ts if i > warm]; clean = [t for t in w if t <= big]
print(f.split("/")[-1][:70], "n", len(w), "mean %.2f ms" % st.mean(w), "without > %g ms: %.2f ms (%d left out, %.0f ms)" % (big, st.mean(clean), len(w) - len(clean), sum(w) - sum(clean)))
PY
}
rec() {  # name models method devices variants iters warmup timeout [env...]
n=$1; shift; m=$1; me=$2; dv=$3; va=$4; it=$5; wu=$6; to=$7; shift 7
env "$@" timeout $to python3 -m benchmarks recipe --models $m --methods $me --micro_batches 4 --devices $dv --variants $va --iters $it --warmup $wu --work_dir /tmp/work --out /tmp/o/r1-$n > /tmp/o/r1-$n.log 2>&1; echo "$n rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/r1-run-$n-$d.txt; grep -hE "dealt by length|Error|out of memory" $f | cut -c1-330 | head -3; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/r1-$n/recipe.json'))
for r in d['rows']: print('$n', r.get('devices'), r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_mean','iter_ms_mean_steady','peak_memory_gb','graph_capture_s')}, 'loss', (r.get('losses') or [None])[-2:])
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
timeout 120 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider "tests/test_buckets.py::test_gpu_full_training_captured_grads_are_the_grad_tensors" > /tmp/o/r1-pytest-emb.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E |^FAILED" /tmp/o/r1-pytest-emb.log | cut -c1-300 | tail -6; pack; echo "t=$(( $(date +%s) - S ))s"
rec warm Llama-3.2-1B full 2 liger 60 20 80
rec full2-nobal Llama-3.2-1B full 2 liger-no-balance 300 60 90
rec full2-bal Llama-3.2-1B full 2 liger 300 60 90
rec full2-emb Llama-3.2-1B full 2 liger-embedding-into 300 60 90
rec full1 Llama-3.2-1B full 1 liger 300 60 90
rec full1-emb Llama-3.2-1B full 1 liger-embedding-into 300 60 90
for f in /tmp/o/r1-run-full*.txt; do iters $f 60 100; done
L=$(( (585 - $(date +%s) + S) / 2 )); echo "LoRA slots ${L}s"
if [ $L -gt 40 ]; then
rec lora2-nobal Llama-3.2-1B lora 2 liger-no-balance 300 60 $L
rec lora2-bal Llama-3.2-1B lora 2 liger 300 60 $L
for f in /tmp/o/r1-run-lora*.txt; do iters $f 60 100; done
fi
pack
