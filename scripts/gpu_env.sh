# Source on the offline CUDA machine (device tool), from the repo root, after ../shared/gpu/wheelhouse.sh
# filled .whl/ here: installs litgpt & co from the carried wheels, then lit-liger (editable).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
export PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, triton, lightning, litgpt
p = torch.cuda.get_device_properties(0)
print(f"{p.name} x{torch.cuda.device_count()} | torch {torch.__version__} triton {triton.__version__} lightning {lightning.__version__} litgpt {litgpt.__version__ if hasattr(litgpt,'__version__') else '0.5.13'}")
PY
