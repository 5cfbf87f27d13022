# call 1 (issue 46): the zero1 plan on 2 GPUs: GPU tests, then Llama-3.1-8B full fine-tuning, stock vs lit-liger
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=60
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 100 python3 -m pytest -q tests/test_distributed.py -k "gpu_replica or zero1" -p no:cacheprovider > $OUT/d1-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/d1-pytest.log | grep -i "passed\|failed\|Error\|assert" | cut -c1-300 | tail -6
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
V=stock,liger; [ "$MEM" -gt 100000 ] && V=stock,liger-dp-zero1,liger
timeout 430 python3 -m benchmarks recipe --models Llama-3.1-8B --methods full --micro_batches 4 --devices 2 --variants $V --iters 60 --warmup 20 --work_dir /tmp/work --out $OUT/d1-recipe-8b-full 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -6
for f in /tmp/work/recipe-runs/*/stdout.txt; do d=$(basename $(dirname $f)); cp $f $OUT/d1-run-$d.txt; echo "== $d"; grep -E "lit-liger: (data parallel|zero1|memory plan|CUDA graphs|AdamW)|Error|out of memory" $f | cut -c1-260 | head -8; done
python3 -c "
import json; d=json.load(open('$OUT/d1-recipe-8b-full/recipe.json'))
for r in d['rows']: print(r['variant'], {k: (round(v,4) if isinstance(v,float) else v) for k,v in r.items() if k in ('status','tokens_per_s','mfu_nominal','peak_memory_gb','peak_reserved_gb','iter_ms_p50','x_stock_tok_s')})
"
