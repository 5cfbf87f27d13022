# Helpers for a device call's script (the `run` tool runs it in the checkout's root on the GPU machine):
#
#   CALL=r5 . benchmarks/calls.sh       # installs the carried wheels and this checkout; results under /tmp/o
#   rec lora2 Llama-3.2-1B lora 2 liger,liger-no-balance 300 60 200 [ENV=VALUE ...]
#   logs /tmp/o/$NAME-run-*.txt          # iteration times of litgpt's logs (python -m benchmarks.logtimes)
#   pack                                 # /tmp/o into $OUT/$NAME.tgz (the tool returns at most 8 files)
#
# (NAME keeps the call's name: bash forgets a CALL=... given on the `.` line once the source returns)
#
# Wheels: carry `.whl` (../shared/gpu/wheelhouse.sh fills it) or, to keep a call under the tool's 64 MiB, `.whl-lean`
# (the same without bitsandbytes). `S` holds the call's start (seconds) for time-slot arithmetic.
S=$(date +%s)
NAME=${CALL:?set CALL to the call name before sourcing}  # (CALL=x . calls.sh: bash drops CALL after the source)
WHEELS=$(ls -d .whl-lean 2>/dev/null || echo .whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,power.draw --format=csv,noheader
rm -rf /tmp/o; mkdir -p /tmp/o  # (a machine may keep an earlier session's /tmp)

pack() { tar czf "$OUT/$NAME.tgz" -C /tmp/o . ; }

# leftovers: processes still on the GPUs after a run, said and killed. A run stopped at its time limit may leave ranks
# behind that hold memory and slow the next run. In h200x2-2026-11-27i the runs after such stops were slower or
# stopped; that this was the cause is not confirmed.
leftovers() {
  local apps; apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null)
  [ -z "$apps" ] && return 0
  echo "leftover GPU processes (killed): $(echo "$apps" | tr '\n' ';')"
  echo "$apps" | cut -d, -f1 | xargs -r kill -9 2>/dev/null; sleep 2
}

logs() { python3 -m benchmarks.logtimes --warmup "${WARMUP:-0}" "$@"; }

# use_code new|NAME: install this checkout or the code of a commit before (.NAME, e.g. .base: a `git archive` of it
# without results and docs, where carried; status 1 where not), for before/after rows in one call (run the row inside
# .NAME)
use_code() {
  local dir=.
  if [ "$1" != new ]; then dir=.$1; [ -d "$dir" ] || return 1; fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e "$dir" >/dev/null 2>&1 && echo "$1 installed"
}

# gemma2 SECONDS [VARIANTS [TAG]]: gemma2-2b's shipped LoRA recipe (micro-batch 2, global batch 6, LoRA r8 with
# dropout on every projection and the head; tied checkpoint), ITERS iterations (30 untimed), into /tmp/o/$NAME-gemma2TAG
GEMMA2_LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true"
GEMMA2_LORA="$GEMMA2_LORA --lora_projection true --lora_mlp true --lora_head true"  # (the recipe's LoRA settings)
gemma2() {
  timeout "$1" python3 -m benchmarks recipe --models gemma-2-2b --methods lora --micro_batches 2 --global_batch 6 \
    --variants "${2:-stock,liger}" --iters "${ITERS:-120}" --warmup 30 --work_dir /tmp/work --tied_head \
    --out "/tmp/o/$NAME-gemma2$3" --litgpt_args "$GEMMA2_LORA" > "/tmp/o/$NAME-gemma2$3.log" 2>&1
  echo "gemma2$3 rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^gemma" "/tmp/o/$NAME-gemma2$3.log"; leftovers
}

