# call c4: the shipped recipes end to end, stock and lit-liger on one instance (lit_liger.loaders and lit_liger.decode
# in), and the decode GPU tests after c3's one test fix
CALL=c4; . benchmarks/calls.sh
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py 2>&1 | tail -3
L="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000"; F="--config configs/llama-3.2-1B/full.yaml --n_samples 2000"
RECIPE_ARGS="$L" rec l Llama-3.2-1B lora 1 liger 1000 40 150
RECIPE_ARGS="$L" rec sl Llama-3.2-1B lora 1 stock 1000 40 220
RECIPE_ARGS="$F" rec f Llama-3.2-1B full 1 liger 1000 40 150
RECIPE_ARGS="$F" rec sf Llama-3.2-1B full 1 stock 1000 40 200
grep -h "Training Time\|Memory Used" /tmp/o/c4-run-*.txt | cut -c1-120
echo "call wall $(( $(date +%s) - S )) s"
pack
