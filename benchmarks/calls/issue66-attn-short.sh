# Issue 66: lit-liger's softcap attention at the short packed rows of gemma2-2b's shipped LoRA recipe (head size 256,
# 8 heads / 4 groups, one packed row of 256-1024 slots), CUDA-graph timed: round 7's candidates (a1), or (QUICK=1) the
# plan each shape now runs with against the long sequences' plan; then (TESTS=1) the attention / packing GPU tests and
# (RECIPE_S > 0) gemma2-2b's shipped LoRA recipe (tied checkpoint), stock and lit-liger, as issue66-norm.sh runs it.
#   run: CALL=a1 bash benchmarks/calls/issue66-attn-short.sh     (carry: .whl)
#        CALL=a2 QUICK=1 TESTS=1 RECIPE_S=270 bash benchmarks/calls/issue66-attn-short.sh
CALL=${CALL:-a} . benchmarks/calls.sh
timeout ${SWEEP_S:-420} python3 -m benchmarks diag attn-sweep --out "/tmp/o/$NAME-attn" --round ${ROUND:-7} \
  ${QUICK:+--quick} --shapes ${SHAPES:-gemma2-pack512,gemma2-pack1024,gemma2-pack256} > "/tmp/o/$NAME-attn.log" 2>&1
echo "sweep rc=$? ($(( $(date +%s) - S )) s)"; grep -vE "^\{|Warning|return Variable" "/tmp/o/$NAME-attn.log" | tail -40
if [ -n "$TESTS" ]; then
  timeout ${TESTS_S:-200} python3 -m pytest -q -p no:cacheprovider tests/test_softcap_attention.py \
    tests/test_packed_softcap.py tests/test_packing.py > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - S )) s)"; tail -3 "/tmp/o/$NAME-pytest.log"
fi
if [ "${RECIPE_S:-0}" -gt 0 ]; then
  gemma2 "$RECIPE_S" "${VARIANTS:-stock,liger}"
fi
pack
