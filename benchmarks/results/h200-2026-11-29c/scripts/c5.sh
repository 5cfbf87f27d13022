# call c5: batches from the loader's workers arrive pinned (their move no longer waits for the GPU's queue, c4's reason
# for no lead): the GPU tests, then Llama-3.2-1B LoRA through litgpt's CLI, 200 iterations, the host 1 and 8 logs ahead
CALL=c5; . benchmarks/calls.sh
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cli.py -k arrive_pinned > /tmp/o/c5-pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/c5-pytest.log | tail -4
rec a Llama-3.2-1B lora 1 liger-lag1,liger 200 40 130
rec b Llama-3.2-1B lora 1 liger,liger-lag1 200 40 110
