# call 4 (issue 47): Llama-3.1-8B QLoRA (bnb.nf4-dq) with the defaults at 200k-token documents on one H100
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; free -g | head -2
L=${L:-204800}
timeout 555 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --quantize bnb.nf4-dq --micro_batches 1 --lengths long --max_seq_length $L --block_size 262144 --global_batch 1 --iters 2 --warmup 1 --variants liger --work_dir /tmp/work --out $OUT/l4-qlora-$L > $OUT/l4-qlora-$L.log 2>&1; echo "recipe rc=$?"
tail -2 $OUT/l4-qlora-$L.log | cut -c1-300
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f $OUT/l4-run-$(basename $(dirname $f)).txt; grep -E "lit-liger: (memory plan|CUDA graphs|training ended)|Error|iter [0-9]" $f | cut -c1-250 | head -8; done
python3 -c "
import json; d=json.load(open('$OUT/l4-qlora-$L/recipe.json'))
for r in d['rows']: print({k: r.get(k) for k in ('status','completed','tokens_per_s','mfu_nominal','mfu_nominal_with_attention','peak_memory_gb','peak_reserved_gb','iter_ms_p50')})
"
ls /tmp/work/recipe-runs/*/ 2>/dev/null | head; find /tmp/work/recipe-runs -name "*.csv" -exec tail -3 {} \; 2>/dev/null
