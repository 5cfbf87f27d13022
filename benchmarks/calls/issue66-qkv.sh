# Issue 66: a qkv LoRA with its parts side by side (gemma2-2b's recipe: q, k, v all on) as one GEMM each way against
# the per-part GEMMs before: gemma2-2b's shipped LoRA recipe, lit-liger only, with the code before (.base: a `git
# archive` of the commit before, without results and docs) and after, alternated (ROWS, default "base new base new").
# Then (TESTS=1) tests/test_lora.py on the GPU.
#   run: CALL=b2 TESTS=1 bash benchmarks/calls/issue66-qkv.sh     (carry: .whl .base)
CALL=${CALL:-q} . benchmarks/calls.sh
i=0
for row in ${ROWS:-base new base new}; do
  i=$((i + 1))
  use_code "$row" || continue
  if [ "$row" = base ]; then
    (cd .base && gemma2 "${RECIPE_S:-150}" liger "-base-$i")
  else
    gemma2 "${RECIPE_S:-150}" liger "-new-$i"
  fi
done
if [ -n "$TESTS" ]; then
  timeout ${TESTS_S:-60} python3 -m pytest -q -p no:cacheprovider tests/test_lora.py > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - S )) s)"; tail -2 "/tmp/o/$NAME-pytest.log"
fi
pack
