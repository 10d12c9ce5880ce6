"""The subsequence counts N the searches try, and the (N, partition, multiplex) points of one layout."""

from __future__ import annotations

import math

from memo_sim.cost.sppo import EFFICIENT_TOKENS_PER_DEVICE, PARTITIONS
from memo_sim.layout.parallel import Layout
from memo_sim.search.sppo.points import MAX_SUBSEQS, MIN_TOKENS_PER_DEVICE, MULTIPLEX_MAX_PP


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


def search_points(layout: Layout, seq: int, subseqs: int | None = None, partitions: tuple[str, ...] = PARTITIONS,
                  multiplex: tuple[bool, ...] = (False, True)) -> list[tuple[int, str, bool]]:
    """The (N, partition, multiplex) points SPPO's search tries on one pipeline layout, in its order: N over
    `subseq_grid` (``subseqs`` where given), each partition, multiplexing off and on (on only for 2 to
    `MULTIPLEX_MAX_PP` stages). The what-if's branch and bound (`memo_sim.search.sppo.exhaustive.exhaustive_search`)
    and one fixed layout's best (`memo_sim.search.sppo.solve.resolve_for_layout`) search these points, so that a
    layout the what-if planned comes back with its N (a review: the fixed-layout search tried the heuristic's N
    only, `efficient_subseqs`, and sweep-seq gave a plan-sppo.json's layout N=64 where the what-if had chosen 128)."""
    return [(n, part, mux) for n in ([subseqs] if subseqs else subseq_grid(seq, layout.tp)) for part in partitions
            for mux in multiplex if not mux or 1 < layout.pp <= MULTIPLEX_MAX_PP]


def edge_subseqs(best_n: int, top_n: int | None, subseqs: int | None) -> int | None:
    """The next N a search tries past its grid's edge: where the best fitting point has the largest N its layout was
    tried at (``top_n``) and N is not fixed (``subseqs``), twice that N (half the tokens per device, below
    `MIN_TOKENS_PER_DEVICE`), up to `MAX_SUBSEQS`; else None. The what-if's branch and bound
    (`memo_sim.search.sppo.exhaustive.exhaustive_search`) and one fixed layout's best
    (`memo_sim.search.sppo.solve.resolve_for_layout`) extend so, for as long as the best moves to the new edge (a
    review: llama-3.1-70b on 64 H100s at 128K, tp4+sp pp4: N=32 at the edge was called the best, N=64 faster on both
    tiers). A search where nothing fits does not extend (more subsequences shrink only the transients, not the
    model states or the K/V cache that decide such a stage)."""
    if subseqs is not None or best_n != top_n or 2 * best_n > MAX_SUBSEQS:
        return None
    return 2 * best_n

