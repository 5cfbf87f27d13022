# call c1 (issue 47, captures recorded beside queued GPU work: graphs.SYNC_BEFORE_CAPTURE off, lazylog.LAG 8): the GPU
# tests of the capture paths, then Llama-3.2-1B LoRA through litgpt's CLI, 200 iterations, the synchronized captures
# with the host one log ahead (as before) against the new default, twice each, alternating
CALL=c1; . benchmarks/calls.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_buckets.py tests/test_packing.py \
  tests/test_lazylog.py tests/test_memplan.py --deselect tests/test_memplan.py::test_gpu_long_document_recipe_completes \
  > /tmp/o/c1-pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/c1-pytest.log | tail -12
echo "t=$(( $(date +%s) - S ))s"
rec a Llama-3.2-1B lora 1 liger-synced-captures,liger 200 40 180
rec b Llama-3.2-1B lora 1 liger-synced-captures,liger 200 40 170
