# call 4 (issue 46): the Trainer under DDP once more on another instance (g1 1.78x, g2 1.83x): is the 1.8x robust?
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
F='warn\|Failed to load\|register_constant\|Configuration class'
mkdir -p /tmp/o
timeout 175 python3 -m benchmarks trainer --devices 2,1 --variants liger --batches 600 --warm 100 --timeout 85 --out /tmp/o/g4-trainer 2>&1 | grep -v -i "$F" | cut -c1-200 | grep "^{"
tar czf $OUT/g4.tgz -C /tmp/o . ; echo "t=$(( $(date +%s) - S ))s"
