# Issue 66's check of the README's headline rows: Llama-3.2-1B LoRA and full fine-tuning, micro-batch 4, lit-liger
# before (BASE, a `git archive` of the commit before issue 66's work, carried as .base) and after, in one call; and
# the LoRA row through stock litgpt's console script (the plugin, `liger-via-litgpt`) beside `lit-liger`'s.
#   run: CALL=a bash benchmarks/calls/issue66-headline.sh     (carry: .whl .base)
# then the GPU tests of the new kernels come first (TEST_S seconds at most, GPU_TESTS to choose the files).
CALL=${CALL:-a} . benchmarks/calls.sh
export PATH=/tmp/site/bin:$PATH
# the new kernels' and swaps' tests on the GPU (whole files: every test runs its kernels on the GPU)
timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider ${GPU_TESTS:-tests/test_parallel_residual.py tests/test_gelu.py tests/test_layer_norm.py tests/test_lora_head.py} \
  > "/tmp/o/$NAME-pytest.log" 2>&1; echo "gpu tests rc=$?"; grep -E "passed|failed|FAILED|Error" "/tmp/o/$NAME-pytest.log" | tail -8
rows() {  # rows NAME DIR VARIANTS METHOD
  (cd "$2" && timeout 280 python3 -m benchmarks recipe --models Llama-3.2-1B --methods "$4" --micro_batches 4 \
     --variants "$3" --iters 300 --warmup 40 --work_dir /tmp/work --out "/tmp/o/$NAME-$1" > "/tmp/o/$NAME-$1.log" 2>&1)
  echo "$1 rc=$?"; grep -E "^Llama" "/tmp/o/$NAME-$1.log"; leftovers
}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .base >/dev/null 2>&1 && echo "base installed"
rows base-lora .base liger lora
rows base-full .base liger full
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 && echo "this checkout installed"
python3 -m lit_liger litgpt_plugin install
rows new-lora . stock,liger,liger-via-litgpt,liger lora
rows new-full . liger full
pack
