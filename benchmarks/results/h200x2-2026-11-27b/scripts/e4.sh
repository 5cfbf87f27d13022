# call 4 (issue 46): zero1 with point-to-point gradients and parameters (ZERO1_P2P), 2 GPUs: Llama-3.1-8B full
# fine-tuning (profile of iterations 30-41, kernels only), then Llama-3.2-1B full fine-tuning; a tarball after each
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
run() {  # name devices variant model method iters warmup timeout profile-window
  P=/tmp/o/prof-$1,$9; [ "$9" = noprof ] && P=
  LIT_LIGER_PROFILE=$P timeout $8 python3 -m benchmarks recipe --models $4 --methods $5 --micro_batches 4 --devices $2 --variants $3 --iters $6 --warmup $7 --work_dir /tmp/work --out /tmp/o/e4-recipe-$1 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback\|lit-liger: profile" | cut -c1-260 | tail -4
  for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/e4-run-$d.txt; done
  for f in /tmp/o/prof-*/rank*-trace.json; do [ -f $f ] && case $f in *rank0*) gzip $f;; *) rm $f;; esac; done
  tar czf $OUT/e4.tgz -C /tmp/o .
}
run 8b-full-zero1 2 liger-dp-zero1 Llama-3.1-8B full 160 40 250 30,12
L=$((370 - $(date +%s) + S)); echo "1B slot ${L}s"
run 1b-full-zero1 2 liger-dp-zero1 Llama-3.2-1B full 300 60 $L 30,16
grep -h -E "lit-liger: (CUDA graphs|zero1)|Error|out of memory|UserWarning: lit" /tmp/o/e4-run-*.txt | cut -c1-220 | head -8
