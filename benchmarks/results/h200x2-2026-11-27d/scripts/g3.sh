# call 3 (issue 46): torch's DDP GPU test with the 2-sample micro-batch outside the first step's ladder expected; then
# Llama-3.1-8B full fine-tuning, zero1 (as an 80 GB card would get), 2 GPUs, no profiler: the steady state that the
# last session derived (~33.7%) measured as a row, now that the unpacked full batch is pre-captured too
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/g3.tgz -C /tmp/o . ; }
timeout 90 python3 -m pytest -q tests/test_distributed.py -m gpu -k ddp_replica -p no:cacheprovider > /tmp/o/g3-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" /tmp/o/g3-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -4; pack
echo "t=$(( $(date +%s) - S ))s"
L=$((440 - $(date +%s) + S)); echo "8B full slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.1-8B --methods full --micro_batches 4 --devices 2 --variants liger-dp-zero1 --iters 200 --warmup 50 --work_dir /tmp/work --out /tmp/o/g3-recipe-8b-full 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | cut -c1-260 | tail -3
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/g3-run-$d.txt; grep -E "lit-liger: (CUDA graphs|data parallel|plan)|Error|out of memory|outside the first" $f | cut -c1-250 | head -6; done
pack; echo "t=$(( $(date +%s) - S ))s"
