# call c1: litgpt's pass over the data for its longest sample, in its process against lit_liger.lengths' workers (the
# diagnostic on the recipe's Alpaca-shaped data, 4,000 and 52,000 samples, 16 CPUs), then Llama-3.2-1B LoRA through
# litgpt's CLI, 200 iterations, both orders; the CLI's GPU tests
CALL=c1; . benchmarks/calls.sh
timeout 150 python3 -m benchmarks diag data-pass /tmp/o/c1-data-pass.json 2>&1 | grep -v "Warn\|rationality"
echo "t=$(( $(date +%s) - S ))s"
rec a Llama-3.2-1B lora 1 liger-serial-lengths,liger 200 40 150
rec b Llama-3.2-1B lora 1 liger,liger-serial-lengths 200 40 120
grep -h "read the lengths" /tmp/o/c1-run-*.txt | head -4
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cli.py tests/test_lengths.py > /tmp/o/c1-pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/c1-pytest.log | tail -4
pack
