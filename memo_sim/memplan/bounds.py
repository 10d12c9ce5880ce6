"""Lower bounds and conflict structure of an offline dynamic-storage-allocation (DSA) problem.

Everything here is derived from the lifetimes and sizes of a :class:`RequestTrace` alone:

* the **max-live lower bound**: no placement can peak below the largest sum of sizes live at
  one step (``RequestTrace.max_live_bytes``);
* the **conflict graph**: buffers ``i`` and ``j`` conflict when their lifetimes overlap, found by
  one sort and a ``searchsorted`` sweep (no O(n^2) Python loop);
* the **sections**: the timeline cut at every distinct buffer end. Section ``k`` holds the
  buffers live just before the ``k``-th distinct end time; every buffer spans a contiguous range
  of sections, two buffers conflict exactly when they share a section, and the largest section
  total is the max-live bound. The exact search (``dsa_search.py``) prunes by sections;
* **tight big-M** constants for the pairwise disjunctions of the MIP (``mip_model.py``).

Buffers are referred to by their index in ``trace.buffers`` throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np

from memo_sim.request_trace import RequestTrace


def max_live_lower_bound(trace: RequestTrace) -> int:
    """The max-live lower bound on any placement's peak, in bytes (0 for an empty trace)."""
    return trace.max_live_bytes() if len(trace) else 0


