# call 7: the GPU tests of the capture paths after this session's change to graphs.py (the first warm-up's accounting)
CALL=c7; . benchmarks/calls.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_buckets.py tests/test_packing.py -m gpu 2>&1 | tail -4
