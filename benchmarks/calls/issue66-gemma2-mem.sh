# Issue 66, gemma2-2b's shipped LoRA recipe (lora_head, micro-batch 2, global 6): where lit-liger's memory and time go.
# A recipe row (lit-liger only) with LIT_LIGER_PROFILE over 20 steady iterations, then the same command short
# (max_steps 20 = 60 iterations) under `benchmarks diag cli-mem`, lit-liger and stock (--liger false).
#   run: CALL=m bash benchmarks/calls/issue66-gemma2-mem.sh     (carry: .whl)
CALL=${CALL:-m} . benchmarks/calls.sh
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
LIT_LIGER_PROFILE=/tmp/o/prof,120,20 timeout 200 python3 -m benchmarks recipe --models gemma-2-2b --methods lora \
  --micro_batches 2 --global_batch 6 --variants liger --iters 200 --warmup 40 --work_dir /tmp/work \
  --out "/tmp/o/$NAME-recipe" ${RECIPE_ARGS:-} --litgpt_args "$LORA" > "/tmp/o/$NAME-recipe.log" 2>&1
echo "recipe rc=$?"; grep -E "^gemma" "/tmp/o/$NAME-recipe.log"; grep -h "busy\|wall_ms" /tmp/work/recipe-runs/*/stdout.txt | cut -c1-2000
cp /tmp/work/recipe-runs/*/stdout.txt "/tmp/o/$NAME-run-stdout.txt" 2>/dev/null; rm -f /tmp/o/prof/*trace.json
for v in ${MEM_VARIANTS:-liger stock}; do
  row_cmd "/tmp/o/$NAME-recipe/recipe.json" liger 20 "/tmp/work/mem-$v" $([ "$v" = stock ] && echo false) > /tmp/args.txt
  eval "timeout 240 python3 -m benchmarks diag cli-mem /tmp/o/$NAME-mem-$v.json --top 40 -- $(cat /tmp/args.txt)" \
    > "/tmp/o/$NAME-mem-$v.log" 2>&1
  echo "mem $v rc=$?"; grep -A45 '"peak_live_GiB"' "/tmp/o/$NAME-mem-$v.log" | cut -c1-330
  leftovers
done
pack
