# Issue 68: the attention's backward over slices of key/value groups in recomputed Blocks
# (lit_liger.swap.attend.sliced_sdpa_backward). One call: the 8B checkpoint and LEN-token documents built, the GPU tests
# of tests/test_kept_attention.py (with the sliced backward's peak against one call's, printed), then one Llama-3.1-8B
# LoRA iteration of LEN tokens with save and merge (issue68-long-mem.sh ONE=1) on a card of CARD_GIB emulated.
#   run: CALL=s1 bash benchmarks/calls/issue68-sliced.sh      (carry: .whl)
#   run: CALL=s2 CARD_GIB=44.7 NO_TESTS=1 bash benchmarks/calls/issue68-sliced.sh
CALL=${CALL:-s}
T0=$(date +%s)
BUILD=1 CALL=$CALL LEN=${LEN:-262144} bash benchmarks/calls/issue68-long-mem.sh 2>&1 | tail -3
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1  # (as benchmarks/calls.sh sets them)
if [ "${NO_TESTS:-0}" != 1 ]; then
  timeout ${TEST_S:-150} python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_kept_attention.py tests/test_checkpointing.py \
    > /tmp/tests-$CALL.log 2>&1
  echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -E "passed|failed|FAILED|Error|sliced backward" /tmp/tests-$CALL.log | tail -8
fi
RUN=1 ONE=1 CALL=$CALL LEN=${LEN:-262144} RUN_S=$(( ${END_S:-560} - $(date +%s) + T0 )) \
  bash benchmarks/calls/issue68-long-mem.sh
[ -f /tmp/tests-$CALL.log ] && cp /tmp/tests-$CALL.log /tmp/o/$CALL-pytest.log
tar czf "$OUT/$CALL.tgz" -C /tmp/o .
echo "done ($(( $(date +%s) - T0 )) s)"
