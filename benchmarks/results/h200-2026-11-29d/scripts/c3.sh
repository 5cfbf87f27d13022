# call c3: where the shipped LoRA recipe's run (c2: litgpt's Training Time 63.5 s, of which 15.0 s in its iterations
# and 18.0 s evaluating, against stock's ~7 s besides both) spends the other ~30 s: cProfile over litgpt's fit, then
# the same recipe without its intermediate saves
CALL=c3; . benchmarks/calls.sh
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec p Llama-3.2-1B lora 1 liger 1000 40 170 LIT_LIGER_BENCH_CPROFILE_FIT=/tmp/o/c3-fit.pstats
python3 - <<'PY'
import pstats, io
for key, n in (("cumulative", 70), ("tottime", 30)):
    s = io.StringIO(); pstats.Stats("/tmp/o/c3-fit.pstats", stream=s).sort_stats(key).print_stats(n)
    t = s.getvalue(); print(t[t.find("ncalls") - 120:][:12000])
PY
grep -h "val time\|Training Time\|Saving" /tmp/o/c3-run-p-*.txt | cut -c1-200
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000 --litgpt_args=--train.save_interval=1000000" rec n Llama-3.2-1B lora 1 liger 1000 40 150
grep -h "val time\|Training Time\|Saving" /tmp/o/c3-run-n-*.txt | cut -c1-200
pack
