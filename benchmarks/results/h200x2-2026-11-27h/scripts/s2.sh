# call 2 (2 GPUs): the final design of issue 47's replica pre-capture. The first step pre-captures the packed lengths
# the dealt data is expected to give each process at least 0.5 times (graphs.PRECAPTURE_MIN_COUNT), any other shape is
# captured when it comes (graphs.CAPTURE_AFTER 1), against the whole ladder (liger-precapture-all). Llama-3.2-1B LoRA
# and full fine-tuning after a warm run, then Llama-3.1-8B full fine-tuning zero1 (17 shapes, 5.23 s before:
# ../h200x2-2026-11-27e p3) in the time left.
CALL=s2; . benchmarks/calls.sh
rec warm Llama-3.2-1B lora 2 liger 60 10 90
rec lora2 Llama-3.2-1B lora 2 liger,liger-precapture-all 300 60 200
rec full2 Llama-3.2-1B full 2 liger,liger-precapture-all 300 60 220
L=$((585 - $(date +%s) + S)); echo "8B slot ${L}s"
rec 8b-full Llama-3.1-8B full 2 liger-dp-zero1 200 50 $L
grep -h "CUDA graphs:" /tmp/o/s2-run-*.txt | cut -c1-600
logs /tmp/o/s2-run-*.txt
pack; echo "t=$(( $(date +%s) - S ))s"
