# call 2: where a capture's host time goes (issue 47), Llama-3.2-1B LoRA and full fine-tuning
CALL=c2; . benchmarks/calls.sh
for m in lora full; do
  METHOD=$m timeout 240 python3 -m benchmarks diag capture-cost /tmp/o/c2-$m.json > /tmp/o/c2-$m.log 2>&1
  echo "$m rc=$?"; grep -E "^(captured|replayed|uncaptured)" /tmp/o/c2-$m.log; tail -3 /tmp/o/c2-$m.log
done
pack
