# Issue 68's first measurement: what is live at the memory peak of one Llama-3.1-8B LoRA iteration on a document of
# LEN tokens (micro-batch 1, litgpt's LoRA defaults, an 80 GB card emulated: LIT_LIGER_BENCH_DEVICE_GIB=79.19), by the
# code that allocated it (`benchmarks diag cli-mem`), with the host's peak memory (the process's max RSS) and the plan's log line.
# Two calls while the machine stays warm (its /tmp is kept ~30 s after a call):
#   run: BUILD=1 CALL=l0 bash benchmarks/calls/issue68-long-mem.sh             (carry .whl; the checkpoint and data)
#   run: LEN=262144 CALL=l1 bash benchmarks/calls/issue68-long-mem.sh          (carry .whl; one iteration)
# BUILD=1 RUN=1 does both in one call; QUANT=bnb.nf4-dq runs QLoRA (bitsandbytes' wheel in the carried folder); EXTRA:
# more arguments (e.g. --liger.sdpa_backend cudnn); STEPS: iterations (2, the fewest litgpt's cosine schedule takes:
# with 1 it divides by zero, h200-2026-12-02e e2). Where 2 steps do not fit a call (QLoRA at 393k: ~370 s a step),
# EXTRA="--liger.defer_loss_sync false" prints iteration 1 as it ends (deferred, it prints only with iteration 2);
# iteration 2's first forward prints iteration 1's measured GPU peak and host memory (the plan's "measured" line).
# ONE=1: exactly one iteration, then litgpt's save and `merge_lora`: the first document alone for training and a short
# sample for validation (a directory with train.json and val.json: litgpt's settings check runs no long forward), and
# `--train.max_time 1` ends the loop at iteration 2's start; `--eval.max_new_tokens` above the length skips litgpt's
# closing generation (its KV cache would count in the GPU peak). The measured peak is then `diag cli-mem`'s.
# SHORT_VAL=1: the same short validation sample and skipped generation, every step on the first document (STEPS of them).
# CARD_GIB: the card emulated (79.19: 80 GB; 44.7: 48 GB). KILL_S: the seconds a stopped run gets to report (60). Each line of the run's log carries the seconds since the call's
# start ([123s]), so that a run the call's time cut short says which part took the time.
CALL=${CALL:-l} . benchmarks/calls.sh
LEN=${LEN:-262144}
python3 - "$LEN" "${BUILD:-0}" "${QUANT:-}" "${STEPS:-2}" "${ONE:-0}" "${SHORT_VAL:-0}" > /tmp/args.txt <<'PY'
import json, shlex, sys
from pathlib import Path
from benchmarks import finetune as F, recipe as R
length, build, quant, steps = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] or None, int(sys.argv[4])
if steps < 2:
    sys.exit("STEPS must be 2 or more: litgpt's cosine learning-rate schedule divides by zero with 1")
work = Path("/tmp/work")
ckpt, _, info = F.build_inputs(work, "Llama-3.1-8B", 32, smoke=False, n_samples=8, max_seq_length=524288)
data = work / "data" / f"long-{length}-{ckpt.name}-4.json"
if not data.is_file():
    R.make_long_docs(data, ckpt, 4, length)
args = R._command("lora", ckpt, data, work / f"long-{length}", 1, steps, "bf16-true", False, "liger", quant, 1, length, 1,
                  0.25)
if "1" in (sys.argv[5], sys.argv[6]):  # (one iteration, or a short validation sample: see ONE, SHORT_VAL above)
    one = work / "data" / f"one-{length}-{ckpt.name}"
    one.mkdir(parents=True, exist_ok=True)
    (one / "train.json").write_text(json.dumps(json.loads(data.read_text(encoding="utf-8"))[:1]), encoding="utf-8")
    (one / "val.json").write_text(json.dumps([{"instruction": "Say hello.", "input": "", "output": "Hello."}]),
                                  encoding="utf-8")
    i = args.index("--data.json_path")
    args[i + 1] = str(one)
    j = args.index("--data.val_split_fraction")
    del args[j:j + 2]
    args += ["--eval.max_new_tokens", str(10 * length)] + (["--train.max_time", "1"] if sys.argv[5] == "1" else [])
print(shlex.join(args))
PY
echo "inputs rc=$? $(du -sh /tmp/work/checkpoints 2>/dev/null | cut -f1) in /tmp/work/checkpoints ($(( $(date +%s) - S )) s into the call)"
if [ "${BUILD:-0}" = 1 ] && [ "${RUN:-0}" != 1 ]; then exit 0; fi
# (the plan's lines, litgpt's iterations and errors printed as they come: a call's limit may end the call first)
LIT_LIGER_BENCH_DEVICE_GIB=${CARD_GIB:-79.19} timeout -k ${KILL_S:-60} ${RUN_S:-$(( 540 - $(date +%s) + S ))} \
  bash -c "python3 -m benchmarks diag cli-mem /tmp/o/$NAME-mem.json --top 40 -- $(cat /tmp/args.txt) ${EXTRA:-}" \
  2>&1 | while IFS= read -r line; do printf '[%ss] %s\n' "$(( $(date +%s) - S ))" "$line"; done \
  | tee "/tmp/o/$NAME-mem.log" \
  | grep --line-buffered -E "memory plan|Memory Used|iter [12] |Training time|merge|Error|error"
echo "mem rc=${PIPESTATUS[0]} ($(( $(date +%s) - S )) s)"
grep -A42 '"peak_live_GiB"' "/tmp/o/$NAME-mem.log" | cut -c1-220
pack
