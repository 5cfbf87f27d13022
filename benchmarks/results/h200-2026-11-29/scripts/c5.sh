# call 5: a run past lit_liger.buckets.FINE_LADDER_MIN (2,000): 2,400 iterations of Llama-3.2-1B LoRA, tok/s over the
# whole loop but its first 5 iterations (the first run on a machine compiles the Triton kernels), coarse ladder first
CALL=c5; . benchmarks/calls.sh
rec lora Llama-3.2-1B lora 1 liger-coarse-ladder,liger 2400 5 400; pack
grep -h "buckets per doubling\|input shapes captured\|padding (" /tmp/o/c5-run-*.txt | cut -c1-300
logs /tmp/o/c5-run-*.txt; pack
