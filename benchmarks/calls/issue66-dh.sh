# Issue 66: a LoRA dropout's backward from its bits with dh @ lora_A formed inside the pass (kernels.dropout's
# dropped_from_bits with lora=...: one GEMM launch and one (N, C) round trip fewer a LoRA layer). DIAG=1: `diag
# dropped-lora` (the pass against the GEMM before it, with a tile sweep; the 262k shape too); TESTS=1:
# tests/test_dropout.py and tests/test_lora.py on the GPU; G_ROWS: gemma2-2b's shipped LoRA recipe rows, lit-liger,
# with the code before (base: .base, a `git archive` of the commit before, without results and docs) or after (new),
# e.g. "base new"; L_ROWS: the README's Llama-3.2-1B LoRA row the same way.
#   run: CALL=c2 DIAG=1 TESTS=1 G_ROWS="base new" ITERS=200 bash benchmarks/calls/issue66-dh.sh   (carry: .whl .base)
CALL=${CALL:-o} . benchmarks/calls.sh
if [ -n "$DIAG" ]; then
  timeout ${DIAG_S:-150} python3 -m benchmarks diag dropped-lora --long --out "/tmp/o/$NAME-diag" > "/tmp/o/$NAME-diag.log" 2>&1
  echo "diag rc=$? ($(( $(date +%s) - S )) s)"; grep "^{" "/tmp/o/$NAME-diag.log" | cut -c1-400
  tail -3 "/tmp/o/$NAME-diag.log" | grep -i error
fi
if [ -n "$TESTS" ]; then
  timeout ${TESTS_S:-150} python3 -m pytest -q -p no:cacheprovider tests/test_dropout.py tests/test_lora.py \
    > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - S )) s)"; tail -3 "/tmp/o/$NAME-pytest.log"
fi
i=0
for row in ${G_ROWS:-}; do
  i=$((i + 1))
  use_code "$row" || continue
  if [ "$row" = base ]; then (cd .base && gemma2 "${RECIPE_S:-140}" liger "-base-$i"); else gemma2 "${RECIPE_S:-140}" liger "-new-$i"; fi
done
for row in ${L_ROWS:-}; do
  i=$((i + 1))
  use_code "$row" || continue
  if [ "$row" = base ]; then llama1b "base-lora-$i" .base; else llama1b "new-lora-$i"; fi
done
pack
