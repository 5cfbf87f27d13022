# call 1 (2 GPUs): issue 46's open rows. Llama-3.1-8B full fine-tuning zero1 with memplan.STATE_AHEAD (OOMed on 2 x H100
# last session before it), then the Trainer + LigerCallback under strategy="ddp", LoRA, 1 and 2 GPUs (1.67x on H100),
# then a per-rank profile of the Trainer on 1 and 2 GPUs (batches 300-339).
CALL=t1; . benchmarks/calls.sh
rec 8b-full Llama-3.1-8B full 2 liger-dp-zero1 150 40 200
logs /tmp/o/t1-run-*.txt
python3 -m benchmarks trainer --devices 1,2 --variants liger --batches 500 --warm 100 --timeout 95 \
  --out /tmp/o/t1-trainer > /tmp/o/t1-trainer.log 2>&1; echo "trainer rc=$?"; grep "^{" /tmp/o/t1-trainer.log | cut -c1-400
pack; echo "t=$(( $(date +%s) - S ))s"
for d in 1 2; do
  LIT_LIGER_PROFILE=/tmp/o/t1-prof$d,300,40 python3 -m benchmarks trainer --devices $d --variants liger --batches 400 \
    --warm 100 --timeout 90 --out /tmp/o/t1-trainer-prof$d > /tmp/o/t1-trainer-prof$d.log 2>&1; echo "prof $d rc=$?"
  rm -f /tmp/o/t1-prof$d/*trace.json; grep "^{" /tmp/o/t1-trainer-prof$d.log | cut -c1-300
  for f in /tmp/o/t1-prof$d/*summary.json; do python3 -c "
import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[1][-25:], {k: s[k] for k in s if k not in ('streams','top_kernels')})" $f 2>&1 | cut -c1-900; done
done
pack; echo "t=$(( $(date +%s) - S ))s"
