# call c5: the shipped LoRA recipe took 58-68 s with its two intermediate saves and 30.7 s without them (c3, c4), yet
# cProfile saw the saves cheap: each call of the fit's pieces timed, and litgpt's csv log kept (its time/train per
# iteration), cold then warm
CALL=c5; . benchmarks/calls.sh
T=litgpt.finetune.lora:save_lora_checkpoint,litgpt.finetune.lora:copy_config_files,litgpt.parser_config:save_hyperparameters
T=$T,litgpt.finetune.lora:save_prompt_style,litgpt.finetune.lora:generate_example,litgpt.finetune.lora:validate
T=$T,litgpt.finetune.lora:get_longest_seq_length,torch:save
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec c Llama-3.2-1B lora 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$T
grep -h "bench-timer" /tmp/o/c5-run-c-*.txt | sort | uniq -c | sort -rn | head -5
grep -h "bench-timer" /tmp/o/c5-run-c-*.txt | awk '{s[$2]+=$3; n[$2]++} END {for (k in s) printf "%-55s %3d calls %7.2f s\n", k, n[k], s[k]}'
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec w Llama-3.2-1B lora 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$T
grep -h "bench-timer" /tmp/o/c5-run-w-*.txt | awk '{s[$2]+=$3; n[$2]++} END {for (k in s) printf "%-55s %3d calls %7.2f s\n", k, n[k], s[k]}'
grep -n "bench-timer\|val time" /tmp/o/c5-run-w-*.txt | cut -c1-120 | head -40
python3 - <<'PY'
import csv, glob
for f in sorted(glob.glob("/tmp/o/c5-metrics-*.csv")):
    rows = [r for r in csv.DictReader(open(f)) if r.get("time/train") and r.get("iter_time")]
    prev, gaps = None, []
    for r in rows:
        t, it = float(r["time/train"]), float(r["iter_time"])
        if prev is not None and t - prev - it > 0.2:
            gaps.append((r.get("iter"), round(t - prev - it, 2)))
        prev = t
    print(f, len(rows), "iterations; gaps > 0.2 s outside iter_time (iter, s):", gaps[:30])
PY
pack
