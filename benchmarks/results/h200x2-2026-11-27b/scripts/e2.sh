# call 2 (issue 46): Llama-3.1-8B full fine-tuning with zero1 (now each step chunk waits for its own all-reduces) and
# 8B LoRA on 2 GPUs, each with a per-rank profile of untimed warm-up iterations (LIT_LIGER_PROFILE)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
run() {  # name devices variant model method iters warmup timeout profile-window
  LIT_LIGER_PROFILE=/tmp/o/prof-$1,$9 timeout $8 python3 -m benchmarks recipe --models $4 --methods $5 --micro_batches 4 --devices $2 --variants $3 --iters $6 --warmup $7 --work_dir /tmp/work --out /tmp/o/e2-recipe-$1 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback\|lit-liger: profile" | cut -c1-260 | tail -4
}
run 8b-lora-2gpu 2 liger Llama-3.1-8B lora 100 30 150 12,12
L=$((540 - $(date +%s) + S)); echo "8B full slot ${L}s"
run 8b-full-zero1 2 liger-dp-zero1 Llama-3.1-8B full 200 50 $L 20,12
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/e2-run-$d.txt; grep -E "lit-liger: (data parallel|zero1|CUDA graphs)|Error|out of memory" $f | cut -c1-200 | head -4; done
for f in /tmp/o/prof-*/rank*-trace.json; do case $f in *rank0*) gzip $f;; *) rm $f;; esac; done; ls -la /tmp/o/prof-*
tar czf $OUT/e2.tgz -C /tmp/o . ; ls -la $OUT
