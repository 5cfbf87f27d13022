# Issue 66: the LoRA branch on a second stream inside the captures (lit_liger.swap.lora.OVERLAP_BRANCH) against the
# code before (.base): the GPU tests of the LoRA layer and the graphs, then gemma2-2b's shipped LoRA recipe (lit-liger
# only) alternated before / after, then the README's Llama-3.2-1B LoRA row after and before.
#   run: CALL=b1 bash benchmarks/calls/issue66-branch.sh     (carry: .whl .base)
#        CALL=b3 NO_TESTS=1 ROWS=new LLAMA_ROWS=new FULL_ROWS="new base" bash benchmarks/calls/issue66-branch.sh
#        CALL=b2 NO_TESTS=1 ROWS="new base" LLAMA_ROWS= CUBLAS_WORKSPACE_CONFIG=:4096:4 bash benchmarks/calls/issue66-branch.sh
CALL=${CALL:-b} . benchmarks/calls.sh
if [ -z "$NO_TESTS" ]; then
  timeout ${TEST_S:-110} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_lora.py tests/test_buckets.py \
    > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
fi
i=0
for row in ${ROWS:-base new base new}; do
  i=$((i + 1))
  use_code "$row" || continue
  dir=.; [ "$row" = base ] && dir=.base
  (cd "$dir" && gemma2 "${G_S:-100}" liger "-$row-$i"); rm -rf /tmp/work/recipe-runs
  echo "t=$(( $(date +%s) - S ))s"
done
for row in ${LLAMA_ROWS-new base}; do
  use_code "$row" || continue
  dir=.; [ "$row" = base ] && dir=.base
  llama1b "$row-lora" "$dir"; rm -rf /tmp/work/recipe-runs
  echo "t=$(( $(date +%s) - S ))s"
done
for row in ${FULL_ROWS-}; do  # the README's Llama-3.2-1B full fine-tuning row (micro-batch 4)
  use_code "$row" || continue
  dir=.; [ "$row" = base ] && dir=.base
  (cd "$dir" && timeout ${ROW_S:-100} python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 \
     --variants liger --iters ${LITERS:-200} --warmup 30 --work_dir /tmp/work --out "/tmp/o/$NAME-$row-full" \
     > "/tmp/o/$NAME-$row-full.log" 2>&1)
  echo "$row-full rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^Llama" "/tmp/o/$NAME-$row-full.log"
  rm -rf /tmp/work/recipe-runs; leftovers
done
pack
