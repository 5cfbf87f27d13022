# Issue 68: the kept attention's GPU model test, then Llama-3.1-8B LoRA at 131,072 tokens (checkpoint built in the
# call; every recomputed Block can keep its attention's output there), to hold against h200-2026-12-02c l2.
#   run: CALL=k3 bash benchmarks/calls/issue68-kept131.sh     (carry: .whl)
CALL=${CALL:-k}
BUILD=1 RUN=1 LEN=131072 RUN_S=${RUN_S:-300} CALL=$CALL bash benchmarks/calls/issue68-long-mem.sh
mkdir -p /tmp/o2 && tar xzf "$OUT/$CALL.tgz" -C /tmp/o2  # (the run's files; calls.sh empties /tmp/o)
. benchmarks/calls.sh
cp -r /tmp/o2/. /tmp/o/
timeout ${TEST_S:-90} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kept_attention.py > "/tmp/o/$NAME-pytest.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - S )) s)"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
pack
