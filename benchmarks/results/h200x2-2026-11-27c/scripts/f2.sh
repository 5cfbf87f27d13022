# call 2 (issue 46): after the fixes (Lightning's per-batch SIGTERM broadcast read one batch later; DDP replicas
# pre-capture their lengths; the unpacked full batch pre-captured): the Trainer + LigerCallback under DDP, 1 and 2 GPUs,
# with per-rank profiles inside the warm-up; Llama-3.1-8B LoRA recipe 1 and 2 GPUs; the DDP capture diagnostic
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
pack() { tar czf $OUT/f2.tgz -C /tmp/o . ; }
LIT_LIGER_PROFILE=/tmp/o/prof-trainer,60,16 timeout 240 python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 600 --warm 100 --out /tmp/o/f2-trainer 2>&1 | grep -v -i "$F" | cut -c1-300 | tail -12
grep -h "profile rank\|pre-capture\|captured at the first" /tmp/o/f2-trainer/*.log | cut -c1-250; rm -f /tmp/o/prof-trainer/*trace*; pack
echo "t=$(( $(date +%s) - S ))s"
timeout 250 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 4 --devices 1,2 --variants liger --iters 240 --warmup 60 --work_dir /tmp/work --out /tmp/o/f2-recipe-8b-lora 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | cut -c1-260 | tail -3
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f /tmp/o/f2-run-$d.txt; grep -E "lit-liger: CUDA graphs|Error|out of memory" $f | cut -c1-260 | head -4; done
pack; echo "t=$(( $(date +%s) - S ))s"
L=$((540 - $(date +%s) + S)); echo "diag slot ${L}s"
timeout $L python3 -m benchmarks diag ddp-capture default no-buffers > /tmp/o/f2-ddp-capture.log 2>&1
grep '^{' /tmp/o/f2-ddp-capture.log | cut -c1-250; grep -B2 -A2 "Error" /tmp/o/f2-ddp-capture.log | cut -c1-200 | head -24; pack
