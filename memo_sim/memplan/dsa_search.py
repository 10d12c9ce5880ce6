"""Exact branch-and-bound for offline DSA over canonical placements (after MiniMalloc).

Decision problem: place every buffer so that buffers live at the same time never share an
address and nothing ends above ``capacity``. Minimisation (:func:`minimize_peak`) calls it for
a sequence of capacities.

Canonical solutions. Drop every buffer of any feasible placement as low as it can go: each then
rests at address 0 or on top of a buffer it conflicts with. Listing the buffers of such a
placement by (offset, static rank) gives a sequence in which every buffer sits exactly at its
*minimum offset*, the highest top among its already placed conflicting buffers. The search
builds only such sequences: at each node it picks the next buffer among the unplaced ones, puts
it at its minimum offset, and requires (offset, rank) to grow along the sequence, so each
canonical placement is produced once.

Pruning, all exact (no feasible placement is lost):

* sections (``bounds.time_sections``): the unplaced buffers of one section are live together, so
  they stack above the lowest minimum offset among them and above the current offset; if that
  plus their total size exceeds the capacity the node fails;
* dominance: if some unplaced buffer would fit entirely below the offset of the candidate (its
  minimum offset + size <= candidate offset), the candidate and every later one is skipped,
  since the dropped form of any completion would place that buffer first;
* decomposition: when every buffer that crosses a section boundary is placed, the two sides no
  longer interact and are solved as independent sub-problems (a failed side fails the node);
  sub-problems are memoised by their buffers and minimum offsets, so a side that failed (or
  succeeded) once is not searched again.

Candidates are tried by increasing minimum offset, ties by a preordering (MiniMalloc's "TWA",
"WAT", "TAW": largest section total, lifetime width, area), recomputed for each sub-problem on
the current section totals. A run stops at a node limit;
:meth:`CanonicalSearch.fit` restarts the preorderings round robin with doubling limits. A run
that ends without hitting its limit is a proof: the buffers do not fit in ``capacity``.

State is kept in numpy arrays updated in place and restored on backtrack (no per-node copies
of the state): minimum offsets (placed buffers hold a sentinel), unplaced bytes per section and
per-boundary counts of unplaced crossing buffers. A section's floor (lowest unplaced minimum
offset) is recomputed, with one ``minimum.reduceat``, only for the sections a placement can
change: those of the placed buffer's conflicting buffers.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from memo_sim.memplan.bounds import DSAInstance
from memo_sim.memplan.greedy import peak_of

_INF = np.int64(1) << np.int64(61)
DEFAULT_HEURISTICS: tuple[str, ...] = ("TWA", "WAT", "TAW")


class _Abort(Exception):
    """Unwinds the depth-first search at a node limit or deadline."""


@dataclass(frozen=True)
class SearchResult:
    """Outcome of one decision search.

    ``status`` is ``"found"`` (``offsets`` fit in the capacity), ``"infeasible"`` (proven: no
    placement fits) or ``"limit"`` (node limit or deadline reached first).
    """

    status: str
    capacity: int
    offsets: np.ndarray | None
    peak: int | None
    nodes: int
    heuristic: str
    elapsed_s: float


class CanonicalSearch:
    """The canonical-placement branch-and-bound on one instance (see the module docstring)."""

    def __init__(self, inst: DSAInstance) -> None:
        self.inst = inst
        n = inst.n
        sec = inst.sections
        self.n = n
        self.num_sections = sec.num
        self.size = inst.size
        self.size_l = [int(s) for s in inst.size]
        self.nbrs = inst.conflicts.neighbors
        self.first_l = [int(v) for v in sec.first]
        self.last_l = [int(v) for v in sec.last]
        self.first = sec.first
        self.last = sec.last
        mstart_l = [int(v) for v in sec.start]
        # Sections whose lowest unplaced minimum offset can change when a buffer is placed:
        # those of the buffer and of its conflicting buffers (a contiguous range).
        aff_lo, aff_hi = [], []
        for b in range(n):
            nb = self.nbrs[b]
            lo = self.first_l[b]
            hi = self.last_l[b]
            if nb.shape[0]:
                lo = min(lo, int(sec.first[nb].min()))
                hi = max(hi, int(sec.last[nb].max()))
            aff_lo.append(lo)
            aff_hi.append(hi)
        self.aff_lo = aff_lo
        self.aff_hi = aff_hi
        # Per affected range: its members (section after section) and reduceat offsets.
        self.aff_members = [sec.members[mstart_l[aff_lo[b]]:mstart_l[aff_hi[b]]]
                            for b in range(n)]
        self.aff_idx = [sec.start[aff_lo[b]:aff_hi[b]] - sec.start[aff_lo[b]] for b in range(n)]
        cut = np.zeros(max(sec.num - 1, 0), dtype=np.int64)
        for b in range(n):
            if self.last_l[b] - self.first_l[b] > 1:
                cut[self.first_l[b]:self.last_l[b] - 1] += 1
        self.cut0 = cut
        width = inst.upper - inst.lower
        self.static_keys = {"W": width, "A": inst.size * width, "Z": inst.size,
                            "O": inst.conflicts.degree()}
        # Each buffer's sections laid out buffer after buffer, for the dynamic "T" key.
        span = sec.last - sec.first
        run = np.repeat(np.cumsum(span) - span, span)
        self.bsec = np.repeat(sec.first, span) + (np.arange(int(span.sum())) - run)
        self.bsec_start = (np.cumsum(span) - span).astype(np.int64)
        self.nodes_total = 0
        self._memos: dict[int, tuple[dict[bytes, bool], dict[bytes, np.ndarray]]] = {}

    # ------------------------------------------------------------------ public
    def part_rank(self, part: np.ndarray, heuristic: str) -> np.ndarray:
        """Ranks 0..len(part)-1 of the buffers ``part`` under a preordering (0 = first).

        ``heuristic`` letters, each a descending key, in priority order: ``T`` largest unplaced
        section total the buffer lives in (current totals, as MiniMalloc re-orders each
        sub-problem), ``W`` lifetime width, ``A`` area (size x width), ``Z`` size, ``O``
        conflict degree; the buffer index breaks ties.
        """
        cols: list[np.ndarray] = [part]
        t_key = None
        for letter in reversed(heuristic):
            if letter == "T":
                if t_key is None:
                    t_all = np.maximum.reduceat(self.total[self.bsec], self.bsec_start)
                    t_key = t_all[part]
                cols.append(-t_key)
            elif letter in self.static_keys:
                cols.append(-self.static_keys[letter][part])
            else:
                raise ValueError(f"unknown preordering letter {letter!r} in {heuristic!r}")
        order = np.lexsort(cols)
        rank = np.empty(part.shape[0], dtype=np.int64)
        rank[order] = np.arange(part.shape[0])
        return rank

    def fit_once(self, capacity: int, *, heuristic: str = "TWA", node_limit: int | None = None,
                 deadline: float | None = None) -> SearchResult:
        """One depth-first run for ``capacity`` with one preordering and a node limit."""
        t0 = time.perf_counter()
        n = self.n
        if n == 0:
            return SearchResult("found", capacity, np.zeros(0, dtype=np.int64), 0, 0, heuristic, 0.0)
        if int(self.size.max()) > capacity or self.inst.lower_bound() > capacity:
            return SearchResult("infeasible", capacity, None, None, 0, heuristic,
                                time.perf_counter() - t0)
        self._setup(capacity, heuristic, node_limit, deadline)
        status = "found"
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 20 * n + 1000))
        try:
            ok = True
            for lo, hi in self._ranges(0, self.num_sections):
                part = np.flatnonzero((self.first >= lo) & (self.last <= hi))
                if not self._solve_part(part, lo, hi):
                    ok = False
                    break
            if not ok:
                status = "infeasible"
        except _Abort:
            status = "limit"
        finally:
            sys.setrecursionlimit(old_limit)
        self.nodes_total += self._nodes
        elapsed = time.perf_counter() - t0
        if status != "found":
            return SearchResult(status, capacity, None, None, self._nodes, heuristic, elapsed)
        off = self._sol.copy()
        return SearchResult("found", capacity, off, peak_of(self.inst, off), self._nodes, heuristic,
                            elapsed)

    def fit(self, capacity: int, *, deadline: float, heuristics: Sequence[str] = DEFAULT_HEURISTICS,
            start_limit: int | None = None, max_limit: int | None = None) -> SearchResult:
        """Round robin over ``heuristics`` with node limits doubling from ``start_limit``.

        Returns the first ``found`` or ``infeasible`` result, else ``limit`` at the deadline
        (or once the limit would pass ``max_limit``).
        """
        t0 = time.perf_counter()
        limit = start_limit or max(2 * self.n, 64)
        nodes = 0
        while True:
            for h in heuristics:
                res = self.fit_once(capacity, heuristic=h, node_limit=limit, deadline=deadline)
                nodes += res.nodes
                if res.status != "limit":
                    return SearchResult(res.status, capacity, res.offsets, res.peak, nodes, h,
                                        time.perf_counter() - t0)
                if time.perf_counter() >= deadline:
                    return SearchResult("limit", capacity, None, None, nodes, h,
                                        time.perf_counter() - t0)
            limit *= 2
            if max_limit is not None and limit > max_limit:
                return SearchResult("limit", capacity, None, None, nodes, ",".join(heuristics),
                                    time.perf_counter() - t0)

    # ------------------------------------------------------------------ internals
    def _setup(self, capacity: int, heuristic: str, node_limit: int | None,
               deadline: float | None) -> None:
        n = self.n
        self.cap = int(capacity)
        self.heuristic = heuristic
        self.rank_arr = np.zeros(n, dtype=np.int64)
        self.mo = np.zeros(n, dtype=np.int64)
        self.total = self.inst.sections.total.copy()
        self.cut = self.cut0.copy()
        self._sol = np.zeros(n, dtype=np.int64)
        self._nodes = 0
        self._limit = node_limit if node_limit is not None else 1 << 62
        self._deadline = deadline if deadline is not None else float("inf")
        # Sub-problem outcomes hold for any preordering, so they are kept per capacity.
        if capacity not in self._memos:
            self._memos[capacity] = ({}, {})
        self._memo, self._memo_sol = self._memos[capacity]

    def _ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Split section range [lo, hi) at boundaries no unplaced buffer crosses."""
        if hi - lo <= 1:
            return [(lo, hi)]
        zeros = np.flatnonzero(self.cut[lo:hi - 1] == 0)
        bounds = [lo] + [int(z) + lo + 1 for z in zeros] + [hi]
        return [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]

    def _solve_part(self, part: np.ndarray, lo: int, hi: int) -> bool:
        """Solve an independent sub-problem (buffers ``part`` in sections [lo, hi)), memoised."""
        part = part[self.mo[part] < _INF]
        if part.shape[0] == 0:
            return True
        key = part.tobytes() + self.mo[part].tobytes()
        hit = self._memo.get(key)
        if hit is not None:
            if hit:
                self._sol[part] = self._memo_sol[key]
            return hit
        saved_rank = self.rank_arr[part]
        self.rank_arr[part] = self.part_rank(part, self.heuristic)
        try:
            ok = self._dfs(part, lo, hi, -1)
        finally:
            self.rank_arr[part] = saved_rank
        self._memo[key] = ok
        if ok:
            self._memo_sol[key] = self._sol[part].copy()
        return ok

    def _dfs(self, part: np.ndarray, lo: int, hi: int, key0: int) -> bool:
        self._nodes += 1
        if self._nodes >= self._limit:
            raise _Abort
        if (self._nodes & 255) == 0 and time.perf_counter() >= self._deadline:
            raise _Abort
        mo = self.mo
        mu = mo[part]
        live = mu < _INF
        U = part[live]
        if U.shape[0] == 0:
            return True
        mu = mu[live]
        n = self.n
        size = self.size
        total = self.total
        cap = self.cap
        min_height = int((mu + size[U]).min())
        # Any candidate offset x must leave room for every section's unplaced bytes above it.
        x_max = cap - int(total[lo:hi].max())
        keys = mu * n + self.rank_arr[U]
        sel = (mu < min_height) & (mu <= x_max) & (keys > key0)
        if not sel.any():
            return False
        ck = keys[sel]
        cand = U[sel]
        o = np.argsort(ck)
        cand_l = cand[o].tolist()
        ck_l = ck[o].tolist()
        cut = self.cut
        nbrs = self.nbrs
        size_l = self.size_l
        first_l = self.first_l
        last_l = self.last_l
        aff_lo = self.aff_lo
        aff_hi = self.aff_hi
        aff_members = self.aff_members
        aff_idx = self.aff_idx
        sol = self._sol
        reduceat = np.minimum.reduceat
        maximum = np.maximum
        minimum = np.minimum
        for c, kc in zip(cand_l, ck_l):
            x = kc // n
            sc = size_l[c]
            h = x + sc
            nb = nbrs[c]
            old_nb = mo[nb]
            mo[nb] = maximum(old_nb, h)
            mo[c] = _INF
            s0 = first_l[c]
            s1 = last_l[c]
            total[s0:s1] -= sc
            a = aff_lo[c]
            b = aff_hi[c]
            floor = reduceat(mo[aff_members[c]], aff_idx[c])
            ok = False
            # Section check where the lowest unplaced minimum offset (the floor) may have
            # moved: the unplaced bytes stacked on the floor must fit. Elsewhere the floors
            # passed this check before, and x <= x_max covers the stack above x. Sections
            # outside [lo, hi) belong to other sub-problems.
            a2 = a if a > lo else lo
            b2 = b if b < hi else hi
            if int((minimum(floor[a2 - a:b2 - a], cap) + total[a2:b2]).max()) <= cap:
                sol[c] = x
                if s1 - s0 > 1:
                    seg = cut[s0:s1 - 1]
                    seg -= 1
                    zeros = np.flatnonzero(seg == 0)
                else:
                    zeros = None
                if zeros is None or zeros.shape[0] == 0:
                    ok = self._dfs(U, lo, hi, kc)
                else:
                    ok = self._split(U, lo, hi, [int(z) + s0 + 1 for z in zeros])
                if s1 - s0 > 1:
                    cut[s0:s1 - 1] += 1
            total[s0:s1] += sc
            mo[c] = x
            mo[nb] = old_nb
            if ok:
                return True
        return False

    def _split(self, part: np.ndarray, lo: int, hi: int, points: list[int]) -> bool:
        """Solve the pieces of [lo, hi) cut at ``points``; all must succeed."""
        U = part[self.mo[part] < _INF]
        if U.shape[0] == 0:
            return True
        f = self.first[U]
        bounds = [lo] + points + [hi]
        pieces = []
        for k in range(len(bounds) - 1):
            a, b = bounds[k], bounds[k + 1]
            sub = U[(f >= a) & (f < b)]
            if sub.shape[0]:
                pieces.append((sub, a, b))
        # Hardest-looking piece first: a failure there ends the node soonest.
        pieces.sort(key=lambda p: -p[0].shape[0])
        for sub, a, b in pieces:
            if not self._solve_part(sub, a, b):
                return False
        return True


