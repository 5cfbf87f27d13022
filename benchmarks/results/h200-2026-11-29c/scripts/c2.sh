# call c2: the capture-beside-queued-work GPU test again (a longer sleep), then where a replayed LoRA iteration's host
# time goes: Llama-3.2-1B LoRA through litgpt's CLI with lit_liger.profiling's window (iterations 100-139: the GPU's
# busy and idle time) and with cProfile over litgpt's fit; then full fine-tuning, synchronized captures + LAG 1 against
# the new defaults
CALL=c2; . benchmarks/calls.sh
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_buckets.py -k beside_queued > /tmp/o/c2-pytest.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|FAILED|Error" /tmp/o/c2-pytest.log | tail -6
rec p Llama-3.2-1B lora 1 liger 200 40 120 LIT_LIGER_PROFILE=/tmp/o/prof,100,40
grep -h "busy\|idle" /tmp/o/c2-run-p-*.txt | cut -c1-900 | head -4
rec q Llama-3.2-1B lora 1 liger 200 40 120 LIT_LIGER_BENCH_CPROFILE=/tmp/o/c2-fit.pstats  # (now LIT_LIGER_BENCH_CPROFILE_FIT)
python3 - <<'PY'
import pstats, io
for key in ("tottime", "cumulative"):
    s = io.StringIO(); pstats.Stats("/tmp/o/c2-fit.pstats", stream=s).sort_stats(key).print_stats(45)
    t = s.getvalue(); print(t[t.find("ncalls") - 120:][:9000])
PY
rec f Llama-3.2-1B full 1 liger-synced-captures,liger 200 40 200
pack
