# Issue 66 after the LoRA dropout's mask kept as bits where the LoRA input is kept anyway (attention proj, fc_1/fc_2's
# shared input, the MLP proj's GLU product formed again from the GLU's inputs): GPU tests of it and issue 68's GPU pair
# test; gemma2-2b's shipped LoRA recipe on a tied checkpoint, stock and lit-liger, in one call.
#   run: CALL=g1 bash benchmarks/calls/issue66-bits.sh     (carry: .whl)
CALL=${CALL:-g} . benchmarks/calls.sh
timeout ${TEST_S:-100} python3 -m pytest -q -p no:cacheprovider tests/test_dropout.py tests/test_lora.py \
  "tests/test_memplan.py::test_gpu_offloaded_pairs_same_as_keeping_and_no_higher_peak" \
  > "/tmp/o/$NAME-pytest.log" 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
LORA="--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true"
timeout ${RECIPE_S:-330} python3 -m benchmarks recipe --models gemma-2-2b --methods lora --micro_batches 2 --global_batch 6 \
  --variants stock,liger --iters ${ITERS:-150} --warmup 30 --work_dir /tmp/work --tied_head --out "/tmp/o/$NAME-gemma2" \
  --litgpt_args "$LORA" > "/tmp/o/$NAME-gemma2.log" 2>&1
echo "gemma2 rc=$?"; grep -E "^gemma" "/tmp/o/$NAME-gemma2.log"; leftovers
pack
