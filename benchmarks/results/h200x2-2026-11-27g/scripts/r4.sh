# call 4 (2 GPUs, the session's last device time): Python's garbage collector in litgpt's loop: Llama-3.2-1B LoRA on 2
# GPUs with the collector as Python runs it (liger-gc) and with the objects alive at the loop's start frozen (the
# default, lit_liger.hostgc); each run's log reports every collection's time. Per run: the iterations over 3x the median
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/r4.tgz -C /tmp/o . ; }
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
env "$@" timeout $to python3 -m benchmarks recipe --models $m --methods $me --micro_batches 4 --devices $dv --variants $va --iters $it --warmup $wu --work_dir /tmp/work --out /tmp/o/r4-$n > /tmp/o/r4-$n.log 2>&1; echo "$n rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/r4-run-$n-$d.txt; grep -hE "garbage collector|dealt by length|Error|out of memory" $f | cut -c1-330 | head -3; done; rm -rf /tmp/work/recipe-runs
python3 -c "
import json; d=json.load(open('/tmp/o/r4-$n/recipe.json'))
for r in d['rows']: print('$n', r.get('devices'), r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_mean','iter_ms_mean_steady','peak_memory_gb','graph_capture_s')}, 'loss', (r.get('losses') or [None])[-2:])
" 2>&1 | tail -2; pack; echo "t=$(( $(date +%s) - S ))s"
}
spikes() { python3 - "$@" <<'PY'
import re, sys, statistics as st
for f in sys.argv[1:]:
    ts = [(int(m.group(1)), float(m.group(2))) for m in (re.search(r"iter (\d+).*?iter time: ([\d.]+)\s*ms", l) for l in open(f)) if m]
    med = st.median(t for _, t in ts)
    print(f.split("/")[-1][:60], "median %.1f ms" % med, "over 3x:", [(i, round(t)) for i, t in ts if t > 3 * med and i > 2])
PY
}
rec gc1 Llama-3.2-1B lora 2 liger-gc 300 60 100
rec freeze1 Llama-3.2-1B lora 2 liger 300 60 75
L=$((235 - $(date +%s) + S)); echo "slot ${L}s"
if [ $L -gt 60 ]; then rec gc2 Llama-3.2-1B lora 2 liger-gc 300 60 $L; fi
spikes /tmp/o/r4-run-*.txt
pack
