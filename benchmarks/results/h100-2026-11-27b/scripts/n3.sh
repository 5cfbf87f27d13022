# call 3 (issue 47): QLoRA 1B again, the two variants in the other order and twice (call 2: defaults 2.9% under
# liger-no-plan, with a better p50): run-to-run spread against the governance's cost
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
for i in 1 2; do
timeout 250 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --quantize bnb.nf4-dq --micro_batches 4 --variants liger,liger-no-plan --iters 300 --warmup 40 --work_dir /tmp/work --out /tmp/o/n3-1b-qlora-$i > /tmp/o/n3-1b-qlora-$i.log 2>&1; echo "qlora $i rc=$?"
grep -i "tok/s" /tmp/o/n3-1b-qlora-$i.log | tail -3 | cut -c1-250; rm -rf /tmp/work/recipe-runs; tar czf $OUT/n3.tgz -C /tmp/o . ; echo "t=$(( $(date +%s) - S ))s"
done
