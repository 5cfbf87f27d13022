"""Sequence-length buckets (``LigerConfig.seq_buckets``): the one place that says which lengths a run sees.

Instruction data changes length every micro-batch (litgpt's collate pads each batch to its own longest
sample). Every new length costs per-shape work on the host (cuDNN attention plans, Triton and cuBLAS
first calls, a new CUDA graph) that a run on real data would pay again and again. Padding each batch's
length up to a bucket bounds the shapes a whole run sees to a handful.

The ladder: multiples of 64 up to 512 tokens (8 buckets, at most 63 padded tokens per row), then 8
buckets per doubling (step ``2**(k-3)`` for lengths in ``[2**k, 2**(k+1))``: at most 1/8 padding), never
above the model's ``max_seq_length``.
"""

from __future__ import annotations

__all__ = ["MIN_BUCKET", "bucket_length"]

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
