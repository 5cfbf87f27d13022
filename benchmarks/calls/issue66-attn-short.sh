# Issue 66: lit-liger's softcap attention at the short packed rows of gemma2-2b's shipped LoRA recipe (head size 256,
# 8 heads / 4 groups, one packed row of 256-1024 slots): the default plan and round 7's candidates, CUDA-graph timed.
#   run: CALL=a1 bash benchmarks/calls/issue66-attn-short.sh     (carry: .whl)
CALL=${CALL:-a} . benchmarks/calls.sh
timeout ${SWEEP_S:-420} python3 -m benchmarks diag attn-sweep --out "/tmp/o/$NAME-attn" --round ${ROUND:-7} \
  --shapes ${SHAPES:-gemma2-pack512,gemma2-pack1024,gemma2-pack256} > "/tmp/o/$NAME-attn.log" 2>&1
echo "sweep rc=$? ($(( $(date +%s) - S )) s)"; grep -vE "^\{" "/tmp/o/$NAME-attn.log" | tail -40
pack
