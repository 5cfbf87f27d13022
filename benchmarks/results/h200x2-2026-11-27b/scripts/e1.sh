# call 1 (issue 46): the replica's optimizer step overlapped with the last all-reduces (OVERLAP_STEP) on Llama-3.2-1B
# full fine-tuning, 1 and 2 GPUs, with a per-rank profile of iterations 60-75 (untimed warm-up); then 8B LoRA 1 and 2 GPUs
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=60
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
timeout 90 python3 -m pytest -q tests/test_distributed.py -k "gpu_replica" -p no:cacheprovider > /tmp/o/e1-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" /tmp/o/e1-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -4
run() {  # name devices variant model method iters warmup timeout
  P=/tmp/o/prof-$1,60,16; [ "$9" = noprof ] && P=
  LIT_LIGER_PROFILE=$P timeout $8 python3 -m benchmarks recipe --models $4 --methods $5 --micro_batches 4 --devices $2 --variants $3 --iters $6 --warmup $7 --work_dir /tmp/work --out /tmp/o/e1-recipe-$1 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback\|lit-liger: profile" | cut -c1-260 | tail -4
}
run full-1gpu 1 liger Llama-3.2-1B full 500 100 100
run full-2gpu 2 liger Llama-3.2-1B full 500 100 100
run full-2gpu-after 2 liger-step-after-reduce Llama-3.2-1B full 500 100 100
run full-2gpu-zero1 2 liger-dp-zero1 Llama-3.2-1B full 500 100 100
run 8b-lora 1,2 liger Llama-3.1-8B lora 160 40 230 noprof
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/e1-run-$d.txt; grep -E "lit-liger: (data parallel|zero1|CUDA graphs)|Error|out of memory" $f | cut -c1-200 | head -3; done
ls -la /tmp/o/prof-* | head -20; gzip /tmp/o/prof-*/rank*-trace.json; rm -f /tmp/o/prof-full-2gpu-zero1/*trace* /tmp/o/prof-full-1gpu/*trace*
tar czf $OUT/e1.tgz -C /tmp/o . ; ls -la $OUT
