# call b1 (issue 47, graphs.BORROW_LONGER): GPU tests of the borrowed replay and the capture paths; the capture-cost
# (runs at commit 778bc10: the BORROW mode and the liger-capture-every-length variant were reverted after it)
# diagnostic's BORROW mode (LoRA, full); the 1B recipes through litgpt's CLI, 200 iterations, borrowing on and off
CALL=b1; . benchmarks/calls.sh
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_borrow.py tests/test_buckets.py tests/test_packing.py -m gpu 2>&1 | tail -4
echo "t=$(( $(date +%s) - S ))s"
for m in lora full; do
  BORROW=1 METHOD=$m timeout 120 python3 -m benchmarks diag capture-cost /tmp/o/b1-diag-$m.json > /tmp/o/b1-diag-$m.log 2>&1
  echo "diag $m rc=$?"; grep -E "^(captured|borrow_)" /tmp/o/b1-diag-$m.log | cut -c1-400
done
pack; echo "t=$(( $(date +%s) - S ))s"
rec r Llama-3.2-1B lora,full 1 liger-capture-every-length,liger 200 40 300
grep -h "input shapes captured" /tmp/o/b1-run-*.txt | cut -c1-520
pack