def trace_arrays(trace: RequestTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sizes, lowers, uppers)`` as int64 arrays in buffer order."""
    n = len(trace)
    size = np.fromiter((b.size for b in trace.buffers), dtype=np.int64, count=n)
    lower = np.fromiter((b.lower for b in trace.buffers), dtype=np.int64, count=n)
    upper = np.fromiter((b.upper for b in trace.buffers), dtype=np.int64, count=n)
    return size, lower, upper


def size_gcd(trace: RequestTrace) -> int:
    """The greatest common divisor of all buffer sizes (1 for an empty trace)."""
    g = 0
    for b in trace.buffers:
        g = gcd(g, b.size)
    return g or 1


@dataclass(frozen=True)
class ConflictGraph:
    """Pairs of buffers whose lifetimes overlap.

    ``pairs`` is an ``(m, 2)`` int64 array with ``pairs[k, 0] < pairs[k, 1]`` (buffer indices);
    ``neighbors[i]`` is the sorted int64 array of buffers conflicting with ``i``.
    """

    n: int
    pairs: np.ndarray
    neighbors: tuple[np.ndarray, ...]

    @property
    def num_pairs(self) -> int:
        return int(self.pairs.shape[0])

    def degree(self) -> np.ndarray:
        return np.fromiter((len(a) for a in self.neighbors), dtype=np.int64, count=self.n)


def overlap_pairs(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """All pairs ``(i, j)``, ``i < j``, of half-open lifetimes ``[lower, upper)`` that overlap.

    Sweep: sort the buffers by start; a buffer ``a`` overlaps exactly the buffers that start at
    or after it (later in the sorted order) and before ``upper[a]``, a contiguous run of the
    sorted order found with one ``searchsorted``. Cost O(n log n + m) for m pairs.
    """
    n = int(lower.shape[0])
    if n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.argsort(lower, kind="stable")
    sl = lower[order]
    end = np.searchsorted(sl, upper[order], side="left")  # first sorted position starting >= upper
    first = np.arange(1, n + 1)
    count = np.maximum(end - first, 0)
    total = int(count.sum())
    if total == 0:
        return np.zeros((0, 2), dtype=np.int64)
    a_pos = np.repeat(np.arange(n), count)
    run_start = np.repeat(np.cumsum(count) - count, count)
    b_pos = np.repeat(first, count) + (np.arange(total) - run_start)
    a = order[a_pos]
    b = order[b_pos]
    return _sorted_pairs(np.minimum(a, b) * n + np.maximum(a, b), n)


def _sorted_pairs(key: np.ndarray, n: int) -> np.ndarray:
    """Pairs ``(key // n, key % n)`` in lexicographic order: one sort of one int64 key per pair
    (n <= 2^22 buffers, so keys stay below 2^44), several times faster than a two-key lexsort
    and a gather on tens of millions of pairs."""
    key.sort()
    return np.stack([key // n, key % n], axis=1)


def conflict_graph(trace: RequestTrace) -> ConflictGraph:
    """The conflict graph of ``trace`` (see :func:`overlap_pairs`)."""
    _, lower, upper = trace_arrays(trace)
    return conflict_graph_from_arrays(lower, upper)


def conflict_graph_from_arrays(lower: np.ndarray, upper: np.ndarray) -> ConflictGraph:
    n = int(lower.shape[0])
    pairs = overlap_pairs(lower, upper)
    if len(pairs):
        both = _sorted_pairs(np.concatenate([pairs[:, 0] * n + pairs[:, 1], pairs[:, 1] * n + pairs[:, 0]]), n)
        starts = np.searchsorted(both[:, 0], np.arange(n + 1), side="left")
        nbrs = tuple(both[starts[i]:starts[i + 1], 1].copy() for i in range(n))
    else:
        nbrs = tuple(np.zeros(0, dtype=np.int64) for _ in range(n))
    return ConflictGraph(n=n, pairs=pairs, neighbors=nbrs)


@dataclass(frozen=True)
class Sections:
    """The timeline cut into sections at the distinct buffer end times.

    Buffer ``b`` lives in sections ``first[b] .. last[b] - 1`` (a contiguous range).
    ``members`` lists, section after section, the buffers of each section; section ``k`` owns
    ``members[start[k]:start[k + 1]]``. ``total[k]`` is the sum of sizes in section ``k``.
    """

    num: int
    first: np.ndarray
    last: np.ndarray
    total: np.ndarray
    members: np.ndarray
    start: np.ndarray

    def max_total(self) -> int:
        return int(self.total.max()) if self.num else 0


def time_sections(size: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> Sections:
    """Cut the timeline at every distinct end time (see :class:`Sections`).

    Section ``k`` holds the buffers with ``lower < ends[k] <= upper``: those live just before the
    ``k``-th distinct end. Every maximal set of simultaneously live buffers is one of these
    sections (the live set only shrinks at an end), so conflicts and the max-live bound are
    preserved.
    """
    n = int(size.shape[0])
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Sections(0, z, z, z, z, np.zeros(1, dtype=np.int64))
    ends = np.unique(upper)
    first = np.searchsorted(ends, lower, side="right").astype(np.int64)
    last = (np.searchsorted(ends, upper, side="left") + 1).astype(np.int64)
    num = int(ends.shape[0])
    diff = np.zeros(num + 1, dtype=np.int64)
    np.add.at(diff, first, size)
    np.add.at(diff, last, -size)
    total = np.cumsum(diff[:num])
    span = last - first
    owner = np.repeat(np.arange(n, dtype=np.int64), span)
    run_start = np.repeat(np.cumsum(span) - span, span)
    sec = np.repeat(first, span) + (np.arange(int(span.sum())) - run_start)
    order = np.lexsort((owner, sec))
    members = owner[order]
    start = np.searchsorted(sec[order], np.arange(num + 1), side="left").astype(np.int64)
    return Sections(num, first, last, total, members, start)


def trace_sections(trace: RequestTrace) -> Sections:
    size, lower, upper = trace_arrays(trace)
    return time_sections(size, lower, upper)


def pair_big_m(size: np.ndarray, pairs: np.ndarray, addr_hi: np.ndarray,
               addr_lo: np.ndarray | None = None) -> np.ndarray:
    """Tight big-M for each disjunction ``A_i + S_i <= A_j + M_ij * z_ij``.

    With addresses known to lie in ``[addr_lo, addr_hi]``, the row must be slack when relaxed,
    so ``M_ij = max(A_i + S_i - A_j) = addr_hi[i] + S_i - addr_lo[j]``; the mirror row uses
    ``M_ji``. Returns an ``(m, 2)`` array ``[M_ij, M_ji]`` per pair. With ``addr_hi = UB - S``
    for an upper bound ``UB`` on the peak this is ``UB - addr_lo[j]``, much smaller than a
    device capacity.
    """
    lo = np.zeros_like(size) if addr_lo is None else addr_lo
    i, j = pairs[:, 0], pairs[:, 1]
    m_ij = addr_hi[i] + size[i] - lo[j]
    m_ji = addr_hi[j] + size[j] - lo[i]
    return np.stack([m_ij, m_ji], axis=1)


def buffer_address_bounds(size: np.ndarray, upper_bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-buffer address box ``[0, upper_bound - size]`` under a peak upper bound."""
    return np.zeros_like(size), np.maximum(upper_bound - size, 0)


@dataclass(frozen=True)
class DSAInstance:
    """Array form of a trace for the solvers: sizes, lifetimes, conflicts, sections."""

    size: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    conflicts: ConflictGraph
    sections: Sections

    @property
    def n(self) -> int:
        return int(self.size.shape[0])

    @classmethod
    def from_trace(cls, trace: RequestTrace) -> "DSAInstance":
        size, lower, upper = trace_arrays(trace)
        return cls.from_arrays(size, lower, upper)

    @classmethod
    def from_arrays(cls, size: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> "DSAInstance":
        size = np.asarray(size, dtype=np.int64)
        lower = np.asarray(lower, dtype=np.int64)
        upper = np.asarray(upper, dtype=np.int64)
        return cls(size, lower, upper, conflict_graph_from_arrays(lower, upper),
                   time_sections(size, lower, upper))

    def lower_bound(self) -> int:
        return self.sections.max_total()
