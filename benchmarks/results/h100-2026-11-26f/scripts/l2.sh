# call 2 (issue 47): GPU tests again (test helper fixed), 8B LoRA at 128k tokens with the defaults (memory plan: offload)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 150 python3 -m pytest -q tests/test_memplan.py tests/test_buckets.py -m gpu -p no:cacheprovider > $OUT/l2-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|Error|assert" $OUT/l2-pytest.log | grep -v -i warn | cut -c1-300 | tail -8
timeout 420 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 1 --lengths long --max_seq_length 131072 --block_size 131072 --global_batch 1 --iters 3 --warmup 1 --variants liger --work_dir /tmp/work --out $OUT/l2-128k > $OUT/l2-128k.log 2>&1; echo "recipe rc=$?"
tail -3 $OUT/l2-128k.log | cut -c1-400
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f $OUT/l2-run-$(basename $(dirname $f)).txt; grep -E "lit-liger: (memory plan|CUDA graphs|training ended|the GPU ran)|Error|error|iter [0-9]" $f | cut -c1-300 | head -12; done
python3 -c "
import json; d=json.load(open('$OUT/l2-128k/recipe.json'))
for r in d['rows']: print({k: r.get(k) for k in ('variant','status','completed','tokens_per_s','mfu_nominal','mfu_nominal_with_attention','peak_memory_gb','peak_reserved_gb','iter_ms_p50')})
"
