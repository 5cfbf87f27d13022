# call g3: the single-GPU `gpu`-marked tests left out of g1/g2: the 16k long-document recipe (issue 47) and the bf16
# convergence run (needs neither bitsandbytes nor torchao)
CALL=g3; . benchmarks/calls.sh
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 tests/test_memplan.py tests/test_convergence.py \
  -k "long_document or bf16_within" > /tmp/o/g3-pytest.log 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|Error|s call" /tmp/o/g3-pytest.log | tail -10
pack
