# call c5: GPU regression tests after graphs.EAGER_FIRST and the gradient buffers taken from .grad: the CLI (its runs
# in subprocesses keep EAGER_FIRST on), the Trainer, buckets, checkpointing, attention
CALL=c5; . benchmarks/calls.sh
timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cli.py tests/test_stock_code.py \
  tests/test_buckets.py tests/test_checkpointing.py tests/test_attention.py 2>&1 | tail -15 | tee /tmp/o/c5-pytest.log
echo "call wall $(( $(date +%s) - S )) s"
pack
