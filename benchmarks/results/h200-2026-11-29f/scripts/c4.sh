# call c4: the decode graphs without the reference cycle (GPU tests; Llama-3.1-8B at a 128k cache from a 4,000-token
# prompt: two key lengths; the peak memory per mode). (QLoRA's generation was left out: bitsandbytes' 43 MB wheel and
# the checkout exceed what a call carries)
CALL=c4; . benchmarks/calls.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py -m gpu 2>&1 | tail -3
MODEL=Llama-3.1-8B BLOCK=131072 PROMPT=4000 MODES=stock,liger timeout 240 python3 -m benchmarks diag decode \
  /tmp/o/c4-decode-8b-128k-p4000.json 2>&1 | grep '^{\|Error'
echo "call wall $(( $(date +%s) - S )) s"
pack
