# Issue 66, the fitted ladder's second call: the GPU tests of buckets, packing and the CLI's batches, then the README's
# Llama-3.2-1B full fine-tuning row (micro-batch 4) with the code before (.base) and after, alternated.
#   run: CALL=l2 bash benchmarks/calls/issue66-ladder-check.sh     (carry: .whl .base)
CALL=${CALL:-l} . benchmarks/calls.sh
timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_buckets.py tests/test_packing.py \
  tests/test_cli.py > "/tmp/o/$NAME-pytest.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
i=0
for row in ${ROWS:-base new base new}; do
  i=$((i + 1))
  use_code "$row" || continue
  dir=.; [ "$row" = base ] && dir=.base
  (cd "$dir" && timeout ${ROW_S:-100} python3 -m benchmarks recipe --models Llama-3.2-1B --methods full --micro_batches 4 \
     --variants liger --iters ${LITERS:-200} --warmup 30 --work_dir /tmp/work --out "/tmp/o/$NAME-$row-full-$i" \
     > "/tmp/o/$NAME-$row-full-$i.log" 2>&1)
  echo "$row-full-$i rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^Llama" "/tmp/o/$NAME-$row-full-$i.log"
  grep -hE "padded to|input shapes captured|Error" /tmp/work/recipe-runs/*/stdout.txt 2>/dev/null | cut -c1-200 | head -3
  rm -rf /tmp/work/recipe-runs; leftovers
done
pack
