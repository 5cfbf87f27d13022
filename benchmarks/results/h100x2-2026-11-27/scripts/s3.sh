# call 3 (2 GPUs, issue 46's rows not measured with this week's defaults: the deal, the embedding's kernel, the
# collector frozen, the pre-capture from the data's lengths): Llama-3.1-8B LoRA on 1 and 2 GPUs (1.86x before,
# ../h200x2-2026-11-27c f4), then the Trainer + LigerCallback under strategy="ddp", LoRA, 1 and 2 GPUs (1.83-1.84x,
# ../h200x2-2026-11-27d) in the time left.
CALL=s3; . benchmarks/calls.sh
rec 8b-lora Llama-3.1-8B lora 1,2 liger 200 40 260
L=$((560 - $(date +%s) + S)); echo "trainer slot ${L}s"
timeout $L python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 500 --warm 100 --timeout 95 \
  --out /tmp/o/s3-trainer > /tmp/o/s3-trainer.log 2>&1; echo "trainer rc=$?"; grep "^{" /tmp/o/s3-trainer.log | cut -c1-400
grep -h "garbage collector\|input shapes captured" /tmp/o/s3-trainer/*.log 2>/dev/null | cut -c1-300 | head -4
logs /tmp/o/s3-run-*.txt
pack; echo "t=$(( $(date +%s) - S ))s"
