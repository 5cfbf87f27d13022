# call c2: where the shipped LoRA recipe's sample generation goes (22 of its 44 s in c1; stock's as long): each
# generate_example of a lit-liger run under cProfile, then the decode diagnostic (per token eager, the host's profile,
# the one-token step in a CUDA graph), lit-liger's model and stock's
CALL=c2; . benchmarks/calls.sh
mkdir -p /tmp/o/prof
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec l Llama-3.2-1B lora 1 liger 1000 40 150 \
  LIT_LIGER_BENCH_CPROFILE_CALLS=litgpt.finetune.lora:generate_example LIT_LIGER_BENCH_CPROFILE_DIR=/tmp/o/prof
ls /tmp/o/prof
for f in /tmp/o/prof/generate_example-1.pstats /tmp/o/prof/generate_example-2.pstats; do
  python3 -c "import pstats,sys; s=pstats.Stats(sys.argv[1]); s.sort_stats('cumtime').print_stats(30)" "$f" | tail -42 | cut -c1-160
done
timeout 150 python3 -m benchmarks diag decode /tmp/o/c2-decode-liger.json 2>&1 | tail -50 | cut -c1-200
LIGER=0 timeout 120 python3 -m benchmarks diag decode /tmp/o/c2-decode-stock.json 2>&1 | grep "^{" | cut -c1-400
echo "call wall $(( $(date +%s) - S )) s"
pack
