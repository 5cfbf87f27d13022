# call c4: the deferred log keeps litgpt's per-iteration throughput dict behind the kept lines (c3: its full flush, outside
# litgpt's timed region, had kept the host one iteration ahead, and LAG 8 only moved that wait out of iter_time).
# Llama-3.2-1B through litgpt's CLI, the host 1 (liger-lag1) and 8 logs ahead: the GPU's wait for the captures, the fit's
# wall; 200 iterations twice (LoRA), once (full)
CALL=c4; . benchmarks/calls.sh
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_lazylog.py > /tmp/o/c4-pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/c4-pytest.log | tail -4
rec a Llama-3.2-1B lora 1 liger-lag1,liger 200 40 150
rec b Llama-3.2-1B lora 1 liger,liger-lag1 200 40 150
rec c Llama-3.2-1B full 1 liger-lag1,liger 200 40 170
