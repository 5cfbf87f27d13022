# call 1 (issue 47): GPU tests of the memory plan / graph governance, graph-gain diag, 8B LoRA at 16k tokens
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 -m pytest -q tests/test_memplan.py tests/test_checkpointing.py tests/test_buckets.py -m gpu -p no:cacheprovider -x > $OUT/l1-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|Error|assert" $OUT/l1-pytest.log | grep -v -i warn | cut -c1-300 | tail -8
timeout 150 python3 -m benchmarks diag graph-gain $OUT/l1-graph-gain.json > $OUT/l1-graph-gain.log 2>&1; echo "diag rc=$?"
python3 -c "
import json; d=json.load(open('$OUT/l1-graph-gain.json'))
for r in d['rows']: print(r['model'][:12], r['tokens'], '%.2e'%r['tokens_x_block_params'], 'eager %.1f graphs %.1f x%.2f'%(r.get('eager_ms',0),r.get('graphs_ms',0),r.get('graphs_speedup',0)), 'kept/tok/layer %.0f est %.0f'%(r.get('kept_bytes_per_token_layer',0),r.get('estimate_bytes_per_token_layer',0)), r.get('error',''))
" 2>&1 | tail -12
timeout 300 python3 -m benchmarks recipe --models Llama-3.1-8B --methods lora --micro_batches 1 --lengths long --max_seq_length 16384 --block_size 131072 --global_batch 1 --iters 8 --warmup 2 --variants liger --work_dir /tmp/work --out $OUT/l1-16k > $OUT/l1-16k.log 2>&1; echo "recipe rc=$?"
tail -3 $OUT/l1-16k.log | cut -c1-400
for f in /tmp/work/recipe-runs/*/stdout.txt; do cp $f $OUT/l1-run-$(basename $(dirname $f)).txt; grep -E "lit-liger: (memory plan|CUDA graphs|training ended|the GPU ran)|Error|error" $f | cut -c1-300 | head -12; done
python3 -c "
import json; d=json.load(open('$OUT/l1-16k/recipe.json'))
for r in d['rows']: print({k: r.get(k) for k in ('variant','status','completed','tokens_per_s','mfu_nominal','mfu_nominal_with_attention','peak_memory_gb','peak_reserved_gb','iter_ms_p50','graph_captures')})
"
