# call c4: the decode graphs without the reference cycle (GPU tests; Llama-3.1-8B at a 128k cache from a 4,000-token
# prompt: two key lengths; the peak memory per mode), QLoRA's shipped-recipe run with its generations timed
CALL=c4; . benchmarks/calls.sh
python3 -c "import bitsandbytes as b; print('bitsandbytes', b.__version__)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py tests/test_qlora.py -m gpu 2>&1 | tail -3
L="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000 --quantize bnb.nf4-dq"
RECIPE_ARGS="$L" rec q Llama-3.2-1B lora 1 liger 1000 40 200 LIT_LIGER_BENCH_TIME_CALLS=litgpt.finetune.lora:generate_example
grep -h "Training Time\|Memory Used\|input shapes captured\|bench-timer\|could not be captured" /tmp/o/c4-run-*.txt | cut -c1-500
echo "t=$(( $(date +%s) - S )) s"; pack
MODEL=Llama-3.1-8B BLOCK=131072 PROMPT=4000 MODES=stock,liger timeout 200 python3 -m benchmarks diag decode \
  /tmp/o/c4-decode-8b-128k-p4000.json 2>&1 | grep '^{\|Error'
echo "call wall $(( $(date +%s) - S )) s"
pack
