#!/usr/bin/env bash
# One device-tool call per phase (each under the 10-minute limit), from the repo root, with carry [".whl"]:
#   bash scripts/gpu_session.sh tests|final|...|attn1|attn2|last|next15|next15b|next16|ckpt|ckpt2|ckpt3|ckpt4|ckpt5|mem6|tied|mem7|mem7b|mem8|mem9|mem9b|final7|g15|g15b|rest|rest2|att1|att2|att3|att4|att5|att6|att7|att8|b1..b10|c1.. (the case labels below)
# Results go to /tmp/res/<phase> and come back as $OUT/<phase>.tgz plus the log.
set -uo pipefail
phase=$1
source scripts/gpu_env.sh
R=/tmp/res/$phase; mkdir -p "$R"
log=$OUT/$phase.log
{
case $phase in
  tests)  # GPU tests (real sizes, compile fullgraph, the loss hand-over), then RoPE and FLCE kernels
    timeout 300 python3 -m pytest -m "gpu and not slow" tests/ -q -p no:cacheprovider -rs 2>&1 | tail -40
    timeout 100 python3 -m benchmarks kernels --ops rope --out "$R/rope"
    timeout 170 python3 -m benchmarks kernels --ops flce --out "$R/flce" ;;
  final)  # after the compile-memory change: GPU tests of the changed ops, then the step with and without compile
    timeout 200 python3 -m pytest -m "gpu and not slow" -q -p no:cacheprovider -rs tests/test_adapter.py \
      tests/test_rms_norm.py tests/test_swiglu.py tests/test_fused_linear_cross_entropy.py tests/test_rope.py 2>&1 | tail -15
    timeout 200 python3 -m benchmarks step --models Llama-3.2-1B --variants eager,lit-liger,compile,lit-liger+compile \
      --profile --out "$R/step"
    timeout 150 python3 -m benchmarks step --models Qwen3-1.7B --variants lit-liger,compile,lit-liger+compile \
      --profile --out "$R/step-qwen" ;;
  diag)  # rope_qkv host/GPU timing + sync check, fused-loss memory with one chunk; Qwen3 lit-liger+compile
    timeout 120 python3 scripts/gpu_diag.py "$R/diag.json"
    timeout 200 python3 -m benchmarks step --models Qwen3-1.7B --variants lit-liger+compile --profile --out "$R/step-qwen" ;;
  flce)   # fused loss: where lean's extra memory goes (memory-history replay), chunk sweep of both modes
    timeout 400 python3 scripts/gpu_flce_diag.py "$R/flce_diag.json" ;;
  after)  # after the fused loss stopped zero-filling its unused outputs' gradients: its GPU tests, the kernel
          # benchmark, and the Llama step (the backward starts next to the stored dW)
    timeout 150 python3 -m pytest -m "gpu and not slow" -q -p no:cacheprovider -rs tests/test_fused_linear_cross_entropy.py \
      tests/test_gpu_compile.py tests/test_adapter.py 2>&1 | tail -8
    timeout 180 python3 -m benchmarks kernels --ops flce --out "$R/flce"
    timeout 240 python3 -m benchmarks step --models Llama-3.2-1B --variants eager,lit-liger,compile,lit-liger+compile \
      --out "$R/step" ;;
  small)  # small micro-batches (LoRA-style B x T = 1 x 512 .. 4 x 512), where host launch overhead can dominate
    for bt in "1 512" "4 512" "2 2048"; do set -- $bt
      timeout 170 python3 -m benchmarks step --models Llama-3.2-1B --variants eager,lit-liger,compile --batch_size $1 \
        --seq_len $2 --profile --out "$R/step-B$1-T$2"; done ;;
  small2) # the same small micro-batches, with and without compile on top of lit-liger
    for bt in "1 512" "4 512"; do set -- $bt
      timeout 200 python3 -m benchmarks step --models Llama-3.2-1B --variants eager,lit-liger,compile,lit-liger+compile \
        --batch_size $1 --seq_len $2 --out "$R/step-B$1-T$2"; done ;;
  smallc) # compile_min_tokens: small micro-batches under compile (default: LitGPT's code there) vs compile
    for bt in "1 512" "4 512"; do set -- $bt
      timeout 250 python3 -m benchmarks step --models Llama-3.2-1B --variants compile,lit-liger+compile \
        --batch_size $1 --seq_len $2 --out "$R/step-B$1-T$2"; done ;;
  crossc) # 4096 tokens (B2 x T2048) under compile: lit-liger's ops (threshold 0) vs LitGPT's code (threshold 8192)
    timeout 200 python3 -m benchmarks step --models Llama-3.2-1B --variants compile,lit-liger+compile --batch_size 2 \
      --seq_len 2048 --liger_config '{"compile_min_tokens": 0}' --out "$R/step-B2-T2048-ops"
    timeout 200 python3 -m benchmarks step --models Llama-3.2-1B --variants lit-liger+compile --batch_size 2 \
      --seq_len 2048 --liger_config '{"compile_min_tokens": 8192}' --out "$R/step-B2-T2048-litgpt" ;;
  host)   # where the host's time goes in a small-batch step (eager vs lit-liger): per phase, cProfile, torch.profiler
    timeout 400 python3 scripts/gpu_host_profile.py "$R/host" 1 512 ;;
  step1)
    timeout 560 python3 -m benchmarks step --models Llama-3.2-1B --profile --out "$R/step" ;;
  step2)
    timeout 560 python3 -m benchmarks step --models Qwen3-1.7B,gemma-2-2b --profile --out "$R/step" ;;
  multi)  # 2 GPUs: Trainer + LigerCallback under ZeRO-3 (fused loss in the engine's forward) and FSDP
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    timeout 520 python3 -m benchmarks strategies --strategies deepspeed3,fsdp,deepspeed2 --devices 2 --steps 20 \
      --n_layer 4 --timeout 80 --out "$R/strategies" ;;
  ft8b)   # 2 GPUs: Llama-3.1-8B-shaped finetune_full (FSDP), stock vs lit-liger at B=8, then at B=16
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    timeout 570 python3 -m benchmarks finetune --model Llama-3.1-8B --methods full --devices 2 --steps 8 \
      --micro_batch_size 8 --also_micro_batch 16 --max_seq_length 4096 --out "$R/finetune" ;;
  mem)    # issue 16: GPU tests of the graph paths; the graphs' memory settings (one process each, same lengths);
          # the fixed 4x512 recipe (every sample truncated) stock vs lit-liger with and without graphs
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_buckets.py > "$R/pytest.log" 2>&1
    grep -E "^E |Error|passed|failed" "$R/pytest.log" | head -30
    for b in 4 1; do for v in stock nog g0 gpool ggrow gboth; do
      [ $b = 1 ] && [ $v != stock ] && [ $v != nog ] && [ $v != gboth ] && continue
      timeout 90 python3 scripts/gpu_recipe_mem.py $v $b 64 "$R/mem.jsonl" 2>&1 | grep -v -i warn | tail -1 | cut -c1-420
    done; done
    [ -n "${FIXED:-}" ] && timeout 240 python3 -m benchmarks recipe --lengths fixed --micro_batches 4 --iters 60 \
      --variants stock,liger-no-graphs,liger --out "$R/recipe-fixed" 2>&1 | grep "lora B" ;;
  compile) # issue 16: GPU tests of the graph paths, the default memory settings again, torch.compile on the same
           # lengths (stock and lit-liger), and the 200-step LoRA recipe at B4 (800 iterations)
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_buckets.py > "$R/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed" "$R/pytest.log" | head -20
    for b in 4 1; do timeout 90 python3 scripts/gpu_recipe_mem.py gboth $b 64 "$R/mem.jsonl" 2>&1 | grep -v -i warn \
      | tail -1 | cut -c1-300; done
    for v in compile liger+compile; do timeout 130 python3 scripts/gpu_recipe_mem.py $v 4 64 "$R/mem.jsonl" 2>&1 \
      | grep -v -i warn | tail -1 | cut -c1-300; done
    timeout 300 python3 -m benchmarks recipe --micro_batches 4 --iters 800 --warmup 40 --variants stock,liger \
      --out "$R/recipe-200steps" 2>&1 | grep "lora B" ;;
  attn1)  # issue 15: GPU parity of the FlexAttention layers (softcap scale specialized), then gemma-2-2b, 5 variants
    timeout 220 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_attention.py > "$R/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed" "$R/pytest.log" | head -20
    timeout 330 python3 -m benchmarks step --models gemma-2-2b --out "$R/step-gemma2" 2>&1 | tail -25 ;;
  attn2)  # issue 15: the GPU tests not reached in attn1 (per-test durations), then the Mistral-7B shape (8 layers,
          # window 1024 < T 2048), 5 variants, lit-liger's last (anything it leaves allocated can only hurt its own)
    timeout -s INT -k 20 250 python3 -m pytest -m gpu -k "not module_matches" -q -p no:cacheprovider -rs --tb=short \
      --durations=0 tests/test_attention.py > "$R/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|s call" "$R/pytest.log" | head -30
    timeout 300 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 8 --sliding_window_size 1024 \
      --variants eager,compile,liger-kernel,lit-liger,lit-liger+compile --out "$R/step-mistral" 2>&1 | tail -9 ;;
  rec)    # issue 15: gemma-3-1b (window 512 < T 2048); issue 16 with the final graphs default: LoRA B4 and B1
    timeout 270 python3 -m benchmarks step --models gemma-3-1b-it \
      --variants eager,compile,liger-kernel,lit-liger,lit-liger+compile --out "$R/step-gemma3" 2>&1 | tail -9
    timeout 270 python3 -m benchmarks recipe --micro_batches 4,1 --iters 160 --variants stock,liger \
      --out "$R/recipe-llama" 2>&1 | grep "lora B" ;;
  last)   # the last minutes: the Mistral-7B shape (8 layers, window 1024 < T 2048), then LoRA B4 with the final graphs
          # default; written straight to $OUT so a run cut short still brings back what finished
    timeout 320 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 8 --sliding_window_size 1024 \
      --variants eager,compile,lit-liger,lit-liger+compile --steps 6 --warmup 2 --out "$OUT/step-mistral" 2>&1 | tail -7
    timeout 125 python3 -m benchmarks recipe --micro_batches 4 --iters 100 --variants stock,liger \
      --out "$OUT/recipe-llama" 2>&1 | grep "lora B" ;;
  next15) # what issue 15 still needs on a GPU (each variant in its own process now): the check test cut in attn2,
          # gemma-2-2b's 5 variants again, Mistral's shape without stock compile (its LitGPT mask loop unrolls under
          # dynamo; run it alone with a long limit if at all), gemma-3-1b
    timeout 150 python3 -m pytest -m gpu -k check_covers -q -p no:cacheprovider -rs --tb=short tests/test_attention.py \
      2>&1 | tail -3
    timeout 330 python3 -m benchmarks step --models gemma-2-2b --out "$OUT/step-gemma2" 2>&1 | tail -7 ;;
  s5a)    # session 5: the leak's GPU test, the check test, gemma-2-2b without eager (it OOMs) with a GPU profile
    timeout 100 python3 -m pytest -m gpu -k freed -q -p no:cacheprovider -rs --tb=short tests/test_buckets.py \
      2>&1 | tail -4
    timeout 130 python3 -m pytest -m gpu -k check_covers -q -p no:cacheprovider -rs --tb=short tests/test_attention.py \
      2>&1 | tail -3
    timeout 300 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile,liger-kernel \
      --steps 6 --warmup 2 --profile --out "$OUT/step-gemma2" 2>&1 | tail -7 ;;
  s5b)    # session 5: FlexAttention launch settings (explicit candidates, inductor's autotune), then gemma-3-1b
    timeout 320 python3 scripts/flex_sweep.py --out "$OUT/flex" 2> "$OUT/flex_sweep.err"
    grep -A4 "^AUTOTUNE\|^# autotuning" "$OUT/flex_sweep.err" | head -60
    timeout 210 python3 -m benchmarks step --models gemma-3-1b-it --variants eager,lit-liger,compile,lit-liger+compile \
      --steps 6 --warmup 2 --out "$OUT/step-gemma3" 2>&1 | tail -6 ;;
  s5c)    # session 5: with the FlexAttention launch settings for head size 256 (kernels/_launch.flex_kernel_options)
    timeout 90 python3 scripts/flex_sweep.py --out "$OUT/flex-after" --no_autotune --no_candidates 2>&1 | grep "fwd+bwd"
    timeout 150 python3 -m pytest -m gpu -k "(bf16 and gemma) or fullgraph" -q -p no:cacheprovider -rs --tb=short \
      tests/test_attention.py 2>&1 | tail -3
    timeout 200 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger,lit-liger+compile \
      --steps 6 --warmup 2 --profile --out "$OUT/step-gemma2" 2>&1 | tail -4
    timeout 110 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 8 --sliding_window_size 1024 \
      --variants eager,lit-liger --steps 6 --warmup 2 --out "$OUT/step-mistral" 2>&1 | tail -4 ;;
  s5d)    # session 5: the backward-only launch settings; the gemma-2 LoRA recipe, 200 iterations (loss curve)
    timeout 60 python3 scripts/flex_sweep.py --out "$OUT/flex-bwd" --shapes gemma2,gemma3 --no_autotune \
      --no_candidates 2>&1 | grep "fwd+bwd"
    timeout 390 python3 -m benchmarks recipe --models gemma-2-2b --micro_batches 4 --iters 200 --variants stock,liger \
      --out "$OUT/recipe-gemma2" 2>&1 | grep "lora B" ;;
  next15b)
    timeout 280 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 8 --sliding_window_size 1024 \
      --variants eager,lit-liger,lit-liger+compile,liger-kernel --steps 6 --warmup 2 --out "$OUT/step-mistral" 2>&1 | tail -6
    timeout 280 python3 -m benchmarks step --models gemma-3-1b-it --variants eager,lit-liger,compile,lit-liger+compile \
      --steps 6 --warmup 2 --out "$OUT/step-gemma3" 2>&1 | tail -6 ;;
  next16) # issue 16: micro-batch 1 with the final graphs default; issue 15: the gemma-2 LoRA curve (200 iterations)
    timeout 200 python3 -m benchmarks recipe --micro_batches 1 --iters 160 --variants stock,liger \
      --out "$OUT/recipe-llama-b1" 2>&1 | grep "lora B"
    timeout 330 python3 -m benchmarks recipe --models gemma-2-2b --micro_batches 4 --iters 200 --variants stock,liger \
      --out "$OUT/recipe-gemma2" 2>&1 | grep "lora B" ;;
  ckpt)   # issue 16: activation checkpointing's GPU tests, then LoRA at micro-batch 1 and 4 with it (uncaptured and
          # captured) against stock and the default
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/test_checkpointing.py 2>&1 | tail -6
    for b in 1 4; do
      timeout 200 python3 -m benchmarks recipe --micro_batches $b --iters 96 \
        --variants stock,liger,liger-ckpt,liger-ckpt-graphs --out "$R/recipe-ckpt-b$b" 2>&1 | grep "lora B"; done ;;
  ckpt2)  # issue 16: where micro-batch 1's memory goes with checkpointing (peak composition, loss chunk settings);
          # LoRA micro-batch 1 with checkpointing captured (cut by the time limit in ckpt)
    for v in stock liger ckpt ckpt-lean ckpt-rows256 ckpt-rows128; do
      timeout 90 python3 scripts/gpu_ckpt_mem.py $v "$R/ckpt_mem.jsonl" 2>&1 | grep -v -i warn | tail -40; done
    timeout 200 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger-ckpt-graphs \
      --out "$R/recipe-ckpt-b1" 2>&1 | grep "lora B" ;;
  ckpt3)  # issue 16 after the loss chunk cap and capture on by default: GPU tests, the step's memory, LoRA micro-batch 1
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/test_checkpointing.py \
      tests/test_fused_linear_cross_entropy.py 2>&1 | tail -4
    for v in ckpt ckpt-lean; do
      timeout 90 python3 scripts/gpu_ckpt_mem.py $v "$R/ckpt_mem.jsonl" 2>&1 | grep -v -i warn | grep -A3 '"variant"\|trace_peak'; done
    timeout 280 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger,liger-ckpt,liger-ckpt-lean \
      --out "$R/recipe-ckpt-b1" 2>&1 | grep "lora B" ;;
  ckpt4)  # the same at micro-batch 4, and the uncaptured checkpointed step (at 1: the graphs' share of the memory)
    timeout 150 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger-ckpt-no-graphs \
      --out "$R/recipe-ckpt-b1-nog" 2>&1 | grep "lora B"
    timeout 300 python3 -m benchmarks recipe --micro_batches 4 --iters 96 \
      --variants stock,liger,liger-ckpt,liger-ckpt-lean,liger-ckpt-no-graphs --out "$R/recipe-ckpt-b4" 2>&1 | grep "lora B" ;;
  ckpt5)  # after validation took the fused loss too: the whole run's peak (validation included) at micro-batch 1 and 4
    for b in 1 4; do
      timeout 240 python3 -m benchmarks recipe --micro_batches $b --iters 96 --variants stock,liger,liger-ckpt \
        --out "$OUT/recipe-b$b" 2>&1 | grep "lora B"; done ;;
  mem6)   # issue 16, micro-batch 1 memory: the GLU backward writes its gradients over fc_1/fc_2's outputs, the graphs
          # drop cuBLAS's cached workspaces around each capture and share one d(hidden) buffer. Results first (the
          # device time may end the call), then the GPU tests of the changed paths, then micro-batch 4
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_swiglu.py 2>&1 | tail -2
    timeout 200 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger-ckpt,liger-ckpt-no-graphs \
      --out "$OUT/recipe-b1" 2>&1 | grep "lora B"
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_checkpointing.py \
      tests/test_buckets.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed" "$OUT/pytest.log" | head -20
    timeout 60 python3 scripts/gpu_ckpt_mem.py ckpt "$OUT/ckpt_mem.jsonl" 2>&1 | grep -v -i warn | tail -3 | cut -c1-600
    timeout 150 python3 -m benchmarks recipe --micro_batches 4 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-b4" 2>&1 | grep "lora B" ;;
  tied)   # issue 16 on the real checkpoint's layout: lm_head equal to the embedding (as litgpt converts Llama-3.2-1B),
          # where tied_weights keeps one copy; micro-batch 1 and 4, then the checkpointed micro-batch 4 row mem6 missed
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_tied.py 2>&1 | tail -2
    for b in 1 4; do
      timeout 200 python3 -m benchmarks recipe --tied_head --micro_batches $b --iters 96 --variants stock,liger,liger-ckpt \
        --out "$OUT/recipe-tied-b$b" 2>&1 | grep "lora B"; done
    timeout 150 python3 -m benchmarks recipe --micro_batches 4 --iters 96 --variants stock,liger-ckpt \
      --out "$OUT/recipe-b4-ckpt" 2>&1 | grep "lora B" ;;
  mem7)   # issue 16, micro-batch 1 memory: a frozen MLP in a checkpointed Block runs in chunks of rows, recomputed in
          # its backward (glu_mlp). Its GPU tests, the B1 recipe rows, the step's peak, then the tied-head checkpoint
    timeout 90 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_swiglu.py -k glu_mlp 2>&1 | tail -3
    timeout 200 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger-ckpt,liger-ckpt-no-graphs \
      --out "$OUT/recipe-b1" 2>&1 | grep "lora B"
    timeout 60 python3 scripts/gpu_ckpt_mem.py ckpt "$OUT/ckpt_mem.jsonl" 2>&1 | grep -v -i warn | tail -3 | cut -c1-600
    timeout 200 python3 -m benchmarks recipe --tied_head --micro_batches 1 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-tied-b1" 2>&1 | grep "lora B" ;;
  mem7b)  # the GPU tests of the checkpointed and captured paths, then micro-batch 4 (untied; tied)
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_checkpointing.py \
      tests/test_buckets.py tests/test_tied.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed" "$OUT/pytest.log" | head -20
    timeout 200 python3 -m benchmarks recipe --micro_batches 4 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-b4" 2>&1 | grep "lora B"
    timeout 200 python3 -m benchmarks recipe --tied_head --micro_batches 4 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-tied-b4" 2>&1 | grep "lora B" ;;
  mem8)   # after mem7: the graphs' outputs share one buffer, the tied-head check compares in blocks of rows. The GPU tests
          # of the changed paths, the step's peak (memory history with Python stacks), the B1 recipe rows
    timeout 200 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_swiglu.py -k glu_mlp \
      tests/test_buckets.py tests/test_checkpointing.py tests/test_tied.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20
    timeout 60 python3 scripts/gpu_ckpt_mem.py ckpt "$OUT/ckpt_mem.jsonl" python 2>&1 | grep -v -i warn | tail -40 | cut -c1-400
    timeout 200 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger-ckpt,liger-ckpt-no-graphs \
      --out "$OUT/recipe-b1" 2>&1 | grep "lora B" ;;
  mem9)   # after mem8: checkpoint recompute without early stop. The GPU tests of the captured, checkpointed and tied
          # paths; the step's peak with the memory history; the tied-head B1 rows
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_buckets.py \
      tests/test_checkpointing.py tests/test_tied.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20
    timeout 60 python3 scripts/gpu_ckpt_mem.py ckpt "$OUT/ckpt_mem.jsonl" python > "$OUT/ckpt_mem.log" 2>&1
    echo "ckpt_mem rc $?"; grep -v -i warn "$OUT/ckpt_mem.log" | head -30 | cut -c1-300
    timeout 200 python3 -m benchmarks recipe --tied_head --micro_batches 1 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-tied-b1" 2>&1 | grep "lora B" ;;
  mem9b)  # micro-batch 4, untied and tied
    timeout 250 python3 -m benchmarks recipe --micro_batches 4 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-b4" 2>&1 | grep "lora B"
    timeout 250 python3 -m benchmarks recipe --tied_head --micro_batches 4 --iters 96 --variants stock,liger,liger-ckpt \
      --out "$OUT/recipe-tied-b4" 2>&1 | grep "lora B" ;;
  final7) # the session's last call: every GPU test, then the B1 checkpointed row again after the early-stop change
    timeout 330 python3 -m pytest -m "gpu and not slow" tests/ -q -p no:cacheprovider -rs --tb=short > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20
    timeout 200 python3 -m benchmarks recipe --micro_batches 1 --iters 96 --variants stock,liger-ckpt \
      --out "$OUT/recipe-b1" 2>&1 | grep "lora B" ;;
  g15)    # issue 15: the fused GLU backward (product written over d h): its GPU tests, the per-layer time against the
          # recompute pass, then gemma-2-2b's step against compile (30 timed steps, each variant in its own process)
    timeout 60 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_swiglu.py 2>&1 | tail -2
    timeout 60 python3 scripts/gpu_glu_bwd.py "$OUT/glu_bwd.json"
    timeout 420 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile \
      --steps 30 --warmup 3 --out "$OUT/step-gemma2" 2>&1 | tail -5 ;;
  g15b)   # the per-layer GLU backward timing g15 missed (import), then gemma-2-2b's compile and lit-liger rows again
    timeout 60 python3 scripts/gpu_glu_bwd.py "$OUT/glu_bwd.json"
    timeout 330 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger \
      --steps 30 --warmup 3 --out "$OUT/step-gemma2-repeat" 2>&1 | tail -4 ;;
  rest)   # the GPU tests final7's run did not reach (its limit cut it inside test_attention.py)
    timeout 520 python3 -m pytest -m "gpu and not slow" -q -p no:cacheprovider -rs --tb=short tests/test_backward_thread.py \
      tests/test_callback.py tests/test_cli.py tests/test_convergence.py tests/test_fused_linear_cross_entropy.py \
      tests/test_gpu_compile.py tests/test_launch.py tests/test_layer_norm.py tests/test_lora.py tests/test_rms_norm.py \
      tests/test_rope.py tests/test_sdpa_backend.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20 ;;
  rest2)  # the files final7's cut run started with (test_adapter, test_attention), whole, on their own
    timeout 420 python3 -m pytest -m "gpu and not slow" -q -p no:cacheprovider -rs --tb=short tests/test_adapter.py \
      tests/test_attention.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20 ;;
  att1)   # issue 15: lit-liger's Triton causal/softcap attention against FlexAttention (accuracy, per-kernel sweep)
    timeout 420 python3 scripts/attn_sweep.py --out "$OUT/attn" --shapes gemma2 2>&1 | tail -30
    timeout 120 python3 scripts/attn_sweep.py --out "$OUT/attn-quick" --shapes gemma2-b1,hs128 --quick 2>&1 | tail -6 ;;
  att2)   # the Triton softcap attention in the adapter: its GPU tests and the attention module's, a second sweep
          # round around the first's best, fp32, then gemma-2-2b's lit-liger step with a profile
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      tests/test_attention.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20
    timeout 150 python3 scripts/attn_sweep.py --out "$OUT/attn2" --shapes gemma2 --round 2 2>&1 | grep -v Warn | tail -6
    timeout 60 python3 scripts/attn_sweep.py --out "$OUT/attn-fp32" --shapes gemma2-fp32 --quick 2>&1 | tail -1
    timeout 170 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger --steps 30 --warmup 3 --profile \
      --out "$OUT/step-gemma2-liger" 2>&1 | tail -4 ;;
  att3)   # att2's GPU tests again (its 200 s limit cut them; the family test's report check fixed), a third sweep
          # round (16 warps), fp32
    timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      tests/test_attention.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20
    timeout 120 python3 scripts/attn_sweep.py --out "$OUT/attn3" --shapes gemma2 --round 3 2>&1 | grep -v Warn | tail -5
    timeout 60 python3 scripts/attn_sweep.py --out "$OUT/attn-fp32" --shapes gemma2-fp32 --quick > "$OUT/fp32.log" 2>&1
    echo "fp32 rc $?"; tail -3 "$OUT/fp32.log" ;;
  att4)   # fp32 plans / fp32 layers on FlexAttention: the two tests att3 failed and the new fp32 test; then gemma-2-2b's
          # step against compile, each variant in its own process
    timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      tests/test_attention.py -k "fp32 or check_covers" > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20
    timeout 460 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2" 2>&1 | tail -6 ;;
  att5)   # every GPU test of the two attention files (att4's 100 s cut them), then Mistral-7B-v0.1 at 2 layers with a
          # 1024 window at T 2048: eager and lit-liger (att6: stock compile, which did not finish at 8 layers)
    timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      tests/test_attention.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20
    timeout 200 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants eager,lit-liger --steps 20 --warmup 3 --out "$OUT/step-mistral-2L" 2>&1 | tail -4 ;;
  att6)   # stock torch.compile and lit-liger + compile on the same 2-layer Mistral (LitGPT's window-mask loop unrolls)
    timeout 570 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants compile,lit-liger+compile --isolate --variant_timeout 400 --steps 20 --warmup 3 \
      --out "$OUT/step-mistral-2L-compile" 2>&1 | tail -4 ;;
  att7)   # the attention GPU tests att5's limit cut (compile over the Triton layer, graphs, check), gemma-2's 200-step loss
          # curve (global layers now on the Triton kernel), gemma-2's LoRA recipe at 2 layers (variable lengths)
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_attention.py \
      -k "compile_fullgraph or window_step or check_covers" > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20
    timeout 170 python3 -m benchmarks convergence --model gemma-2-2b --sliding_window 128 --steps 200 \
      --out "$OUT/conv-gemma2" 2>&1 | tail -4
    timeout 170 python3 -m benchmarks recipe --models gemma-2-2b --n_layer 2 --micro_batches 4 --iters 100 \
      --variants stock,liger --out "$OUT/recipe-gemma2-2L" 2>&1 | grep "lora B" ;;
  att8)   # the final code (per-device attention plans, the UPCAST constexpr, doctor/selfcheck rows): the kernel's GPU
          # tests, the self-check and doctor on the GPU, gemma-2-2b's lit-liger step
    timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED|SKIPPED" "$OUT/pytest.log" | head -20
    timeout 90 python3 -m lit_liger.selfcheck 2>&1 | tail -12
    timeout 60 lit-liger doctor 2>&1 | grep -i -E "softcap|attention|kernel" | head -5
    timeout 200 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger --steps 20 --warmup 3 \
      --out "$OUT/step-gemma2-final" 2>&1 | tail -3 ;;
  b1)     # issue 15, eighth session: the key-block backward's (hs, keys) layout against (keys, hs) (4th sweep round,
          # each candidate's gradients against fp32), then gemma-2-2b's lit-liger + compile step with a profile (the GLU
          # backward under compile now the fused one)
    timeout 240 python3 scripts/attn_sweep.py --out "$OUT/attn4" --shapes gemma2 --round 4 2>&1 | grep -v Warn | tail -6
    timeout 330 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger+compile --steps 20 --warmup 3 \
      --profile --out "$OUT/step-gemma2-lc-prof" 2>&1 | tail -4 ;;
  b2)     # the (hs, keys) key-block backward as gemma-2's plan: the kernel's GPU tests (both layouts against fp64, the
          # real-size gemma-2 shape), the GLU tests under compile; head size 128's sweep (5th round)
    timeout 200 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      -k "matches_fp64 or (real_size and 1024)" > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20
    timeout 100 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_swiglu.py \
      -k "compiled_backward or bwd_h or gpu" 2>&1 | tail -3
    timeout 200 python3 scripts/attn_sweep.py --out "$OUT/attn5" --shapes hs128 --round 5 2>&1 | grep -v Warn | tail -5 ;;
  b3)     # gemma-2-2b's step against compile after this session's changes, each variant in its own process
    timeout 480 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2" 2>&1 | tail -6 ;;
  b4)     # the forward / dq kernels' query blocks longest first (A/B against program order), then gemma-2-2b's step
          # against compile with that and the fused loss's 2048-row minimum chunk (attn_order_ab.py was a one-off:
          # it switched the order through a temporary constexpr, removed with it; its result is in h100-2026-11-24h/)
    timeout 120 python3 scripts/attn_order_ab.py "$OUT/attn_order_ab.json" 2>&1 | grep -v Warn | tail -3
    timeout 440 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2" 2>&1 | tail -5 ;;
  b5)     # gemma-2-2b: lit-liger and lit-liger + compile profiled, every kernel kept (where compile on top differs)
    timeout 300 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger,lit-liger+compile \
      --steps 20 --warmup 3 --profile --out "$OUT/step-gemma2-prof" 2>&1 | tail -4 ;;
  b6)     # where gemma-2-2b's step leaves the GPU idle: lit-liger + compile, then lit-liger (trace analysis)
    timeout 240 python3 scripts/gpu_gaps.py "$OUT/gaps-lc" --variant lit-liger+compile 2>&1 | grep -v Warn | tail -45
    timeout 150 python3 scripts/gpu_gaps.py "$OUT/gaps-l" --variant lit-liger 2>&1 | grep -v Warn | tail -45 ;;
  b7)     # GPU tests of what this session changed (attention both layouts + real sizes + compile, GLU under compile,
          # the fused loss), then a 6th sweep round: 64-key blocks in the (hs, keys) layout, 64-key dq blocks
    timeout 260 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_swiglu.py \
      tests/test_fused_linear_cross_entropy.py tests/test_softcap_attention.py -k "gpu or compiled_backward or bwd_h" \
      > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20
    timeout 150 python3 scripts/attn_sweep.py --out "$OUT/attn6" --shapes gemma2 --round 6 2>&1 | grep -v Warn | tail -5 ;;
  b8)     # the final plan (64-key blocks in the key-block backward): the real-size gemma-2 attention test, then
          # gemma-2-2b's step against compile, each variant in its own process
    timeout 120 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      -k "real_size and 1024" 2>&1 | tail -2  # (selected nothing: the parameters' ids do not hold "1024")
    timeout 440 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2" 2>&1 | tail -5 ;;
  b9)     # the same step, variants in the reverse order (does running last cost a variant?), and the real-size
          # attention tests with the final plan
    timeout 440 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger+compile,lit-liger,compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2-rev" 2>&1 | tail -5
    timeout 120 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_softcap_attention.py \
      -k "real_size" 2>&1 | tail -2 ;;
  b10)    # Gemma-3 (sliding window 512 on its local layers) at 2 layers, where stock compile can finish: all five variants
    timeout 560 python3 -m benchmarks step --models gemma-3-1b-it --n_layer 2 \
      --variants eager,compile,lit-liger,lit-liger+compile,liger-kernel --isolate --variant_timeout 330 \
      --steps 20 --warmup 3 --out "$OUT/step-gemma3-2L" 2>&1 | tail -7 ;;
  c1)     # issue 15, ninth session: the fused loss's fp32 dW cast in the backward's scaling pass, the embedding's
          # backward as one op under compile: their GPU tests, then gemma-2-2b's step against compile
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_embedding.py \
      tests/test_fused_linear_cross_entropy.py -k "gpu or embedding or kept_fp32 or scale or several_chunks" \
      > "$OUT/pytest.log" 2>&1
    echo "pytest rc $?"; grep -E "^E |Error|passed|failed|^FAILED" "$OUT/pytest.log" | head -20
    timeout 440 python3 -m benchmarks step --models gemma-2-2b --variants compile,lit-liger,lit-liger+compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2" 2>&1 | tail -5 ;;
  c2)     # the same step with the variants in reverse order, then lit-liger + compile profiled (which kernels went)
    timeout 330 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger+compile,lit-liger,compile \
      --steps 20 --warmup 3 --out "$OUT/step-gemma2-rev" 2>&1 | tail -5
    timeout 220 python3 -m benchmarks step --models gemma-2-2b --variants lit-liger+compile \
      --steps 20 --warmup 3 --profile --out "$OUT/step-gemma2-lc-prof" 2>&1 | tail -3 ;;
  c3)     # the sliding-window memory target (Mistral-7B shape, 2 layers, window 1024): where each variant's peak goes
    timeout 420 python3 scripts/gpu_window_mem.py "$OUT/window_mem.jsonl" 2 2>&1 | grep -v Warn | tail -60 ;;
  c4)     # recompute_mlp: its GPU tests, where the Mistral-shape step's peak goes with it, then the 2-layer Mistral
          # step: stock compile and lit-liger (defaults) in one run, lit-liger with recompute_mlp in another
    timeout 100 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_recompute_mlp.py tests/test_embedding.py \
      2>&1 | tail -2
    timeout 120 python3 scripts/gpu_window_mem.py "$OUT/window_mem.jsonl" 2 liger recompute recompute-lean 2>&1 \
      | grep -v Warn | tail -30
    timeout 330 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants compile,lit-liger --steps 20 --warmup 3 --out "$OUT/step-mistral-2L" 2>&1 | tail -4
    timeout 90 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants lit-liger --liger_config '{"recompute_mlp": true}' --steps 20 --warmup 3 \
      --out "$OUT/step-mistral-2L-recompute" 2>&1 | tail -3 ;;
  c5)     # recompute_mlp's backward over chunks of rows: its GPU tests, the Mistral-shape peak, then the 2-layer Mistral
          # step against stock compile in one run (the setting applies to the lit-liger variant only)
    timeout 60 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_recompute_mlp.py 2>&1 | tail -2
    timeout 90 python3 scripts/gpu_window_mem.py "$OUT/window_mem.jsonl" 2 liger recompute 2>&1 | grep -v Warn | tail -20
    timeout 400 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants compile,lit-liger --liger_config '{"recompute_mlp": true}' --steps 20 --warmup 3 \
      --out "$OUT/step-mistral-2L-recompute" 2>&1 | tail -4 ;;
  c6)     # recompute_mlp's d n written over the recomputed norm output (64 MiB less at its peak): GPU tests, then the
          # 2-layer Mistral step against stock compile in one run
    timeout 60 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_recompute_mlp.py 2>&1 | tail -2
    timeout 400 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants compile,lit-liger --liger_config '{"recompute_mlp": true}' --steps 20 --warmup 3 \
      --out "$OUT/step-mistral-2L-recompute" 2>&1 | tail -4 ;;
  d1)     # tenth session, issue 15: recompute_mlp's Mistral numbers in a second call (variants in the reverse order of
          # c6), after the GPU tests of the recompute, embedding and fused-loss changes
    timeout 120 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_recompute_mlp.py tests/test_embedding.py \
      tests/test_fused_linear_cross_entropy.py -k "gpu or recompute or embedding or kept_fp32 or scale" 2>&1 | tail -3
    timeout 420 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants lit-liger,compile --liger_config '{"recompute_mlp": true}' --steps 20 --warmup 3 \
      --out "$OUT/step-mistral-2L-recompute-d1" 2>&1 | tail -4 ;;
  d2)     # what issue 15 had not re-measured after the ninth session's changes: gemma-2's 200-step loss curve, litgpt's
          # LoRA recipe on a 2-layer gemma-2-2b (variable lengths), Gemma-3 at 2 layers against stock compile
    timeout 170 python3 -m benchmarks convergence --model gemma-2-2b --sliding_window 128 --steps 200 \
      --out "$OUT/conv-gemma2" 2>&1 | tail -4
    timeout 170 python3 -m benchmarks recipe --models gemma-2-2b --n_layer 2 --micro_batches 4 --iters 100 \
      --variants stock,liger --out "$OUT/recipe-gemma2-2L" 2>&1 | grep "lora B"
    timeout 240 python3 -m benchmarks step --models gemma-3-1b-it --n_layer 2 --variants compile,lit-liger \
      --steps 20 --warmup 3 --out "$OUT/step-gemma3-2L" 2>&1 | tail -4 ;;
  d3)     # recompute_mlp under torch.compile (custom op): its GPU tests (inductor), then the 2-layer Mistral step with
          # recompute_mlp, lit-liger + compile and lit-liger, then stock compile, each variant in its own process
    timeout 90 python3 -m pytest -q -p no:cacheprovider -rs --tb=short tests/test_recompute_mlp.py 2>&1 | tail -3
    timeout 480 python3 -m benchmarks step --models Mistral-7B-v0.1 --n_layer 2 --sliding_window_size 1024 \
      --variants lit-liger+compile,lit-liger,compile --liger_config '{"recompute_mlp": true}' --isolate \
      --variant_timeout 420 --steps 20 --warmup 3 --out "$OUT/step-mistral-2L-recompute-d3" 2>&1 | tail -5 ;;
  d4)     # Gemma-3 at 2 layers (sliding window 512 < T 2048) after the ninth session's changes: eager, lit-liger and stock
          # compile, each variant in its own process (d2's in-process run did not finish compile's warm-up in 240 s)
    timeout 560 python3 -m benchmarks step --models gemma-3-1b-it --n_layer 2 --variants eager,lit-liger,compile \
      --isolate --variant_timeout 420 --steps 20 --warmup 3 --out "$OUT/step-gemma3-2L-d4" 2>&1 | tail -5 ;;
  d5)     # 2 GPUs (issue 15): Trainer + LigerCallback on gemma-2-2b (4 layers: softcap attention on lit-liger's Triton
          # kernel, final softcap in the fused loss) under DeepSpeed ZeRO-3 and FSDP, each against stock, loss per step
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    timeout 500 python3 -m benchmarks strategies --model gemma-2-2b --strategies deepspeed3,fsdp --devices 2 --steps 20 \
      --n_layer 4 --timeout 110 --out "$OUT/strategies-gemma2" 2>&1 | grep -v Warn | tail -8 ;;
  d6)     # where torch.compile on top adds to lit-liger's peak at Mistral's shape (recompute_mlp: 0.759x compile against
          # eager's 0.742x in d3; defaults: 6.54 against 6.33 GiB): the same step eager and compiled, memory-history replay
    timeout 420 python3 scripts/gpu_window_mem.py "$OUT/window_mem.jsonl" 2 recompute recompute-compile liger \
      liger-compile 2>&1 | grep -v Warn | tail -48 ;;
  d6b)    # d6 again with every group at the peak kept (d6 kept 12): recompute_mlp eager and compiled
    timeout 300 python3 scripts/gpu_window_mem.py "$OUT/window_mem.jsonl" 2 recompute recompute-compile 2>&1 \
      | grep -v Warn | tail -20 ;;
  d7)     # what recompute_mlp buys and costs beyond Mistral's shape: Llama-3.2-1B and gemma-2-2b (full depth), B4 T2048,
          # lit-liger with the defaults, then with recompute_mlp
    for cfg in '{}' '{"recompute_mlp": true}'; do
      timeout 200 python3 -m benchmarks step --models Llama-3.2-1B,gemma-2-2b --variants lit-liger \
        --liger_config "$cfg" --steps 20 --warmup 3 --out "$OUT/step-recompute-$([ "$cfg" = '{}' ] && echo off || echo on)" \
        2>&1 | grep -E "^(Llama|gemma)" ; done ;;
esac
} 2>&1 | tee "$log"
tar czf "$OUT/$phase.tgz" -C /tmp/res "$phase"
