# call 3: the packed ladder's granularity (4 vs 8 buckets per doubling): captures against padding, 1B and 8B LoRA/full
CALL=c3; . benchmarks/calls.sh
run() { env "$@" timeout 280 python3 -m benchmarks diag capture-cost /tmp/o/c3-$TAG.json > /tmp/o/c3-$TAG.log 2>&1
  echo "$TAG rc=$?"; grep -E "^(ladder|captured|replayed)" /tmp/o/c3-$TAG.log | python3 -c "
import sys, json
for l in sys.stdin:
    if l.startswith('ladder ') : print(l.strip()); continue
    k, v = l.split(' ', 1); v = json.loads(v)
    cap = sum(v[p] for p in ('release','warmup','forward','backward','first_replay'))
    print(k, 'wall', round(v['wall_s'],3), 'captures', v['captures'], 'capture_s', round(cap,3))"; }
TAG=1b-lora; run LADDERS=4,8 METHOD=lora
TAG=1b-full; run LADDERS=4,8 METHOD=full
TAG=8b-lora; run LADDERS=4,8 METHOD=lora MODEL=Llama-3.1-8B LAYERS=32 STEPS=160
pack
