# call 2 (issue 47): the other headline recipes with and without issue 47's governance (memory plan, capture bound),
# same instance: Llama-3.2-1B full fine-tuning and QLoRA (bnb.nf4-dq), micro-batch 4
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/n2.tgz -C /tmp/o . ; }
timeout 260 python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 --variants liger-no-plan,liger --iters 300 --warmup 40 --work_dir /tmp/work --out /tmp/o/n2-1b-full > /tmp/o/n2-1b-full.log 2>&1; echo "full rc=$?"
grep -i "tok/s" /tmp/o/n2-1b-full.log | tail -3 | cut -c1-250; rm -rf /tmp/work/recipe-runs; pack; echo "t=$(( $(date +%s) - S ))s"
L=$((570 - $(date +%s) + S)); echo "qlora slot ${L}s"
timeout $L python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --quantize bnb.nf4-dq --micro_batches 4 --variants liger-no-plan,liger --iters 300 --warmup 40 --work_dir /tmp/work --out /tmp/o/n2-1b-qlora > /tmp/o/n2-1b-qlora.log 2>&1; echo "qlora rc=$?"
grep -i "tok/s" /tmp/o/n2-1b-qlora.log | tail -3 | cut -c1-250; pack; echo "t=$(( $(date +%s) - S ))s"
