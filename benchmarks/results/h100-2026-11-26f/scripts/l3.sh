# call 3 (issue 47): GPU tests (fixed), graph-gain with long sequences on cuDNN, 8B LoRA at 16k and 32k tokens
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 150 python3 -m pytest -q tests/test_memplan.py tests/test_buckets.py tests/test_checkpointing.py -m gpu -p no:cacheprovider > $OUT/l3-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|Error|assert" $OUT/l3-pytest.log | grep -v -i warn | cut -c1-300 | tail -8
MODELS=Llama-3.2-1B:16,Llama-3.1-8B:8 TOKENS=2048,4096,8192,16384 timeout 120 python3 -m benchmarks diag graph-gain $OUT/l3-graph-gain.json > $OUT/l3-graph-gain.log 2>&1; echo "diag rc=$?"
python3 -c "
import json; d=json.load(open('$OUT/l3-graph-gain.json'))
for r in d['rows']: print(r['model'][:12], r['tokens'], '%.2e'%r['tokens_x_block_params'], 'eager %.1f graphs %.1f x%.2f'%(r.get('eager_ms',0),r.get('graphs_ms',0),r.get('graphs_speedup',0)), r.get('error',''))
" 2>&1 | tail -10
for L in 16384 32768; do
timeout 200 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 1 --lengths long --max_seq_length $L --block_size 131072 --global_batch 1 --iters 8 --warmup 2 --variants liger --work_dir /tmp/work --out $OUT/l3-$L > $OUT/l3-$L.log 2>&1; echo "recipe $L rc=$?"
tail -2 $OUT/l3-$L.log | cut -c1-300
done
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f $OUT/l3-run-$(basename $(dirname $f)).txt; grep -E "lit-liger: (memory plan|CUDA graphs|training ended)|Error" $f | cut -c1-250 | head -6; done
for L in 16384 32768; do python3 -c "
import json; d=json.load(open('$OUT/l3-$L/recipe.json'))
for r in d['rows']: print($L, {k: r.get(k) for k in ('status','completed','tokens_per_s','mfu_nominal','mfu_nominal_with_attention','peak_memory_gb','peak_reserved_gb','iter_ms_p50')})
"; done
