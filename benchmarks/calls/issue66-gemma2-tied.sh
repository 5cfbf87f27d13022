# Issue 66, gemma2-2b's shipped LoRA recipe on a checkpoint tied as litgpt converts gemma-2 (lm_head = embedding,
# --tied_head): stock and lit-liger rows in one call, then what is live at lit-liger's peak (diag cli-mem, 60
# iterations), then the softcap attention's GPU tests that call e did not reach.
#   run: CALL=t bash benchmarks/calls/issue66-gemma2-tied.sh     (carry: .whl)
CALL=${CALL:-t} . benchmarks/calls.sh
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
timeout 300 python3 -m benchmarks recipe --models gemma-2-2b --methods lora --micro_batches 2 --global_batch 6 \
  --variants stock,liger --iters 200 --warmup 40 --work_dir /tmp/work --tied_head --out "/tmp/o/$NAME-recipe" \
  --litgpt_args "$LORA" > "/tmp/o/$NAME-recipe.log" 2>&1
echo "recipe rc=$?"; grep -E "^gemma" "/tmp/o/$NAME-recipe.log"
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp "$f" "/tmp/o/$NAME-run-$(basename "$(dirname "$f")").txt"; done
grep -h "one copy kept\|memory plan" /tmp/o/$NAME-run-*.txt | cut -c1-300
row_cmd "/tmp/o/$NAME-recipe/recipe.json" liger 20 /tmp/work/mem-liger > /tmp/args.txt
eval "timeout 200 python3 -m benchmarks diag cli-mem /tmp/o/$NAME-mem-liger.json --top 30 -- $(cat /tmp/args.txt)" \
  > "/tmp/o/$NAME-mem-liger.log" 2>&1
echo "mem rc=$?"; grep -A16 '"peak_live_GiB"' "/tmp/o/$NAME-mem-liger.log" | cut -c1-200 | grep -v '^{'
leftovers
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_softcap_attention.py tests/test_packed_softcap.py tests/test_tied.py \
  tests/test_lora_head.py > "/tmp/o/$NAME-pytest.log" 2>&1; echo "gpu tests rc=$?"; tail -4 "/tmp/o/$NAME-pytest.log"
pack
