# call c3: the gradient accumulators made on the capture stream at the uncaptured first micro-batch (c2's finding);
# the GPU test that holds each loss past the next forward, c2's probe, the shipped recipes twice each, then generation
# at Llama-3.1-8B with a 128k cache
CALL=c3; . benchmarks/calls.sh
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_packing.py -m gpu -k first_micro 2>&1 | tail -2
# (the probe left the tree after c3: git show d5ea352:benchmarks/results/h200-2026-11-29f/scripts/eager_first_probe.py)
P=benchmarks/results/h200-2026-11-29f/scripts/eager_first_probe.py
for v in "" "FULL=1"; do echo "== $v"; env $v timeout 90 python3 $P 2>&1 | grep '^{' ; done
L="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000"; F="--config configs/llama-3.2-1B/full.yaml --n_samples 2000"
RECIPE_ARGS="$L" rec l Llama-3.2-1B lora 1 liger 1000 40 150
RECIPE_ARGS="$F" rec f Llama-3.2-1B full 1 liger 1000 40 150
RECIPE_ARGS="$L" rec l2 Llama-3.2-1B lora 1 liger 1000 40 150
RECIPE_ARGS="$F" rec f2 Llama-3.2-1B full 1 liger 1000 40 150
grep -h "Training Time\|Memory Used\|input shapes captured" /tmp/o/c3-run-*.txt | cut -c1-600
echo "t=$(( $(date +%s) - S )) s"; pack
MODES=stock,liger timeout 80 python3 -m benchmarks diag decode /tmp/o/c3-decode-1b.json 2>&1 | grep '^{'
MODEL=Llama-3.1-8B BLOCK=131072 MODES=stock,liger-whole-cache,liger timeout $(( 580 - ($(date +%s) - S) )) \
  python3 -m benchmarks diag decode /tmp/o/c3-decode-8b-128k.json 2>&1 | grep '^{\|Error'
echo "call wall $(( $(date +%s) - S )) s"
pack
