"""Fast DSA heuristic: several buffer orderings, each placed by best fit; the best one wins.

Placement rule (best fit): buffers are placed one at a time in the given order. For a buffer,
the address ranges of the already placed buffers whose lifetimes overlap it are merged; the
free gaps between them (and above the highest) are the candidates, and the buffer goes into the
smallest gap that holds it, lowest address first on ties (first fit takes the lowest gap that
holds it instead). Only conflicting buffers constrain it, so a gap left by a buffer that is not
live at the same time is reused.

Orderings (ties broken by the next key, then by index): size, lifetime length, area
(size x length), start step, conflict degree, and the largest section total the buffer lives
in (buffers in the most crowded part of the timeline first). The result is a valid placement
with its peak; its cost is O(sum of degrees x log) per ordering.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from memo_sim.memplan.bounds import DSAInstance
from memo_sim.request_trace import RequestTrace

_BIG = np.int64(1) << np.int64(62)


def section_peak(inst: DSAInstance) -> np.ndarray:
    """For each buffer, the largest section total among the sections it lives in."""
    sec = inst.sections
    out = np.zeros(inst.n, dtype=np.int64)
    for b in range(inst.n):
        out[b] = sec.total[sec.first[b]:sec.last[b]].max()
    return out


def _rank_order(*keys_desc: np.ndarray) -> np.ndarray:
    """Indices sorted by the keys in priority order, each descending; index breaks ties."""
    n = keys_desc[0].shape[0]
    cols = [np.arange(n)] + [-np.asarray(k, dtype=np.int64) for k in reversed(keys_desc)]
    return np.lexsort(cols)


def orderings(inst: DSAInstance) -> dict[str, np.ndarray]:
    """The named static orderings tried by the heuristic (see the module docstring)."""
    size, lower, upper = inst.size, inst.lower, inst.upper
    length = upper - lower
    area = size * length
    deg = inst.conflicts.degree()
    tot = section_peak(inst)
    return {
        "size": _rank_order(size, length),
        "length": _rank_order(length, size),
        "area": _rank_order(area, size),
        "start": _rank_order(-lower, size),
        "conflicts": _rank_order(deg, size),
        "total-size": _rank_order(tot, size),
        "total-area": _rank_order(tot, area),
        "total-length": _rank_order(tot, length, area),
    }


def place_in_order(inst: DSAInstance, order: np.ndarray, best_fit: bool = True) -> np.ndarray:
    """Offsets (int64 per buffer) from placing the buffers in ``order`` by best or first fit."""
    size = inst.size
    nbrs = inst.conflicts.neighbors
    n = inst.n
    off = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for b in order:
        b = int(b)
        nb = nbrs[b]
        nb = nb[placed[nb]]
        s = size[b]
        if nb.shape[0] == 0:
            off[b] = 0
        else:
            st = off[nb]
            en = st + size[nb]
            o = np.argsort(st, kind="stable")
            st = st[o]
            cm = np.maximum.accumulate(en[o])
            g_start = np.concatenate(([0], cm))
            g_end = np.concatenate((st, [_BIG]))
            room = g_end - g_start
            if best_fit:
                room = np.where(room >= s, room, _BIG + 1)
                k = int(np.argmin(room))
            else:
                k = int(np.argmax(room >= s))
            off[b] = g_start[k]
        placed[b] = True
    return off


def peak_of(inst: DSAInstance, off: np.ndarray) -> int:
    return int((off + inst.size).max()) if inst.n else 0


@dataclass(frozen=True)
class GreedyResult:
    """The best heuristic placement and the peak every ordering reached."""

    offsets: np.ndarray
    peak: int
    ordering: str
    order: np.ndarray
    peaks: dict[str, int] = field(default_factory=dict)


def greedy_place(inst: DSAInstance,
                 extra: dict[str, np.ndarray] | None = None,
                 stop: Callable[[int], bool] | None = None,
                 deadline: float | None = None) -> GreedyResult:
    """Try every ordering with best fit and with first fit; return the lowest peak.

    ``extra`` adds named orderings; ``stop(peak)`` returning True ends early (for example when
    the peak has reached the lower bound); past ``deadline`` (a `time.perf_counter` instant)
    no further ordering starts, so at least one is always placed. ``peaks`` lists the
    orderings tried.
    """
    if inst.n == 0:
        z = np.zeros(0, dtype=np.int64)
        return GreedyResult(z, 0, "empty", z, {})
    named = orderings(inst)
    if extra:
        named.update(extra)
    best: GreedyResult | None = None
    peaks: dict[str, int] = {}
    for name, order in named.items():
        for best_fit in (True, False):
            label = f"{name}/{'best' if best_fit else 'first'}-fit"
            off = place_in_order(inst, order, best_fit)
            pk = peak_of(inst, off)
            peaks[label] = pk
            if best is None or pk < best.peak:
                best = GreedyResult(off, pk, label, order)
            if (stop is not None and stop(best.peak)) or (deadline is not None and time.perf_counter() > deadline):
                return GreedyResult(best.offsets, best.peak, best.ordering, best.order, peaks)
    assert best is not None
    return GreedyResult(best.offsets, best.peak, best.ordering, best.order, peaks)


def greedy_trace(trace: RequestTrace) -> tuple[dict[str, int], int, str]:
    """Convenience: best greedy placement of a trace as ``(offsets by id, peak, ordering)``."""
    inst = DSAInstance.from_trace(trace)
    res = greedy_place(inst)
    return ({b.id: int(res.offsets[i]) for i, b in enumerate(trace.buffers)}, res.peak, res.ordering)


def compact(inst: DSAInstance, off: np.ndarray) -> np.ndarray:
    """Drop every buffer as low as it goes, keeping the vertical order of the placement.

    Buffers are visited by increasing offset; each moves down to the highest top among its
    conflicting buffers visited before it (or 0). If ``off`` was valid the result is valid, no
    buffer moves up, and every offset becomes a sum of buffer sizes (so a multiple of their
    gcd). Ties in offset are visited by index.
    """
    off = np.asarray(off)
    order = np.lexsort((np.arange(inst.n), off))
    return place_in_offset_order(inst, order)


def place_in_offset_order(inst: DSAInstance, order: np.ndarray) -> np.ndarray:
    """Offsets when each buffer in ``order`` sits on the highest placed conflicting buffer."""
    size = inst.size
    nbrs = inst.conflicts.neighbors
    out = np.zeros(inst.n, dtype=np.int64)
    placed = np.zeros(inst.n, dtype=bool)
    for b in order:
        b = int(b)
        nb = nbrs[b]
        nb = nb[placed[nb]]
        out[b] = int((out[nb] + size[nb]).max()) if nb.shape[0] else 0
        placed[b] = True
    return out
