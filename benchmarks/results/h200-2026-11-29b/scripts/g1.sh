# call g1: the single-GPU `gpu`-marked tests, part 1 (kernels, attention, adapter, loss, checkpointing, launcher)
CALL=g1; . benchmarks/calls.sh
timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=12 \
  tests/test_attention.py tests/test_rope.py tests/test_fused_linear_cross_entropy.py tests/test_adapter.py \
  tests/test_softcap_attention.py tests/test_sdpa_backend.py tests/test_swiglu.py tests/test_layer_norm.py \
  tests/test_checkpointing.py tests/test_stock_code.py tests/test_lazylog.py tests/test_launch.py \
  tests/test_backward_thread.py tests/test_qlora.py tests/test_fp8.py > /tmp/o/g1-pytest.log 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|ERROR|Error" /tmp/o/g1-pytest.log | tail -25
pack
