python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 .gpu/prof2.py full-fused-noitem-syncdebug full-fused lora-fused-noitem lora-fused 2>&1 | grep -v "Warn\|warn(" | tail -60
