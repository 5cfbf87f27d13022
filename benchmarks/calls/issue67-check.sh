# Issue 67's GPU checks, in two calls (carry: .whl .base, .base = `git archive 571127d`, the commit before issue 67):
#   PART=tests CALL=t bash benchmarks/calls/issue67-check.sh   every `gpu`-marked test of this checkout (TEST_S at most)
#   PART=rows  CALL=r bash benchmarks/calls/issue67-check.sh   the README's headline rows before (.base) and after (.)
#   PART=trainer CALL=a ROUNDS=2 bash ...                        the Trainer row alone, after and before in turns
#     in one call: Llama-3.2-1B LoRA and full fine-tuning at micro-batch 4 (litgpt's CLI), the Trainer with LoRA
CALL=${CALL:-a} . benchmarks/calls.sh
export PATH=/tmp/site/bin:$PATH
if [ "${PART:-rows}" = tests ]; then  # (WORKERS pytest-xdist processes, one file each: carry xdist's wheels in .whl)
  (cd tests && timeout 120 python3 ../benchmarks/calls/pool_growth.py > "/tmp/o/$NAME-pool.log" 2>&1; echo "pool rc=$?")
  head -40 "/tmp/o/$NAME-pool.log"
  timeout ${TEST_S:-500} python3 -m pytest -q -p no:cacheprovider -m gpu -rfEs -n "${WORKERS:-4}" --dist loadfile \
    --durations 15 tests/ > "/tmp/o/$NAME-pytest.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|^[0-9.]+s (call|setup)" "/tmp/o/$NAME-pytest.log" | tail -45
  pack; exit 0
fi
rows() {  # rows NAME DIR VARIANTS METHOD
  (cd "$2" && timeout 200 python3 -m benchmarks recipe --models Llama-3.2-1B --methods "$4" --micro_batches 4 \
     --variants "$3" --iters 300 --warmup 40 --work_dir /tmp/work --out "/tmp/o/$NAME-$1" > "/tmp/o/$NAME-$1.log" 2>&1)
  echo "$1 rc=$?"; grep -E "^Llama" "/tmp/o/$NAME-$1.log"; leftovers
}
trainer() {  # trainer NAME DIR
  (cd "$2" && timeout 150 python3 -m benchmarks trainer --devices 1 --variants liger --batches 300 --warm 40 \
     --out "/tmp/o/$NAME-$1" > "/tmp/o/$NAME-$1.log" 2>&1)
  echo "$1 rc=$? ($(( $(date +%s) - S )) s into the call)"; grep -E "^ROW|^batch" "/tmp/o/$NAME-$1/"*.log | cut -c1-200
  leftovers
}
if [ "${PART:-rows}" = trainer ]; then  # the Trainer row alone, before and after in turns (ROUNDS of each)
  for i in $(seq "${ROUNDS:-2}"); do
    for side in new base; do
      dir=.; [ $side = base ] && dir=.base
      python3 -m pip install -q --no-index --no-deps --no-build-isolation -e $dir >/dev/null 2>&1
      trainer $side-trainer-$i $dir
    done
  done
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
  pack; exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .base >/dev/null 2>&1 && echo "base installed"
rows base-lora .base liger lora
rows base-full .base liger full
trainer base-trainer .base
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 && echo "this checkout installed"
rows new-lora . liger lora
rows new-full . liger full
trainer new-trainer .
pack
