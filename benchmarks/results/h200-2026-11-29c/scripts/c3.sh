# call c3: the GPU tests of full fine-tuning queued far ahead of the GPU and of the capture beside queued work; then
# Llama-3.2-1B through litgpt's CLI, 1,000 iterations (200 untimed): the previous defaults (liger-prior: synchronized
# captures, the host one log ahead, batches through shared memory) against the new ones, and LoRA without the by-value
# batches (liger-shared-batches)
CALL=c3; . benchmarks/calls.sh
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_buckets.py -k "queued" > /tmp/o/c3-pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/c3-pytest.log | tail -6
rec l Llama-3.2-1B lora 1 liger-prior,liger,liger-shared-batches 1000 200 200
rec f Llama-3.2-1B full 1 liger-prior,liger 1000 200 180
