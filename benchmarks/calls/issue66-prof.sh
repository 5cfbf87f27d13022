# Issue 66: where the time of gemma2-2b's shipped LoRA recipe (tied checkpoint, lit-liger) goes: a recipe row with
# LIT_LIGER_PROFILE over 20 steady iterations (the summary, and the trace gzipped for `python -m benchmarks diag gaps`
# or a local read: not committed), then (TESTS=1) the softcap attention's GPU tests.
#   run: CALL=a3p bash benchmarks/calls/issue66-prof.sh     (carry: .whl)
CALL=${CALL:-p} . benchmarks/calls.sh
gemma2_prof
if [ -n "$TESTS" ]; then
  timeout ${TESTS_S:-90} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_softcap_attention.py \
    > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - S )) s)"; tail -3 "/tmp/o/$NAME-pytest.log"
fi
pack
