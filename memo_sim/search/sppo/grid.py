"""The subsequence counts N the searches try."""

from __future__ import annotations

import math

from memo_sim.cost.sppo import EFFICIENT_TOKENS_PER_DEVICE
from memo_sim.search.sppo.points import MAX_SUBSEQS, MIN_TOKENS_PER_DEVICE


def subseq_grid(seq: int, sp: int, lo_tokens: int = MIN_TOKENS_PER_DEVICE, max_n: int = MAX_SUBSEQS) -> list[int]:
    """N in powers of two with each device's share of a subsequence at least ``lo_tokens``."""
    out, n = [], 1
    while n <= max_n and seq / (n * sp) >= lo_tokens:
        out.append(n)
        n *= 2
    return out or [1]


def efficient_subseqs(seq: int, sp: int) -> list[int]:
    """The heuristic's N: powers of two with seq/(N·SP) in the efficient 2K-16K range (the nearest
    one where none is)."""
    lo, hi = EFFICIENT_TOKENS_PER_DEVICE
    grid = subseq_grid(seq, sp, 1, MAX_SUBSEQS * 8)
    inside = [n for n in grid if lo <= seq / (n * sp) <= hi]
    if inside:
        return inside
    return [min(grid, key=lambda n: min(abs(math.log2(seq / (n * sp) / lo)), abs(math.log2(seq / (n * sp) / hi))))]
