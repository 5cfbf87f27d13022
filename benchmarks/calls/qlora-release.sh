# QLoRA: the embedding that litgpt's QLoRA replaces with StableEmbedding (held by its optimizer until training ends)
# released at fit's start (lit_liger.cli.release_replaced): the Llama-3.2-1B QLoRA row (micro-batch 4, bnb.nf4-dq,
# lit-liger) with the code before (.base, a `git archive` of the commit before, without results and docs) and after,
# ITERS iterations (10 untimed) each, its peak allocated memory and the "released" line.
#   run: CALL=q1 ITERS=30 bash benchmarks/calls/qlora-release.sh     (carry: .whl with bitsandbytes, .base)
CALL=${CALL:-q} . benchmarks/calls.sh
for row in ${ROWS:-base new}; do
  use_code "$row" || continue
  dir=.; [ "$row" = base ] && dir=.base
  (cd "$dir" && timeout "${ROW_S:-80}" python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 \
     --variants liger --iters "${ITERS:-30}" --warmup 10 --quantize bnb.nf4-dq --work_dir /tmp/work \
     --out "/tmp/o/$NAME-$row" > "/tmp/o/$NAME-$row.log" 2>&1)
  echo "$row rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^Llama" "/tmp/o/$NAME-$row.log"
  grep -h "released\|frozen, so" /tmp/work/recipe-runs/*/stdout.txt 2>/dev/null | cut -c1-200
  rm -rf /tmp/work/recipe-runs; pack
done
