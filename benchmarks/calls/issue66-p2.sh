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
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
LIT_LIGER_PROFILE=/tmp/o/prof,120,20 timeout ${PROF_S:-170} python3 -m benchmarks recipe --models gemma-2-2b --methods lora \
  --micro_batches 2 --global_batch 6 --variants liger --iters 150 --warmup 40 --work_dir /tmp/work --tied_head \
  --out "/tmp/o/$NAME-recipe" --litgpt_args "$LORA" > "/tmp/o/$NAME-recipe.log" 2>&1
echo "recipe rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^gemma" "/tmp/o/$NAME-recipe.log"
grep -h "busy\|wall_ms" /tmp/work/recipe-runs/*/stdout.txt | cut -c1-1500
gzip -f /tmp/o/prof/*trace.json 2>/dev/null; ls -la /tmp/o/prof
if [ -z "$NO_MEM" ]; then
  row_cmd "/tmp/o/$NAME-recipe/recipe.json" liger 20 /tmp/work/mem-liger > /tmp/args.txt
  eval "timeout ${MEM_S:-200} python3 -m benchmarks diag cli-mem /tmp/o/$NAME-mem-liger.json --top 40 -- $(cat /tmp/args.txt)" \
    > "/tmp/o/$NAME-mem-liger.log" 2>&1
  echo "mem rc=$? ($(( $(date +%s) - S )) s)"; grep -A45 '"peak_live_GiB"' "/tmp/o/$NAME-mem-liger.log" | cut -c1-330
  leftovers
fi
pack
