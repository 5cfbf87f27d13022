# call 3 (2 GPUs): issue 46's Llama-3.1-8B full fine-tuning zero1 as on an 80 GB card again, after call 2's run released
# every graph: the capture's gradient buffers are no longer counted twice (memplan.grads_to_come) and the room after a
# capture is graphs.ROOM_FRACTION (0.9) of the card; then (time left) call 2's Llama-3.2-1B LoRA pair in the other order.
CALL=t3; . benchmarks/calls.sh
V=liger-dp-zero1-80gb; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && V=liger-dp-zero1
rec 8b-full Llama-3.1-8B full 2 $V 150 40 330
grep -h "CUDA graphs\|run as a\|released" /tmp/o/t3-run-*.txt | cut -c1-700
L=$((555 - $(date +%s) + S)); echo "1B slot ${L}s"
if [ $L -gt 170 ]; then
  rec warm Llama-3.2-1B lora 2 liger 30 10 70
  L=$((555 - $(date +%s) + S)); rec lora2 Llama-3.2-1B lora 2 liger,liger-unpacked-full 300 60 $L
  grep -h "CUDA graphs: .* input shapes captured" /tmp/o/t3-run-lora2-*.txt | cut -c1-330
fi
logs /tmp/o/t3-run-*.txt
pack; echo "t=$(( $(date +%s) - S ))s"
