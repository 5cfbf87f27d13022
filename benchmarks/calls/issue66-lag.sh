# Issue 66: gemma2-2b's shipped LoRA recipe (lit-liger) with lazylog.LAG 2 against 1, in one call: the profile of
# h200-2026-12-03e l4 shows the GPU waiting ~2.5 ms for the host at each optimizer step (every 3rd micro-batch), after the
# deferred log's wait for the value one log back.
#   run: CALL=g1 bash benchmarks/calls/issue66-lag.sh     (carry: .whl)
CALL=${CALL:-g} . benchmarks/calls.sh
for lag in ${LAGS:-2 1}; do
  sed -i "s/^LAG = [0-9]*/LAG = $lag/" lit_liger/runtime/lazylog.py && grep -n "^LAG" lit_liger/runtime/lazylog.py
  gemma2 "${G_S:-90}" liger "-lag$lag"
done
pack
