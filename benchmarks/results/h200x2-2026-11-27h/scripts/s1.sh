# call 1 (2 GPUs): issue 47's capture time under the replica plan. The first step pre-captures only the packed lengths
# the dealt data is expected to give each process at least 4 times (graphs.EXPECTED_LENGTHS), a shape outside them
# runs uncaptured until its 4th micro-batch (graphs.CAPTURE_AFTER), against the whole ladder captured at once
# (liger-precapture-all, the code before). GPU tests of the replicas' captures first; a warm run for Triton's cache.
CALL=s1 . benchmarks/calls.sh
timeout 240 python3 -m pytest -q -m gpu tests/test_distributed.py -k "ddp_replica_graphs or replica_strategy_graphs" \
  > /tmp/o/s1-pytest.log 2>&1; echo "pytest rc=$?"; grep -E "passed|failed|^E |^FAILED" /tmp/o/s1-pytest.log | cut -c1-300 | tail -6
pack; echo "t=$(( $(date +%s) - S ))s"
rec warm Llama-3.2-1B lora 2 liger 60 10 90
rec lora2 Llama-3.2-1B lora 2 liger,liger-precapture-all 300 60 200
rec full2 Llama-3.2-1B full 2 liger,liger-precapture-all 300 60 220
grep -h "CUDA graphs" /tmp/o/s1-run-lora2-*.txt /tmp/o/s1-run-full2-*.txt | cut -c1-400
pack; echo "t=$(( $(date +%s) - S ))s"
