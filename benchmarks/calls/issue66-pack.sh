# Issue 66: the LoRA dropout's bits packed by a coalesced kernel, against the strided one before (diag pack-bits), and
# the dropout's GPU tests; then (RECIPE_S > 0) gemma2-2b's shipped LoRA recipe, VARIANTS (default liger).
#   run: CALL=a5 bash benchmarks/calls/issue66-pack.sh     (carry: .whl)
#        CALL=b1 RECIPE_S=200 bash benchmarks/calls/issue66-pack.sh
CALL=${CALL:-k} . benchmarks/calls.sh
timeout 60 python3 -m benchmarks diag pack-bits --out "/tmp/o/$NAME-pack" > "/tmp/o/$NAME-pack.log" 2>&1
echo "pack rc=$?"; grep "^{" "/tmp/o/$NAME-pack.log"; tail -3 "/tmp/o/$NAME-pack.log" | grep -i error
timeout ${TESTS_S:-40} python3 -m pytest -q -p no:cacheprovider tests/test_dropout.py -k "bits" > "/tmp/o/$NAME-pytest.log" 2>&1
echo "pytest rc=$?"; tail -2 "/tmp/o/$NAME-pytest.log"
[ "${RECIPE_S:-0}" -gt 0 ] && gemma2 "$RECIPE_S" "${VARIANTS:-liger}"
pack
