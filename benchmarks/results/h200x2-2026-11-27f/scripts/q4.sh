# call 4 (2 GPUs): the Adam kernel against PyTorch's fused kernel with the run order fair: a short run first fills the
# Triton cache (call 3's first run of each pair compiled every kernel inside its captures), then lit-liger's kernel
# before PyTorch's: Llama-3.2-1B full fine-tuning on 2 GPUs (replica), Llama-3.1-8B full fine-tuning zero1 on 2 GPUs.
# Per run: the mean iteration in the timed window with and without the iterations over a threshold (captures)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/q4.tgz -C /tmp/o . ; }
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
env "$@" timeout $to python3 -m benchmarks recipe --models $m --methods $me --micro_batches 4 --devices $dv --variants $va --iters $it --warmup $wu --work_dir /tmp/work --out /tmp/o/q4-$n > /tmp/o/q4-$n.log 2>&1; echo "$n rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/q4-run-$n-$d.txt; grep -hE "AdamW steps|keeps its|Error|out of memory" $f | cut -c1-120 | head -2; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/q4-$n/recipe.json'))
for r in d['rows']: print('$n', r.get('devices'), r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_mean','peak_memory_gb','graph_capture_s')}, 'loss', (r.get('losses') or [None])[-2:])
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
rec warm Llama-3.2-1B full 2 liger 70 20 90
rec 1b-own Llama-3.2-1B full 2 liger 300 60 100
rec 1b-torch Llama-3.2-1B full 2 liger 300 60 100 LIT_LIGER_BENCH_OWN_ADAM=0
for f in /tmp/o/q4-run-1b-*.txt; do iters $f 60 100; done
rec 8b-own Llama-3.1-8B full 2 liger-dp-zero1 160 40 200
L=$((590 - $(date +%s) + S)); echo "8B torch slot ${L}s"
rec 8b-torch Llama-3.1-8B full 2 liger-dp-zero1 160 40 $L LIT_LIGER_BENCH_OWN_ADAM=0
for f in /tmp/o/q4-run-8b-*.txt; do iters $f 40 400; done
pack
