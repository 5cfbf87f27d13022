# call 1 (one GPU): lit-liger's multi-tensor Adam kernel (kernels/adam.py, lit_liger.optim.OWN_KERNEL): GPU tests,
# diag adam-step (torch foreach / fused / lit-liger, Llama-3.2-1B and Llama-3.1-8B's 8-layer shapes), and the 1B full
# fine-tuning recipe against PyTorch's fused kernel (liger-torch-fused-adam)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/q1.tgz -C /tmp/o . ; }
timeout 120 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_adam.py > /tmp/o/q1-pytest-adam.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E |^FAILED" /tmp/o/q1-pytest-adam.log | cut -c1-300 | tail -8; pack; echo "t=$(( $(date +%s) - S ))s"
timeout 150 python3 -m benchmarks diag adam-step /tmp/o/q1-adam-step.json 2>&1 | grep -v "warn" | tail -12; pack; echo "t=$(( $(date +%s) - S ))s"
timeout 200 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --variants liger-torch-fused-adam,liger --iters 200 --warmup 40 --work_dir /tmp/work --out /tmp/o/q1-full > /tmp/o/q1-full.log 2>&1; echo "full rc=$?"
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f /tmp/o/q1-run-full-$(basename $(dirname $f)).txt; grep -hE "steps with|keeps its|Error" $f | cut -c1-250; done
python3 -c "
import json; d=json.load(open('/tmp/o/q1-full/recipe.json'))
for r in d['rows']: print(r['variant'], {k: r.get(k) for k in ('status','tokens_per_s','mfu_nominal','iter_ms_p50','peak_memory_gb','graph_capture_share')})
" 2>&1 | tail -3; pack; echo "t=$(( $(date +%s) - S ))s"
