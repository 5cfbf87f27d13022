# call 4: the run-length ladder through litgpt's CLI: 1,000 micro-batches (8 buckets per doubling by default now)
# against the same with the coarse ladder forced (liger-coarse-ladder), Llama-3.2-1B LoRA and full fine-tuning
CALL=c4; . benchmarks/calls.sh
rec lora Llama-3.2-1B lora 1 liger,liger-coarse-ladder 1000 200 270; pack
rec full Llama-3.2-1B full 1 liger,liger-coarse-ladder 1000 200 290; pack
grep -h "buckets per doubling\|input shapes captured\|padding (" /tmp/o/c4-run-*.txt | cut -c1-300
logs /tmp/o/c4-run-*.txt; pack