# ---------------------------------------------------------------------- anytime minimisation
@dataclass
class MinimizeResult:
    """Best placement found by :func:`minimize_peak`, with what was proven on the way."""

    offsets: np.ndarray
    peak: int
    lower_bound: int
    proven_optimal: bool
    method: str
    nodes: int
    log: list[str]
    history: list[tuple[float, int]]
    """(seconds since the call, peak) each time the best peak dropped."""


def probe_targets(lo: int, best: int, capacity: int | None, step: int = 1) -> list[int]:
    """Capacities to try in one round, ascending and multiples of ``step`` (the gcd of the
    sizes: every peak of a dropped placement is one): the lower bound ``lo``, the points at
    1/2, 3/4, 7/8 and 15/16 of the way from it to the best peak, one step below the best
    peak, and ``capacity`` if it lies in between."""
    span = best - lo
    ts = {lo, best - step}
    for k in (1, 2, 3, 4):
        ts.add(best - -(-span // (1 << k)))  # best - ceil(span / 2^k)
    if capacity is not None:
        ts.add(int(capacity))
    out = {t // step * step for t in ts}
    return sorted(t for t in out if lo <= t < best)


def minimize_peak(inst: DSAInstance, start_offsets: np.ndarray, *, deadline: float,
                  lower_bound: int | None = None, capacity: int | None = None,
                  heuristics: Sequence[str] = DEFAULT_HEURISTICS, focus: float = 0.25,
                  rel_gap: float = 0.0,
                  progress: Callable[[str], None] | None = None) -> MinimizeResult:
    """Lower the peak of ``start_offsets`` with the canonical search until the deadline.

    Rounds of decision searches at the targets of :func:`probe_targets` (lower bound first),
    each target with each preordering once per round at the round's node limit, which doubles
    when a round settles nothing (MiniMalloc's round robin, over targets as well): easy
    targets are settled first and the time goes to the hard one. During the first ``focus``
    share of the time the targets other than the lower bound and the capacity get 1/16 of the
    limit, so the search for an optimal plan is not diluted. A success at the lower bound is optimal; a
    complete failure at a target proves the optimum is above it and raises the bound; a
    success at a higher target lowers the best peak and the next round's targets with it.
    All peaks of dropped placements are multiples of the gcd of the sizes, so targets and
    bounds move in those steps. Stops early once the peak is within ``rel_gap`` of the bound.
    """
    search = CanonicalSearch(inst)
    best = np.asarray(start_offsets, dtype=np.int64).copy()
    best_peak = peak_of(inst, best)
    step = int(np.gcd.reduce(inst.size)) if inst.n else 1
    lo = max(int(lower_bound or 0), inst.lower_bound())
    lo = -(-lo // step) * step
    log: list[str] = []
    method = "start"
    t_start = time.perf_counter()

    def note(msg: str) -> None:
        log.append(msg)
        if progress is not None:
            progress(msg)

    budget = max(2 * inst.n, 64)
    nodes = 0
    history: list[tuple[float, int]] = [(0.0, best_peak)]
    tried: dict[tuple[int, str], int] = {}
    focus_until = t_start + focus * max(deadline - t_start, 0.0)
    def open_gap() -> bool:
        return best_peak > lo and best_peak > lo * (1.0 + rel_gap)

    while open_gap() and time.perf_counter() < deadline:
        moved = False
        primary = {lo, (capacity // step * step) if capacity is not None else lo}
        for t in probe_targets(lo, best_peak, capacity, step):
            limit = budget
            if t not in primary and time.perf_counter() < focus_until:
                limit = max(budget // 16, 2 * inst.n)
            for h in heuristics:
                if t >= best_peak or t < lo or not open_gap() or tried.get((t, h), 0) >= limit:
                    continue
                tried[(t, h)] = limit
                res = search.fit_once(t, heuristic=h, node_limit=limit, deadline=deadline)
                nodes += res.nodes
                at = time.perf_counter() - t_start
                if res.status == "found":
                    assert res.offsets is not None and res.peak is not None
                    if res.peak < best_peak:
                        best, best_peak = res.offsets, res.peak
                        method = f"search({h})"
                        history.append((at, best_peak))
                        note(f"search: peak {best_peak} at target {t} after {at:.2f}s ({nodes} nodes)")
                    moved = True
                elif res.status == "infeasible":
                    note(f"search: proved nothing fits in {t} bytes after {at:.2f}s ({nodes} nodes)")
                    lo = t + step
                    moved = True
                if moved or time.perf_counter() >= deadline:
                    break
            if moved or time.perf_counter() >= deadline:
                break
        if not moved:
            budget *= 2
    return MinimizeResult(best, best_peak, lo, best_peak <= lo, method, nodes, log, history)
