python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 200 python3 -m pytest -q tests/test_distributed.py -k "gpu_replica or gpu_ddp" tests/test_cli.py::test_finetune_two_gpus -p no:cacheprovider > $OUT/c2-pytest-dist.log 2>&1; echo "pytest dist rc=$?"
grep -v -i "$F" $OUT/c2-pytest-dist.log | grep -i "passed\|failed\|Error" | cut -c1-300 | tail -8
timeout 100 python3 -m pytest -q tests/test_buckets.py -m gpu -p no:cacheprovider > $OUT/c2-pytest-buckets.log 2>&1; echo "pytest buckets rc=$?"; tail -2 $OUT/c2-pytest-buckets.log | cut -c1-300
timeout 90 python3 -m benchmarks diag replica-step $OUT/c2-replica-step-full.json 2>&1 | grep -v -i "$F" | tail -4
timeout 300 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora,full --micro_batches 4 --devices 1,2 --variants liger --iters 500 --warmup 100 --out $OUT/c2-recipe 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -8
python3 -c "
import json; r=json.load(open('$OUT/c2-recipe/recipe.json'))
for x in r['rows']: print(x['method'], x['devices'], {k: x.get(k) for k in ('tokens_per_s','x_one_device','iter_ms_p50','iter_ms_mean','iter_ms_sync_p50','iter_ms_accum_p50','graph_captures','graph_capture_s','mfu_nominal')})
" 2>&1 | tail -4
