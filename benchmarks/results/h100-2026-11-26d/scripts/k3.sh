python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
F='warn\|Failed to load\|register_constant\|Configuration class'
timeout 100 python3 -m pytest -q tests/test_float8.py "tests/test_fp8.py::test_gpu_fp8_composition_under_compile" 2>&1 | tee $OUT/pytest.log | grep -E "^E  |passed|failed|FAILED" | head -8
timeout 290 python3 -m benchmarks step --models Llama-3.1-8B --n_layer 8 --batch_size 2 --seq_len 4096 --variants compile,lit-liger+compile,lit-liger+fp8-tensorwise+compile,lit-liger+fp8-tensorwise --fp8 tensorwise --steps 10 --warmup 3 --variant_timeout 90 --anchor none --out $OUT/step8b 2>&1 | grep -v -i "$F" | tail -6
timeout 170 python3 -m benchmarks step --models Llama-3.2-1B --batch_size 4 --seq_len 2048 --variants lit-liger+compile,lit-liger+fp8-tensorwise+compile,lit-liger+fp8-tensorwise,lit-liger --fp8 tensorwise --steps 10 --warmup 3 --variant_timeout 60 --anchor none --out $OUT/step1b 2>&1 | grep -v -i "$F" | tail -6
python3 - <<'P'
import json, os
for f in ("step8b", "step1b"):
    try: r = json.load(open(os.path.join(os.environ["OUT"], f, "step.json")))
    except Exception as e: print(f, e); continue
    for row in r.get("rows", []):
        print(f, row.get("variant"), round(row.get("step_ms") or 0, 1), "peak", round(row.get("peak_GiB") or 0, 2), "alloc", round(row.get("peak_allocated_GiB") or 0, 2), "pool", round(row.get("graph_pool_GiB") or 0, 2), "reserved", round(row.get("peak_reserved_GiB") or 0, 2), row.get("status"))
P
