# Issue 66: what gemma2-2b's recipe's LoRA layers cost an iteration on the GPU, per variant (diag lora-cost), after
# the GPU tests of the LoRA layer (the captured branch bit for bit against uncaptured).
#   run: CALL=c1 bash benchmarks/calls/issue66-cost.sh      (carry: .whl)
#        CALL=c2 NO_TESTS=1 VARIANTS=recipe,pack-first bash benchmarks/calls/issue66-cost.sh
CALL=${CALL:-c} . benchmarks/calls.sh
if [ -z "$NO_TESTS" ]; then
  timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_lora.py ${TESTS:-} \
    > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
fi
TRACE_DIR=/tmp/o timeout ${COST_S:-420} python3 -m benchmarks diag lora-cost "/tmp/o/$NAME-cost.json" > "/tmp/o/$NAME-cost.log" 2>&1
echo "lora-cost rc=$? ($(( $(date +%s) - S )) s)"; tail -${TAIL:-24} "/tmp/o/$NAME-cost.log"
for extra in ${EXTRA_ROWS:-}; do  # gemma2's recipe through the CLI (lit-liger only), as many times as named
  gemma2 "${G_S:-100}" liger "-$extra"; rm -rf /tmp/work/recipe-runs
done
pack
