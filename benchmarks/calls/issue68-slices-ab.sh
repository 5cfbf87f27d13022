# Issue 68: does the attention's backward over slices of key/value groups (swap.attend.sliced_sdpa_backward) cost
# time? A recomputed Block's attention, forward + backward, in one call and over slices, 64k-512k tokens of
# Llama-3.1-8B's heads (`diag long-attn`'s rerun-gqa / rerun-sliced-gqa), with the backward's extra memory.
# h200-2026-12-04d's one-step runs were 4-7% slower than the call before the slices (other calls, not settled).
#   run: CALL=a1 bash benchmarks/calls/issue68-slices-ab.sh      (carry: .whl)
CALL=${CALL:-a} . benchmarks/calls.sh
BACKENDS=${BACKENDS:-rerun-gqa,rerun-sliced-gqa,cudnn-gqa} TOKENS=${TOKENS:-65536,131072,262144,524288} REPS=${REPS:-2} \
  timeout ${RUN_S:-500} python3 -m benchmarks diag long-attn "/tmp/o/$NAME-long-attn.json" 2>&1 | tee "/tmp/o/$NAME-long-attn.log"
echo "done ($(( $(date +%s) - S )) s)"
pack
