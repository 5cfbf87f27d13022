"""Sequence-length buckets (``LigerConfig.seq_buckets``): the one place that says which lengths a run sees.

Instruction data changes length every micro-batch (litgpt's collate pads each batch to its own longest
sample). Every new length costs per-shape work on the host (cuDNN attention plans, Triton and cuBLAS
first calls, a new CUDA graph) that a run on real data would pay again and again. Padding each batch's
length up to a bucket bounds the shapes a whole run sees to a handful.

The ladder: multiples of 64 up to 512 tokens (8 buckets, at most 63 padded tokens per row), then 8
buckets per doubling (step ``2**(k-3)`` for lengths in ``[2**k, 2**(k+1))``: at most 1/8 padding), never
above the model's ``max_seq_length``.

A packed micro-batch (``LigerConfig.packing``: its samples end to end) is one row whose length is the sum of the
samples' lengths, which spreads wider than a padded batch's longest sample: its ladder has 4 buckets per doubling
(at most 1/4 padding, ~1/12 on average), which halves the shapes a run captures (measured on an H100, litgpt's LoRA
recipe at micro-batch 4: 15 packed lengths with 8 per doubling, each a CUDA graph holding its own activations). A long
run in one process (:data:`FINE_LADDER_MIN` micro-batches) takes 8 per doubling: its extra captures are repaid by the
padding it no longer computes.
"""

from __future__ import annotations

import math

__all__ = ["MIN_BUCKET", "bucket_length", "packed_bucket_length", "per_doubling_for", "set_run_ladder"]

#: the smallest bucket and the step of the ladder below 512 tokens
MIN_BUCKET = 64


def bucket_length(length: int, max_length: int | None = None) -> int:
    """The bucket ``length`` is padded up to: ``>= length``, ``<= max(length, max_length)``."""
    if length <= MIN_BUCKET:
        bucket = MIN_BUCKET
    else:
        step = max(MIN_BUCKET, 1 << ((length - 1).bit_length() - 4))  # 8 buckets per doubling
        bucket = -(-length // step) * step
    if max_length is not None:
        bucket = min(bucket, max_length)
    return max(bucket, length)


#: the packed ladder's buckets per doubling above 512 tokens (a power of two), by default and in short runs
COARSE_PER_DOUBLING = 4

#: the packed ladder in use: :data:`COARSE_PER_DOUBLING`, or :data:`FINE_PER_DOUBLING` in a long run's loop in one
#: process (:func:`set_run_ladder`)
PACKED_PER_DOUBLING = COARSE_PER_DOUBLING

#: the packed ladder of a long run (:data:`FINE_LADDER_MIN` micro-batches or more, one process): half the padding for
#: twice the shapes. Measured on an H200 (Llama-3.2-1B LoRA and full fine-tuning, Llama-3.1-8B LoRA, micro-batch 4 of
#: Alpaca-shaped lengths, the same 200 micro-batches replayed, ``python -m benchmarks diag capture-cost`` with
#: ``LADDERS=4,8``, ``benchmarks/results/h200-2026-11-29``): padding 9.4-9.9% -> 4.7-5.0%, each replayed micro-batch
#: 1.7-3.1% faster, 7 more captures (0.34-0.82 s): finer buckets pay for themselves from 570-920 micro-batches there
#: (without litgpt's loop around the step; see :data:`FINE_LADDER_MIN`)
FINE_PER_DOUBLING = 8

#: the micro-batches (per process) from which a run in one process pads to :data:`FINE_PER_DOUBLING` buckets per
#: doubling (an epoch of Alpaca at micro-batch 4 is ~13,000). Through litgpt's CLI (H200, Llama-3.2-1B, micro-batch 4,
#: 1,000 iterations, ``benchmarks/results/h200-2026-11-29``): 16 shapes instead of 9, their recordings 0.37-0.47 s
#: more, the steady iterations 1.8-1.9% faster (LoRA 11.52 vs 11.74 ms, full 18.67 vs 19.02), the same peak memory:
#: repaid from ~1,350-1,700 micro-batches
FINE_LADDER_MIN = 2000


def packed_bucket_length(length: int, per_doubling: int | None = None) -> int:
    """The bucket a packed sequence of ``length`` tokens is padded up to: multiples of 64 up to 512 tokens, then
    ``per_doubling`` (by default :data:`PACKED_PER_DOUBLING`) buckets per doubling."""
    if length <= MIN_BUCKET:
        return MIN_BUCKET
    per = PACKED_PER_DOUBLING if per_doubling is None else per_doubling
    step = max(MIN_BUCKET, 1 << max(0, (length - 1).bit_length() - per.bit_length()))
    return -(-length // step) * step


def per_doubling_for(micro_batches: float | None) -> int:
    """The packed ladder's buckets per doubling for a loop of ``micro_batches`` in one process (None: not known)."""
    if micro_batches is not None and micro_batches >= FINE_LADDER_MIN:
        return FINE_PER_DOUBLING
    return COARSE_PER_DOUBLING


def set_run_ladder(micro_batches: float | None) -> tuple[int, str | None]:
    """Set :data:`PACKED_PER_DOUBLING` for a training loop of ``micro_batches`` in one process: ``(the value it
    replaced, for the caller to put back after the loop; the log's line where the ladder changed, else None)``."""
    global PACKED_PER_DOUBLING
    before = PACKED_PER_DOUBLING
    PACKED_PER_DOUBLING = per_doubling_for(micro_batches)
    if PACKED_PER_DOUBLING == before or PACKED_PER_DOUBLING != FINE_PER_DOUBLING:
        return before, None
    run = "a run with no end set" if math.isinf(micro_batches) else f"this run's {micro_batches:,.0f} micro-batches"
    return before, (f"lit-liger: packed micro-batches padded to {PACKED_PER_DOUBLING} length buckets per doubling "
                    f"(not {before}) for {run}: about half the padding, for about twice the CUDA graphs, which a run "
                    f"of {FINE_LADDER_MIN:,} micro-batches or more repays")
