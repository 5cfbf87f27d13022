# Issue 66: the host side of gemma2-2b's shipped LoRA recipe: what a CUDA graph launch costs per node and kind of node
# (`diag graph-launch`), then the recipe row (tied checkpoint, lit-liger) with LIT_LIGER_PROFILE over 20 steady
# iterations and the host's Python profile (`,host`: cProfile; its tok/s is the profilers', not a row).
#   run: CALL=h1 bash benchmarks/calls/issue66-host.sh     (carry: .whl)
CALL=${CALL:-h} . benchmarks/calls.sh
timeout ${DIAG_S:-120} python3 -m benchmarks diag graph-launch "/tmp/o/$NAME-graph-launch.json" > "/tmp/o/$NAME-graph-launch.log" 2>&1
echo "graph-launch rc=$? ($(( $(date +%s) - S )) s)"; tail -30 "/tmp/o/$NAME-graph-launch.log"
if [ -z "$NO_RECIPE" ]; then
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
LIT_LIGER_PROFILE=/tmp/o/prof,120,20,host timeout ${PROF_S:-200} python3 -m benchmarks recipe --models gemma-2-2b --methods lora \
  --micro_batches 2 --global_batch 6 --variants liger --iters 150 --warmup 40 --work_dir /tmp/work --tied_head \
  --out "/tmp/o/$NAME-recipe" --litgpt_args "$LORA" > "/tmp/o/$NAME-recipe.log" 2>&1
echo "recipe rc=$? ($(( $(date +%s) - S )) s)"; grep -E "^gemma" "/tmp/o/$NAME-recipe.log"
grep -h "busy\|wall_ms" /tmp/work/recipe-runs/*/stdout.txt | cut -c1-600
python3 - <<'PY'
import json, glob
for f in glob.glob("/tmp/o/prof/*summary.json"):
    s = json.load(open(f))
    print("graph_launches", s.get("graph_launches")); print("host_calls", s.get("host_calls"))
    for k in ("host_top", "host_cumulative"):
        print(k)
        for r in s.get(k, [])[:30]: print("  %8.3f %7d  %s" % (r[2], r[1], r[0][:110]))
PY
gzip -f /tmp/o/prof/*trace.json 2>/dev/null; ls -la /tmp/o/prof
fi
pack
