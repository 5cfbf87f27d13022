# Issue 66's recipe rows: litgpt's shipped LoRA recipes of gemma2-2b and phi-2 (their model, LoRA settings with
# lora_head, micro/global batch; the training loop only, on Alpaca-shaped data) and pythia-1b full fine-tuning
# (micro-batch 4), stock and lit-liger in the same call; first the GPU tests of the new kernels and swaps.
#   run: CALL=b bash benchmarks/calls/issue66-recipes.sh     (carry: .whl)
CALL=${CALL:-b} . benchmarks/calls.sh
# (whole files: on a CUDA machine every test runs its kernels on the GPU, the `gpu`-marked ones at real sizes)
timeout 200 python3 -m pytest -q -x -p no:cacheprovider ${GPU_TESTS:-tests/test_lora_head.py tests/test_parallel_residual.py tests/test_layer_norm.py tests/test_gelu.py tests/test_fused_linear_cross_entropy.py} \
  > "/tmp/o/$NAME-pytest.log" 2>&1; echo "gpu tests rc=$?"; tail -3 "/tmp/o/$NAME-pytest.log"
lora() {  # lora NAME MODEL MB GLOBAL DROPOUT
  timeout 300 python3 -m benchmarks recipe --models "$2" --methods lora --micro_batches "$3" --global_batch "$4" \
    --variants stock,liger --iters "${ITERS:-240}" --warmup 40 --work_dir /tmp/work --out "/tmp/o/$NAME-$1" \
    --litgpt_args "--lora_r 8 --lora_alpha 16 --lora_dropout $5 --lora_query true --lora_key true --lora_value true --lora_projection true --lora_mlp true --lora_head true" \
    > "/tmp/o/$NAME-$1.log" 2>&1
  echo "$1 rc=$?"; grep -E "^$2" "/tmp/o/$NAME-$1.log"; leftovers
}
lora gemma2 gemma-2-2b 2 6 0.1
lora phi2 phi-2 4 8 0.05
timeout 240 python3 -m benchmarks recipe --models pythia-1b --methods full --micro_batches 4 --variants stock,liger \
  --iters 240 --warmup 40 --work_dir /tmp/work --out "/tmp/o/$NAME-pythia" > "/tmp/o/$NAME-pythia.log" 2>&1
echo "pythia rc=$?"; grep -E "^pythia" "/tmp/o/$NAME-pythia.log"
pack
