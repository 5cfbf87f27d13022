# Issue 66: this checkout's code ("new") against the code of commits before it (a row named NAME runs .NAME: a `git
# archive` of that commit without results and docs, e.g. .base; carry it): the GPU tests of the LoRA layer, the norms
# and the graphs; `diag lora-cost` per code (COST_ROWS, with VARIANTS in this checkout); gemma2-2b's shipped LoRA
# recipe (lit-liger only) alternated before / after (ROWS); the README's Llama-3.2-1B LoRA row (LLAMA_ROWS) and full
# fine-tuning row (FULL_ROWS).
#   run: CALL=b1 bash benchmarks/calls/issue66-branch.sh     (carry: .whl .base)
#        CALL=b3 NO_TESTS=1 ROWS=new LLAMA_ROWS=new FULL_ROWS="new base" bash benchmarks/calls/issue66-branch.sh
#        CALL=b7 COST_ROWS="base new" VARIANTS=recipe,no-postfuse ROWS=" " LLAMA_ROWS="new base0" bash ...
#          (carry: .whl .base .base0)
CALL=${CALL:-b} . benchmarks/calls.sh
if [ -z "$NO_TESTS" ]; then
  timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_lora.py tests/test_buckets.py \
    ${TESTS:-} > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
  if [ -n "$PLAIN_TESTS" ]; then  # tests that take the GPU through the `device` fixture (not marked gpu), e.g.
    # PLAIN_TESTS=tests/test_rms_norm.py
    timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider $PLAIN_TESTS > "/tmp/o/$NAME-plain.log" 2>&1
    echo "plain tests rc=$?"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-plain.log" | tail -8
  fi
fi
for row in ${COST_ROWS:-}; do  # diag lora-cost (the recipe's graphs, the loss) per code; VARIANTS only for new
  use_code "$row" || continue
  dir=.; v=${VARIANTS:-recipe}; [ "$row" != new ] && { dir=.$row; v=recipe; }
  (cd "$dir" && VARIANTS=$v ROUNDS=${ROUNDS:-2} timeout ${COST_S:-200} python3 -m benchmarks diag lora-cost \
     "/tmp/o/$NAME-$row-cost.json" > "/tmp/o/$NAME-$row-cost.log" 2>&1)
  echo "$row lora-cost rc=$? ($(( $(date +%s) - S )) s)"; tail -${TAIL:-6} "/tmp/o/$NAME-$row-cost.log"
done
i=0
for row in ${ROWS:-base new base new}; do
  i=$((i + 1))
  use_code "$row" || continue
  dir=.; [ "$row" != new ] && dir=.$row
  (cd "$dir" && gemma2 "${G_S:-100}" liger "-$row-$i"); rm -rf /tmp/work/recipe-runs
  echo "t=$(( $(date +%s) - S ))s"
done
for row in ${LLAMA_ROWS-new base}; do
  use_code "$row" || continue
  dir=.; [ "$row" != new ] && dir=.$row
  llama1b "$row-lora" "$dir"; rm -rf /tmp/work/recipe-runs
  echo "t=$(( $(date +%s) - S ))s"
done
for row in ${FULL_ROWS-}; do  # the README's Llama-3.2-1B full fine-tuning row (micro-batch 4)
  use_code "$row" || continue
  dir=.; [ "$row" != new ] && dir=.$row
  (cd "$dir" && timeout ${ROW_S:-100} python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 \
     --variants liger --iters ${LITERS:-200} --warmup 30 --work_dir /tmp/work --out "/tmp/o/$NAME-$row-full" \
     > "/tmp/o/$NAME-$row-full.log" 2>&1)
  echo "$row-full rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^Llama" "/tmp/o/$NAME-$row-full.log"
  rm -rf /tmp/work/recipe-runs; leftovers
done
pack
