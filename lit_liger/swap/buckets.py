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
recipe at micro-batch 4: 15 packed lengths with 8 per doubling, each a CUDA graph holding its own activations).
"""

from __future__ import annotations

__all__ = ["MIN_BUCKET", "bucket_length", "packed_bucket_length"]

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


#: buckets per doubling of the packed ladder above 512 tokens (a power of two). 8 halves the padding (9-10% -> 4.5-5%)
#: for ~7 more shapes: measured on an H200 through litgpt's CLI (Llama-3.2-1B, micro-batch 4), its steady iterations
#: were 1.3-1.9% faster, but its extra captures (0.5-0.7 s) left whole runs of 1,000 and 2,400 iterations 0.2-1.4%
#: slower (``benchmarks/results/h200-2026-11-29``). Kept at 4, for runs of every length
PACKED_PER_DOUBLING = 4


def packed_bucket_length(length: int) -> int:
    """The bucket a packed sequence of ``length`` tokens is padded up to: multiples of 64 up to 512 tokens, then
    :data:`PACKED_PER_DOUBLING` buckets per doubling."""
    if length <= MIN_BUCKET:
        return MIN_BUCKET
    step = max(MIN_BUCKET, 1 << max(0, (length - 1).bit_length() - PACKED_PER_DOUBLING.bit_length()))
    return -(-length // step) * step
