# call 6: the capture report's first warm-up, on a fresh machine (no Triton disk cache): Llama-3.2-1B LoRA and full,
# 200 iterations; then the GPU tests of the graphs' governance
CALL=c6; . benchmarks/calls.sh
rec lora Llama-3.2-1B lora,full 1 liger 200 40 240; pack
grep -h "input shapes captured" /tmp/o/c6-run-*.txt | cut -c1-420
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_memplan.py -m gpu -k "not long_document" 2>&1 | tail -3
pack
