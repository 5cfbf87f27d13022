# Issue 66 after LoRA layers reading an RMSNorm form its output again from the norm's input (qkv; fc_1/fc_2):
# gemma2-2b's shipped LoRA recipe (tied checkpoint), stock and lit-liger; then the README's Llama-3.2-1B LoRA row
# (micro-batch 4) with the code before (BASE: a `git archive` of the commit before, without its results and docs,
# carried as .base) and after, in one call.
#   run: CALL=n1 bash benchmarks/calls/issue66-norm.sh     (carry: .whl .base)
#        CALL=a3 RECIPE_S=1 ROWS="base new base new" ROW_S=110 LITERS=300 bash benchmarks/calls/issue66-norm.sh
CALL=${CALL:-n} . benchmarks/calls.sh
[ "${RECIPE_S:-300}" -gt 1 ] && gemma2 "${RECIPE_S:-300}"
# ROWS: the order of the rows, e.g. "base new base new" (a base row only where .base is carried)
i=0
for row in ${ROWS:-base new}; do
  i=$((i + 1))
  use_code "$row" || continue
  if [ "$row" = base ]; then llama1b base-lora-$i .base; else llama1b new-lora-$i; fi
done
pack
