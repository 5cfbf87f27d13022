# call 5 (one GPU): after lit-liger's Adam kernel was dropped, the fused switch on DTensors (PyTorch's fused kernel) on
# the GPU image's torch 2.11: the 2-process FSDP2 test (gloo, CUDA tensors) and the Trainer under FSDP2
# (ModelParallelStrategy) on one device, the switched AdamW (bf16) against the AdamW as built (bf16-foreach-adam)
S=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 LIT_LIGER_TEST_SPAWN_TIMEOUT=90
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
mkdir -p /tmp/o
pack() { tar czf $OUT/q5.tgz -C /tmp/o . ; }
timeout 100 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider tests/test_distributed.py tests/test_grad_into.py -k "fused_optimizer or fuse" > /tmp/o/q5-pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^E |^FAILED" /tmp/o/q5-pytest.log | cut -c1-300 | tail -6; pack; echo "t=$(( $(date +%s) - S ))s"
timeout 200 python3 -m benchmarks strategies --strategies modelparallel --variants bf16,bf16-foreach-adam --devices 1 --steps 40 --timeout 60 --out /tmp/o/q5-strategies > /tmp/o/q5-strategies.log 2>&1; echo "strategies rc=$?"
grep -rh "AdamW steps\|AdamW keeps" /tmp/o/q5-strategies/strategies_runs/*.log | cut -c1-160 | sort | uniq -c
grep "^| modelparallel" /tmp/o/q5-strategies/strategies.md; pack; echo "t=$(( $(date +%s) - S ))s"
