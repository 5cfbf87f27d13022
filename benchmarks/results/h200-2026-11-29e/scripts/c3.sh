# call c3: lit_liger.decode (generation's one-token KV-cache steps replayed from one CUDA graph): its GPU tests; the
# decode diagnostic (stock, lit-liger uncaptured, lit-liger with the graph); the shipped LoRA and full recipes again,
# their generations timed
CALL=c3; . benchmarks/calls.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py tests/test_loaders.py 2>&1 | tail -4
timeout 200 python3 -m benchmarks diag decode /tmp/o/c3-decode.json 2>&1 | grep "^{" | cut -c1-300
T=litgpt.finetune.lora:fit,litgpt.finetune.lora:generate_example,lit_liger.graphs:release
TF=litgpt.finetune.full:fit,litgpt.finetune.full:generate_example,lit_liger.graphs:release
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec l Llama-3.2-1B lora 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$T
RECIPE_ARGS="--config configs/llama-3.2-1B/full.yaml --n_samples 2000" rec f Llama-3.2-1B full 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$TF
grep -h "bench-timer\|Training Time\|KV-cache steps\|could not be captured" /tmp/o/c3-run-*.txt | cut -c1-200
echo "call wall $(( $(date +%s) - S )) s"
pack
