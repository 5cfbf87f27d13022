# call c1: GPU tests of the decode graphs per key length and of graphs.EAGER_FIRST, then the shipped recipes
# (lit-liger only) twice each: a fresh instance's cold Triton cache, then warm
CALL=c1; . benchmarks/calls.sh
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py tests/test_packing.py tests/test_memplan.py \
  -m gpu 2>&1 | tail -6
L="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000"; F="--config configs/llama-3.2-1B/full.yaml --n_samples 2000"
RECIPE_ARGS="$L" rec l Llama-3.2-1B lora 1 liger 1000 40 150
RECIPE_ARGS="$F" rec f Llama-3.2-1B full 1 liger 1000 40 150
RECIPE_ARGS="$L" rec l2 Llama-3.2-1B lora 1 liger 1000 40 150
RECIPE_ARGS="$F" rec f2 Llama-3.2-1B full 1 liger 1000 40 150
grep -h "Training Time\|Memory Used\|input shapes captured" /tmp/o/c1-run-*.txt | cut -c1-400
echo "call wall $(( $(date +%s) - S )) s"
pack
