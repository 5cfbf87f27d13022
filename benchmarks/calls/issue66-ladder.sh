# Issue 66: packed lengths padded to a ladder fitted to the data (lit_liger.swap.buckets.fit_packed_tops) against the
# default ladder (the code before: .base), alternated in one call: gemma2-2b's shipped LoRA recipe (lit-liger only)
# and the README's Llama-3.2-1B LoRA row. Each run's fitted-ladder line and captured shapes are printed.
#   run: CALL=l1 bash benchmarks/calls/issue66-ladder.sh     (carry: .whl .base)
#        CALL=l3 NO_GEMMA=1 ROWS="new base new" bash benchmarks/calls/issue66-ladder.sh
CALL=${CALL:-l} . benchmarks/calls.sh
said() {  # the runs' ladder and capture lines, then their folders cleared (the checkpoints stay)
  grep -hE "padded to|input shapes captured|Error" /tmp/work/recipe-runs/*/stdout.txt 2>/dev/null | cut -c1-260 | head -4
  rm -rf /tmp/work/recipe-runs
}
i=0
for row in ${ROWS:-base new base new}; do
  i=$((i + 1))
  use_code "$row" || continue
  dir=.; [ "$row" = base ] && dir=.base
  [ -n "$NO_GEMMA" ] || { (cd "$dir" && gemma2 "${G_S:-110}" liger "-$row-$i"); said; }
  [ -n "$NO_LLAMA" ] || { llama1b "$row-lora-$i" "$dir"; said; }
  echo "t=$(( $(date +%s) - S ))s"
done
pack
