python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 220 python3 -m pytest -q -x tests/test_distributed.py -k "gpu_replica or gpu_ddp" tests/test_cli.py::test_finetune_two_gpus -p no:cacheprovider > $OUT/c1-pytest.log 2>&1; echo "pytest rc=$?"
grep -v -i "$F" $OUT/c1-pytest.log | grep -i "passed\|failed\|Error" | cut -c1-400 | tail -6
timeout 330 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora,full --micro_batches 4 --devices 1,2 --variants liger --iters 160 --warmup 40 --out $OUT/c1-recipe 2>&1 | grep -v -i "$F" | grep -i "tok/s\|error\|Traceback" | tail -8
for d in /tmp/lit-liger-bench/finetune-work/recipe-runs/*2dev-liger*; do echo "== $d"; grep -i "lit-liger: data parallel\|CUDA graphs\|fused kernel\|one iteration later\|padding\|Error" $d/stdout.txt | cut -c1-300 | head -8; done 2>/dev/null
