# call c6: the shipped LoRA recipe's fit holds ~21 s that are neither in litgpt's loop (its csv log's time at the last
# iteration: 30.8 s of 55.8) nor in the evaluations, generations or saves (c5): every call of 50 ms or more of the
# pieces that run around the loop's end timed
CALL=c6; . benchmarks/calls.sh
T=torch.utils.data.dataloader:_MultiProcessingDataLoaderIter._shutdown_workers
T=$T,torch.utils.data.dataloader:_MultiProcessingDataLoaderIter.__init__,litgpt.utils:CycleIterator.__next__
T=$T,lit_liger.graphs:release,lit_liger.hostgc:report,lit_liger.cli:padding_report,litgpt.finetune.lora:generate_example
T=$T,lit_liger.lazylog:DeferredLog.flush,lit_liger.lazylog:DeferredLog.close,litgpt.finetune.lora:fit,litgpt.finetune.lora:get_longest_seq_length
RECIPE_ARGS="--config configs/llama-3.2-1B/lora.yaml --n_samples 2000" rec w Llama-3.2-1B lora 1 liger 1000 40 150 LIT_LIGER_BENCH_TIME_CALLS=$T
grep -n "bench-timer\|val time\|Number of epochs\|Training Time\|training ended" /tmp/o/c6-run-w-*.txt | cut -c1-150 | head -50
pack
