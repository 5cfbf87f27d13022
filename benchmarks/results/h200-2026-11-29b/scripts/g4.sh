# call g4: the float8 GPU tests (torchao 0.18.0 carried in .whl; bitsandbytes 0.50.2 was not to be had from the
# registry this session, so QLoRA's stay unrun)
CALL=g4; . benchmarks/calls.sh
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 tests/test_fp8.py tests/test_convergence.py \
  -k "fp8" > /tmp/o/g4-pytest.log 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|Error|s call" /tmp/o/g4-pytest.log | tail -10
pack
