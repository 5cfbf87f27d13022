# call c4: the shipped LoRA recipe (c2, c3) with a fresh Triton cache, then again with that cache filled (both with the
# recipe's saves): what a cold start costs the run, and which Triton kernels it compiles (the cache's entries)
CALL=c4; . benchmarks/calls.sh
export TRITON_CACHE_DIR=/tmp/o/triton-cache
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec c Llama-3.2-1B lora 1 liger 1000 40 150
python3 - <<'PY'
import json, collections, pathlib
names = collections.Counter()
for p in pathlib.Path("/tmp/o/triton-cache").glob("*/*.json"):
    if p.name.startswith("__grp__"):
        continue
    try:
        m = json.loads(p.read_text())
    except Exception:
        continue
    if "name" in m:
        names[m["name"]] += 1
print("compiled kernels:", sum(names.values()), dict(names))
PY
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec w Llama-3.2-1B lora 1 liger 1000 40 150
for f in /tmp/o/c4-run-*.txt; do echo "$f: $(grep '^Epoch' $f | awk -F'iter time: ' '{split($2,a," "); s+=a[1]} END {printf "iters %.1f s", s/1000}') evals $(grep 'val time' $f | awk -F'val time: ' '{split($2,a," "); s+=a[1]} END {printf "%.1f s", s/1000}') $(grep 'Training Time' $f)"; done
rm -rf /tmp/o/triton-cache
pack