# gemma2_prof: the same recipe (lit-liger, 150 iterations) with LIT_LIGER_PROFILE over iterations 120-139: the row in
# /tmp/o/$NAME-recipe, the profile's summary and its trace (gzipped) in /tmp/o/prof (PROF_S: the time limit)
gemma2_prof() {
  LIT_LIGER_PROFILE=/tmp/o/prof,120,20 timeout ${PROF_S:-170} python3 -m benchmarks recipe --models gemma-2-2b \
    --methods lora --micro_batches 2 --global_batch 6 --variants liger --iters 150 --warmup 40 --work_dir /tmp/work \
    --tied_head --out "/tmp/o/$NAME-recipe" --litgpt_args "$GEMMA2_LORA" > "/tmp/o/$NAME-recipe.log" 2>&1
  echo "recipe rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^gemma" "/tmp/o/$NAME-recipe.log"
  grep -h "busy\|wall_ms" /tmp/work/recipe-runs/*/stdout.txt | cut -c1-1500
  gzip -f /tmp/o/prof/*trace.json 2>/dev/null; ls -la /tmp/o/prof
}

# llama1b TAG [DIR]: the README's Llama-3.2-1B LoRA row (micro-batch 4, lit-liger, LITERS iterations, 30 untimed), run
# inside DIR (default .; .base for the code before), into /tmp/o/$NAME-TAG
llama1b() {
  (cd "${2:-.}" && timeout ${ROW_S:-120} python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 \
     --variants liger --iters ${LITERS:-200} --warmup 30 --work_dir /tmp/work --out "/tmp/o/$NAME-$1" > "/tmp/o/$NAME-$1.log" 2>&1)
  echo "$1 rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^Llama" "/tmp/o/$NAME-$1.log"; leftovers
}

# row_cmd RECIPE_JSON VARIANT STEPS OUT_DIR [LIGER]: that row's `lit-liger` arguments (shell-quoted) with
# --train.max_steps STEPS, --out_dir OUT_DIR and, given LIGER, --liger LIGER (e.g. false: the same run stock)
row_cmd() {
  python3 - "$@" <<'PY'
import json, shlex, sys
rows = json.load(open(sys.argv[1]))["rows"]
cmd = shlex.split([r for r in rows if r["variant"] == sys.argv[2]][0]["command"])[1:]
changes = [("--train.max_steps", sys.argv[3]), ("--out_dir", sys.argv[4])] + [("--liger", v) for v in sys.argv[5:6]]
for flag, value in changes:
    cmd[cmd.index(flag) + 1] = value
print(shlex.join(cmd))
PY
}

# rec N MODELS METHOD DEVICES VARIANTS ITERS WARMUP TIMEOUT [ENV=VALUE ...]: one `benchmarks recipe` run (micro-batch
# 4; RECIPE_ARGS: more of its options, e.g. "--config configs/llama-3.2-1B/lora.yaml --n_samples 2000") into
# /tmp/o/$NAME-N/ (N: the first argument), each run's stdout kept as /tmp/o/$NAME-run-N-*.txt (lit-liger's
# report lines printed), the rows' headline numbers printed; packed after each
rec() {
  local n=$1 m=$2 me=$3 dv=$4 va=$5 it=$6 wu=$7 to=$8; shift 8
  env "$@" timeout "$to" python3 -m benchmarks recipe --models "$m" --methods "$me" --micro_batches 4 --devices "$dv" \
    --variants "$va" --iters "$it" --warmup "$wu" --work_dir /tmp/work --out "/tmp/o/$NAME-$n" ${RECIPE_ARGS:-} \
    > "/tmp/o/$NAME-$n.log" 2>&1
  echo "$n rc=$?"
  leftovers
  for f in /tmp/work/recipe-runs/*/stdout.txt; do
    [ -f "$f" ] || continue
    cp "$f" "/tmp/o/$NAME-run-$n-$(basename "$(dirname "$f")").txt"
    for m in "$(dirname "$f")"/logs/csv/*/metrics.csv; do  # (litgpt's csv log, where there is one)
      [ -f "$m" ] && cp "$m" "/tmp/o/$NAME-metrics-$n-$(basename "$(dirname "$f")").csv"
    done
    grep -hE "garbage collector|dealt by length|input shapes captured|Error|out of memory" "$f" | cut -c1-330 | head -4
  done
  rm -rf /tmp/work/recipe-runs
  python3 - "/tmp/o/$NAME-$n/recipe.json" "$n" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except OSError:
    rows = []
keys = ("status", "tokens_per_s", "mfu_nominal", "iter_ms_mean", "iter_ms_mean_steady", "stalls", "peak_memory_gb",
        "graph_capture_s", "graph_gpu_wait_s", "graph_capture_share", "train_wall_s", "wall_s", "completed")
for r in rows:
    print(sys.argv[2], r.get("devices"), r["variant"], {k: r.get(k) for k in keys}, "loss", (r.get("losses") or [None])[-2:])
PY
  pack
  echo "t=$(( $(date +%s) - S ))s"
}
