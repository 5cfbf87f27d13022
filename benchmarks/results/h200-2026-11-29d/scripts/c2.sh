# call c2: the recipes lit-liger ships (configs/llama-3.2-1B/lora.yaml, full.yaml) run as shipped, through litgpt's
# CLI: their own epochs, evaluations, saves and final merge, on a random Llama-3.2-1B and 2,000 Alpaca-shaped samples
# (Alpaca2k's size) in place of Alpaca2k: what the captures cost of a whole run; then stock on the LoRA recipe
CALL=c2; . benchmarks/calls.sh
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec l Llama-3.2-1B lora 1 liger 1000 40 150
RECIPE_ARGS="--config configs/llama-3.2-1B/full.yaml --n_samples 2000" rec f Llama-3.2-1B full 1 liger 1000 40 150
grep -h "input shapes captured\|read the lengths\|Training time\|Memory used" /tmp/o/c2-run-*.txt | cut -c1-400
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec sl Llama-3.2-1B lora 1 stock 1000 40 220
grep -h "Training time\|Memory used" /tmp/o/c2-run-sl*.txt | cut -c1-300
pack
