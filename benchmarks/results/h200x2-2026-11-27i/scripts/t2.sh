# call 2 (2 GPUs): issue 47's captures with a micro-batch without padding packed (packing.PACK_FULL, new) against it
# unpacked as its own shape (liger-unpacked-full, the code before), Llama-3.2-1B LoRA on 2 GPUs after a warm run; then
# issue 46's Llama-3.1-8B full fine-tuning zero1 with memplan.STATE_AHEAD, as on an 80 GB card where the call is served
# H200s (liger-dp-zero1-80gb: the allocator capped at 77.19 GiB, the memory plans told 79.19 GiB).
CALL=t2; . benchmarks/calls.sh
rec warm Llama-3.2-1B lora 2 liger 40 10 90
rec lora2 Llama-3.2-1B lora 2 liger-unpacked-full,liger 300 60 200
L=$((580 - $(date +%s) + S)); echo "8B slot ${L}s"
V=liger-dp-zero1-80gb; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && V=liger-dp-zero1
rec 8b-full Llama-3.1-8B full 2 $V 150 40 $L
grep -h "CUDA graphs:\|run as a\|data-parallel plan\|STATE\|released" /tmp/o/t2-run-*.txt | cut -c1-500
logs /tmp/o/t2-run-*.txt
pack; echo "t=$(( $(date +%s) - S ))s"
