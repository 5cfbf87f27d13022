# call 3 (issue 46): Llama-3.1-8B full fine-tuning, zero1, 2 GPUs: the graphs' pool budget without the gradient
# buffers (graphs on, a per-rank profile of iterations 30-41, kernels only) against graphs off
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
run() {  # name devices variant model method iters warmup timeout profile-window
  P=/tmp/o/prof-$1,$9; [ "$9" = noprof ] && P=
  LIT_LIGER_PROFILE=$P timeout $8 python3 -m benchmarks recipe --models $4 --methods $5 --micro_batches 4 --devices $2 --variants $3 --iters $6 --warmup $7 --work_dir /tmp/work --out /tmp/o/e3-recipe-$1 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback\|lit-liger: profile" | cut -c1-260 | tail -4
}
run 8b-full-zero1 2 liger-dp-zero1 Llama-3.1-8B full 200 50 200 30,12
L=$((560 - $(date +%s) + S)); echo "no-graphs slot ${L}s"
run 8b-full-zero1-nographs 2 liger-dp-zero1-no-graphs Llama-3.1-8B full 200 50 $L 30,12
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/e3-run-$d.txt; grep -E "lit-liger: (CUDA graphs)|Error|out of memory|UserWarning" $f | cut -c1-250 | head -6; done
for f in /tmp/o/prof-*/rank*-trace.json; do case $f in *rank0*) gzip $f;; *) rm $f;; esac; done
tar czf $OUT/e3.tgz -C /tmp/o . ; ls -la $OUT
