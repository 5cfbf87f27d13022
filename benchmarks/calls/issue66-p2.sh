# Issue 66: gemma2-2b's shipped LoRA recipe after the LoRA branch went on a second stream: the GPU tests of the LoRA
# layer (the edited second-stream test), the recipe profiled over 20 steady iterations (kernels per stream: what of
# the branch is still on the critical path), then what is live at lit-liger's memory peak (`diag cli-mem`, 60
# iterations of the same command).
#   run: CALL=p1 bash benchmarks/calls/issue66-p2.sh     (carry: .whl)
CALL=${CALL:-p} . benchmarks/calls.sh
if [ -z "$NO_TESTS" ]; then
  timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_lora.py > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
fi
gemma2_prof
if [ -z "$NO_MEM" ]; then
  row_cmd "/tmp/o/$NAME-recipe/recipe.json" liger 20 /tmp/work/mem-liger > /tmp/args.txt
  eval "timeout ${MEM_S:-200} python3 -m benchmarks diag cli-mem /tmp/o/$NAME-mem-liger.json --top 40 -- $(cat /tmp/args.txt)" \
    > "/tmp/o/$NAME-mem-liger.log" 2>&1
  echo "mem rc=$? ($(( $(date +%s) - S )) s)"; grep -A45 '"peak_live_GiB"' "/tmp/o/$NAME-mem-liger.log" | cut -c1-330
  leftovers
fi
pack
