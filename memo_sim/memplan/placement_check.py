"""Independent check of a static memory plan (offsets for every buffer of a trace).

A plan is valid when every buffer of the trace has an integer offset, no offset is negative, no
buffer ends past the arena, and no two buffers whose lifetimes overlap share an address. The
address check runs over the conflict pairs found by the sweep of ``bounds.overlap_pairs``
(vectorised), never over all O(n^2) pairs. Every solver's answer goes through here before it
is returned, so a solver bug (or a MIP solution that violates a big-M row) cannot leak out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from memo_sim.errors import MemoError
from memo_sim.memplan.bounds import overlap_pairs, trace_arrays
from memo_sim.request_trace import RequestTrace


class PlacementError(MemoError):
    """A memory plan places buffers out of the arena or on top of each other."""


def validate_placement(trace: RequestTrace, offsets: Mapping[str, int], arena_size: int,
                       max_reported: int = 20) -> list[str]:
    """Return the violations of ``offsets`` (buffer id -> byte offset) in an arena of
    ``arena_size`` bytes; an empty list means the plan is valid.

    Reports at most ``max_reported`` address overlaps (and says how many there were in all).
    """
    problems: list[str] = []
    ids = [b.id for b in trace.buffers]
    known = set(ids)
    for key in offsets:
        if key not in known:
            problems.append(f"offset given for unknown buffer id {key!r}")
    n = len(ids)
    off = np.zeros(n, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    for i, b in enumerate(trace.buffers):
        if b.id not in offsets:
            problems.append(f"buffer {b.id!r} has no offset")
            ok[i] = False
            continue
        v = offsets[b.id]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            problems.append(f"buffer {b.id!r}: offset must be an integer, got {v!r}")
            ok[i] = False
            continue
        v = int(v)
        if v < 0:
            problems.append(f"buffer {b.id!r}: negative offset {v}")
        if v + b.size > arena_size:
            problems.append(f"buffer {b.id!r}: ends at {v + b.size}, past the arena of {arena_size} bytes")
        off[i] = v
    if n < 2:
        return problems
    size, lower, upper = trace_arrays(trace)
    pairs = overlap_pairs(lower, upper)
    if len(pairs):
        i, j = pairs[:, 0], pairs[:, 1]
        bad = ok[i] & ok[j] & (off[i] < off[j] + size[j]) & (off[j] < off[i] + size[i])
        idx = np.flatnonzero(bad)
        for k in idx[:max_reported]:
            a, b = trace.buffers[int(i[k])], trace.buffers[int(j[k])]
            problems.append(
                f"buffers {a.id!r} [{off[i[k]]}, {off[i[k]] + a.size}) and {b.id!r} "
                f"[{off[j[k]]}, {off[j[k]] + b.size}) are live together "
                f"(steps [{max(a.lower, b.lower)}, {min(a.upper, b.upper)})) and overlap in memory"
            )
        if len(idx) > max_reported:
            problems.append(f"... {len(idx) - max_reported} more overlapping pairs")
    return problems


def check_placement(trace: RequestTrace, offsets: Mapping[str, int], arena_size: int) -> None:
    """Raise :class:`PlacementError` naming the first violation (and the count) if any."""
    problems = validate_placement(trace, offsets, arena_size)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise PlacementError(f"invalid memory plan: {problems[0]}{more}; re-run the planner on this trace")


def placement_peak(trace: RequestTrace, offsets: Mapping[str, int]) -> int:
    """The arena size a placement needs: the highest ``offset + size`` (0 if empty)."""
    return max((int(offsets[b.id]) + b.size for b in trace.buffers), default=0)
