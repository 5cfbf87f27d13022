# call 1 (issue 47): the memory plan's GPU tests never run on a GPU before (planned recompute / offload against keeping
# everything; the 16k long-document recipe completing, 2 layers of Llama-3.1-8B's widths)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 380 python3 -m pytest -q tests/test_memplan.py -m gpu -p no:cacheprovider -rA > $OUT/m1-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|passed|failed|Error|assert" $OUT/m1-pytest.log | grep -v -i warn | cut -c1-300 | tail -12
