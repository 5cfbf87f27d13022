# call c1: the shipped recipes run as shipped after lit_liger.loaders (the training loader's workers stopped as
# litgpt's fit returns, not by the collector in graphs.release: 20.0 s at the end of every LoRA recipe run with saves
# in h200-2026-11-29d); every call of 50 ms or more of the pieces around the loop timed, stock's too; then the
# loader-cycle diagnostic on this host
CALL=c1; . benchmarks/calls.sh
T=torch.utils.data.dataloader:_MultiProcessingDataLoaderIter._shutdown_workers,lit_liger.graphs:release
T=$T,litgpt.finetune.lora:fit,litgpt.finetune.lora:generate_example,litgpt.finetune.lora:validate
T=$T,litgpt.finetune.lora:save_lora_checkpoint,litgpt.finetune.lora:merge_lora
TF=torch.utils.data.dataloader:_MultiProcessingDataLoaderIter._shutdown_workers,lit_liger.graphs:release
TF=$TF,litgpt.finetune.full:fit,litgpt.finetune.full:generate_example,litgpt.finetune.full:validate
L="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000"
RECIPE_ARGS="$L" rec l Llama-3.2-1B lora 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$T
RECIPE_ARGS="--config configs/llama-3.2-1B/full.yaml --n_samples 2000" rec f Llama-3.2-1B full 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$TF
RECIPE_ARGS="$L" rec sl Llama-3.2-1B lora 1 stock 1000 40 220 LIT_LIGER_BENCH_TIME_CALLS=$T
RECIPE_ARGS="$L" rec w Llama-3.2-1B lora 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$T
grep -h "bench-timer\|Training Time\|input shapes captured" /tmp/o/c1-run-*.txt | cut -c1-200
WORKERS=4 timeout 60 python3 -m benchmarks diag loader-cycle /tmp/o/c1-loader-cycle.json 2>&1 | grep "^{"
echo "call wall $(( $(date +%s) - S )) s"
pack
