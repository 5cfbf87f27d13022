# Issue 66: where the time of gemma2-2b's shipped LoRA recipe (tied checkpoint, lit-liger) goes: a recipe row with
# LIT_LIGER_PROFILE over 20 steady iterations (the summary, and the trace gzipped for `python -m benchmarks diag gaps`
# or a local read: not committed), then (TESTS=1) the softcap attention's GPU tests.
#   run: CALL=a3p bash benchmarks/calls/issue66-prof.sh     (carry: .whl)
CALL=${CALL:-p} . benchmarks/calls.sh
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
LIT_LIGER_PROFILE=/tmp/o/prof,120,20 timeout ${PROF_S:-170} python3 -m benchmarks recipe --models gemma-2-2b --methods lora \
  --micro_batches 2 --global_batch 6 --variants liger --iters 150 --warmup 40 --work_dir /tmp/work --tied_head \
  --out "/tmp/o/$NAME-recipe" --litgpt_args "$LORA" > "/tmp/o/$NAME-recipe.log" 2>&1
echo "recipe rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^gemma" "/tmp/o/$NAME-recipe.log"
grep -h "busy\|wall_ms" /tmp/work/recipe-runs/*/stdout.txt | cut -c1-1500
gzip -f /tmp/o/prof/*trace.json 2>/dev/null; ls -la /tmp/o/prof
if [ -n "$TESTS" ]; then
  timeout ${TESTS_S:-90} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_softcap_attention.py \
    > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "pytest rc=$? ($(( $(date +%s) - S )) s)"; tail -3 "/tmp/o/$NAME-pytest.log"
fi
pack
