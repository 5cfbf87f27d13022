# Issue 66: gemma2-2b's shipped LoRA recipe (as config_hub writes it, lora_head true), stock and lit-liger in one call:
# the row the README and issue 66's targets read.
#   run: CALL=r1 bash benchmarks/calls/issue66-row.sh     (carry: .whl)
CALL=${CALL:-r} . benchmarks/calls.sh
gemma2 "${G_S:-420}" stock,liger ""
pack
