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

A fitted ladder (:func:`fit_packed_tops`, one process): the same number of packed lengths as this ladder would give
the run's data, placed where the data's packed lengths fall (the fewest padded tokens for that many shapes), from a
sample of the training set's lengths. Above its top, :func:`packed_bucket_length` is the ladder above.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["MIN_BUCKET", "bucket_length", "fit_packed_tops", "packed_bucket_length", "padding"]

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


def packed_bucket_length(length: int, tops: Sequence[int] = ()) -> int:
    """The bucket a packed sequence of ``length`` tokens is padded up to: the first of ``tops`` (a fitted ladder,
    ascending: :func:`fit_packed_tops`) that holds it; above them (or without them) multiples of 64 up to 512 tokens,
    then :data:`PACKED_PER_DOUBLING` buckets per doubling."""
    if tops and length <= tops[-1]:
        return tops[bisect_left(tops, length)]
    if length <= MIN_BUCKET:
        return MIN_BUCKET
    step = max(MIN_BUCKET, 1 << max(0, (length - 1).bit_length() - PACKED_PER_DOUBLING.bit_length()))
    return -(-length // step) * step


#: :func:`fit_packed_tops`: packed micro-batches drawn from the sampled lengths, the candidates' spacing, the most
#: candidates (the spacing grows past it), and the share of the longest draws left to the fixed ladder above the
#: fitted top (rare lengths: a run that never meets them neither captures them nor sizes the graphs' pool for them;
#: with them in the fit, Llama-3.2-1B's top was 2,016 tokens, 0.2 GB more at a 200-iteration run's peak,
#: h200-2026-12-03e)
FIT_DRAWS = 8192
FIT_ALIGN = 16
FIT_CANDIDATES = 256
FIT_TAIL = 0.002


def _draws(lengths: Sequence[int], per_batch: int, cap: int, draws: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    capped = [min(n, cap) if cap > 0 else n for n in lengths]
    return [sum(rng.choice(capped) for _ in range(per_batch)) for _ in range(draws)]


def padding(packed: Sequence[int], tops: Sequence[int] = ()) -> float:
    """The share of padded positions when each of ``packed`` (packed lengths) is padded to its bucket."""
    real = sum(packed)
    done = sum(packed_bucket_length(n, tops) for n in packed)
    return 1.0 - real / done if done else 0.0


def fit_packed_tops(lengths: Sequence[int], per_batch: int, cap: int = 0, draws: int = FIT_DRAWS,
                    seed: int = 0) -> tuple[tuple[int, ...], float, float]:
    """A ladder for packed micro-batches of ``per_batch`` samples whose lengths are like ``lengths`` (each at most
    ``cap`` tokens; 0: no cap): ``(tops, padding with them, padding with the default ladder)``, both estimated on
    ``draws`` micro-batches drawn from ``lengths``. Leaving out the longest :data:`FIT_TAIL` of them (they keep the
    default ladder, above the fitted top), ``tops`` has as many lengths as the default ladder's buckets the others
    reach, multiples of :data:`FIT_ALIGN` (coarser past :data:`FIT_CANDIDATES` of them) placed for their fewest padded
    positions (an exact dynamic program over the candidates), the last one the longest of them. Empty ``tops`` (the
    default ladder) where ``lengths`` is empty or ``per_batch`` < 2 (one sample is never packed)."""
    if not lengths or per_batch < 2:
        return (), 0.0, 0.0
    every = _draws(lengths, per_batch, cap, draws, seed)
    packed = sorted(every)[:max(1, len(every) - int(len(every) * FIT_TAIL))]
    k = len({packed_bucket_length(n) for n in packed})
    longest = packed[-1]
    align = FIT_ALIGN * max(1, -(-longest // (FIT_ALIGN * FIT_CANDIDATES)))
    count: dict[int, int] = {}
    total: dict[int, int] = {}
    for n in packed:
        c = -(-n // align) * align
        count[c] = count.get(c, 0) + 1
        total[c] = total.get(c, 0) + n
    cands = sorted(count)
    m = len(cands)
    k = min(k, m)
    pre_n, pre_s = [0], [0]
    for c in cands:
        pre_n.append(pre_n[-1] + count[c])
        pre_s.append(pre_s[-1] + total[c])

    def cost(i: int, j: int) -> int:  # candidates i+1 .. j (0-based: cands[i] .. cands[j - 1]) padded to cands[j - 1]
        return (pre_n[j] - pre_n[i]) * cands[j - 1] - (pre_s[j] - pre_s[i])

    inf = float("inf")
    best = [cost(0, j) for j in range(m + 1)]  # one bucket over the first j candidates
    back = [[0] * (m + 1)]
    for _ in range(1, k):
        nxt, arg = [inf] * (m + 1), [0] * (m + 1)
        for j in range(1, m + 1):
            for i in range(1, j):
                v = best[i] + cost(i, j)
                if v < nxt[j]:
                    nxt[j], arg[j] = v, i
        best = nxt
        back.append(arg)
    tops, j = [], m
    for level in range(k - 1, -1, -1):
        tops.append(cands[j - 1])
        j = back[level][j]
        if j == 0:
            break
    tops = tuple(sorted(set(tops)))
    return tops, padding(every, tops), padding(every)
