# Issue 66 after the tied LoRA head and the LoRA dropout kept as one tensor: GPU tests of both; gemma2-2b's shipped
# LoRA recipe on a tied checkpoint, stock and lit-liger; the README's Llama-3.2-1B LoRA row (mb 4, dropout 0.05)
# before (BASE: a `git archive` of the session's first commit, carried as .base) and after, in one call.
#   run: CALL=d bash benchmarks/calls/issue66-dropout.sh     (carry: .whl .base)
CALL=${CALL:-d} . benchmarks/calls.sh
timeout ${TEST_S:-120} python3 -m pytest -q -p no:cacheprovider tests/test_dropout.py tests/test_lora.py tests/test_tied.py \
  > "/tmp/o/$NAME-pytest.log" 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
timeout 300 python3 -m benchmarks recipe --models gemma-2-2b --methods lora --micro_batches 2 --global_batch 6 \
  --variants stock,liger --iters 200 --warmup 40 --work_dir /tmp/work --tied_head --out "/tmp/o/$NAME-gemma2" \
  --litgpt_args "$LORA" > "/tmp/o/$NAME-gemma2.log" 2>&1
echo "gemma2 rc=$?"; grep -E "^gemma" "/tmp/o/$NAME-gemma2.log"; leftovers
rows() {  # rows NAME DIR VARIANTS
  (cd "$2" && timeout 200 python3 -m benchmarks recipe --models Llama-3.2-1B --methods lora --micro_batches 4 \
     --variants "$3" --iters 300 --warmup 40 --work_dir /tmp/work --out "/tmp/o/$NAME-$1" > "/tmp/o/$NAME-$1.log" 2>&1)
  echo "$1 rc=$?"; grep -E "^Llama" "/tmp/o/$NAME-$1.log"; leftovers
}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .base >/dev/null 2>&1 && echo "base installed"
rows base-lora .base liger
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 && echo "this checkout installed"
rows new-lora . liger
pack
