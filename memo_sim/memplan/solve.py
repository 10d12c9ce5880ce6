"""One entry point for the offline DSA problem: :func:`solve_dsa`.

Given a request trace (buffers with sizes and lifetimes) it returns a static offset for every
buffer and the arena size (peak) they need, minimising the peak:

* ``"greedy"``: best of several orderings placed by best / first fit (``greedy.py``);
* ``"search"``: greedy, then the canonical branch-and-bound of ``dsa_search.py`` aimed at the
  max-live lower bound first (a hit there is optimal), then higher targets;
* ``"mip-highs"`` / ``"mip-cbc"``: greedy, then the MIP of ``mip_model.py`` (MEMO section 4.2)
  warm-started from it;
* ``"auto"``: greedy; stop if it meets the lower bound; else the search; and for small
  instances the search has not proven optimal, HiGHS with the time left (it can prove a bound
  the search cannot).

Every answer is checked by ``placement_check.validate_placement`` before it is returned; a candidate
that fails is dropped with a note and the next best valid one is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from memo_sim.errors import MemoError
from memo_sim.memplan.bounds import DSAInstance
from memo_sim.memplan.greedy import greedy_place, peak_of
from memo_sim.memplan.mip_model import solve_mip
from memo_sim.memplan.dsa_search import minimize_peak
from memo_sim.request_trace import RequestTrace
from memo_sim.memplan.placement_check import validate_placement

SOLVERS = ("auto", "search", "mip-highs", "mip-cbc", "greedy")
AUTO_MIP_MAX_BUFFERS = 60
"""In ``auto``, the MIP runs only on instances this small (above it, it makes no progress)."""


class DSAInputError(MemoError):
    """An argument of the DSA planner is out of range."""


@dataclass(frozen=True)
class PhaseNote:
    """What one phase of the planner did: its time, the best peak after it, a remark."""

    phase: str
    time_s: float
    peak_bytes: int | None
    detail: str


@dataclass
class DSASolution:
    """A validated static memory plan for one trace.

    ``offsets`` maps buffer id to byte offset; ``peak_bytes`` is the arena size the plan needs
    (highest ``offset + size``); ``gap = peak / lower_bound - 1``; ``proven_optimal`` when the
    peak meets a proven lower bound. ``capacity_bytes``/``fits_capacity``/
    ``time_to_capacity_s`` report on the requested capacity, if one was given.
    """

    offsets: dict[str, int]
    peak_bytes: int
    lower_bound_bytes: int
    gap: float
    method: str
    proven_optimal: bool
    solve_time_s: float
    greedy_peak_bytes: int
    capacity_bytes: int | None = None
    fits_capacity: bool | None = None
    time_to_capacity_s: float | None = None
    phases: list[PhaseNote] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        return [f"{p.phase}: {p.detail}" for p in self.phases]

    def to_json_obj(self) -> dict:
        return {
            "format": "memo-dsa-solution",
            "version": 1,
            "peak_bytes": self.peak_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "gap": self.gap,
            "method": self.method,
            "proven_optimal": self.proven_optimal,
            "solve_time_s": self.solve_time_s,
            "greedy_peak_bytes": self.greedy_peak_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fits_capacity": self.fits_capacity,
            "time_to_capacity_s": self.time_to_capacity_s,
            "phases": [asdict(p) for p in self.phases],
            "offsets": dict(self.offsets),
        }


def _check_args(time_limit_s: float, solver: str, capacity: int | None) -> None:
    if solver not in SOLVERS:
        raise DSAInputError(f"solver: unknown {solver!r}; use one of {', '.join(SOLVERS)}")
    if not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
        raise DSAInputError(f"time_limit_s: must be a positive number of seconds, got {time_limit_s!r}")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0):
        raise DSAInputError(f"capacity: must be a positive integer of bytes or None, got {capacity!r}")


# python-mip's statuses of a search the solver interrupted (OptimizationStatus.FEASIBLE: "the search was
# interrupted before concluding if this is the optimal solution"; NO_SOLUTION_FOUND: "a time limit was reached");
# the only limit `solve_mip` sets besides the gaps, which end with OPTIMAL, is max_seconds
_STOPPED_AT_LIMIT = ("feasible", "no_solution_found")


def _mip_words(mr, time_limit_s: float, left: float) -> str:
    """The MIP phase's detail: how it ended (stopped at the time limit, its ``left`` seconds of ``time_limit_s``,
    rather than python-mip's "status feasible"), the solver's bound, build and solve time, its notes."""
    how = (f"stopped at the time limit ({left:.2f} s of the {time_limit_s:g} s left to it)"
           if mr.status in _STOPPED_AT_LIMIT else f"status {mr.status}")
    extra = "; ".join(mr.notes)
    return (f"{how}, solver bound {mr.bound}, build {mr.build_time_s:.2f}s, solve {mr.solve_time_s:.2f}s"
            + (f"; {extra}" if extra else ""))


def solve_dsa(trace: RequestTrace, *, time_limit_s: float = 30.0, solver: str = "auto",
              capacity: int | None = None, rel_gap: float = 0.0,
              progress: Callable[[str], None] | None = None) -> DSASolution:
    """Plan static offsets for every buffer of ``trace``, minimising the peak (see module doc).

    ``capacity``: bytes the plan must fit in. A capacity below the max-live lower bound is
    impossible and raises :class:`DSAInputError`; otherwise it is also tried as a search target
    and the answer says whether the plan fits. ``rel_gap``: stop once the peak is within this
    fraction of the lower bound (0 = search until optimal or out of time). ``progress``
    receives one-line messages.
    """
    _check_args(time_limit_s, solver, capacity)
    if not isinstance(rel_gap, (int, float)) or rel_gap < 0:
        raise DSAInputError(f"rel_gap: must be a fraction >= 0 (0.01 = 1%), got {rel_gap!r}")
    t0 = time.perf_counter()
    deadline = t0 + float(time_limit_s)
    phases: list[PhaseNote] = []
    cap_hit: list[float] = []

    def say(msg: str) -> None:
        if progress is not None:
            progress(msg)

    def phase(name: str, peak: int | None, detail: str) -> None:
        phases.append(PhaseNote(name, round(time.perf_counter() - t0, 4), peak, detail))
        if capacity is not None and peak is not None and peak <= capacity and not cap_hit:
            cap_hit.append(time.perf_counter() - t0)
        say(f"{name}: {detail}")

    say(f"conflicts and sections of {len(trace)} buffers")
    inst = DSAInstance.from_trace(trace)
    lb = inst.lower_bound()
    if capacity is not None and lb > capacity:
        raise DSAInputError(
            f"capacity: {capacity} bytes is below the max-live lower bound {lb} of trace "
            f"{trace.name or '(unnamed)'}; raise capacity to at least {lb}")
    if inst.n == 0:
        return DSASolution({}, 0, 0, 0.0, "empty", True, 0.0, 0, capacity,
                           True if capacity is not None else None, 0.0 if capacity is not None else None,
                           [PhaseNote("greedy", 0.0, 0, "empty trace")])

    # Candidates (offsets, method); validated at the end, best valid one wins.
    cands: list[tuple[np.ndarray, str]] = []
    say(f"greedy: placing {inst.n} buffers in each ordering (the first always completes)")
    g = greedy_place(inst, stop=lambda pk: pk <= lb, deadline=deadline)
    gmethod = f"greedy:{g.ordering}"
    cands.append((g.offsets, gmethod))
    best_peak = g.peak
    cut = " (time limit reached)" if time.perf_counter() > deadline else ""
    phase("greedy", g.peak, f"best of {len(g.peaks)} orderings{cut}: {g.ordering}, peak {g.peak} "
          f"({100 * (g.peak / lb - 1):.2f}% over the lower bound {lb})")
    lower = lb

    def settled() -> bool:
        return best_peak <= lower * (1.0 + rel_gap)

    if solver in ("search", "auto") and not settled() and time.perf_counter() >= deadline:
        # setting the search up costs time of its own on a large trace: none is left for it
        phase("search", best_peak, "not run: the time limit was reached in the greedy; the greedy's plan stands")
    elif solver in ("search", "auto") and not settled():
        reserve = 0.0
        if solver == "auto" and inst.n <= AUTO_MIP_MAX_BUFFERS:
            reserve = 0.4 * float(time_limit_s)
        t_search = time.perf_counter() - t0
        res = minimize_peak(inst, g.offsets, deadline=deadline - reserve, lower_bound=lower,
                            capacity=capacity, rel_gap=rel_gap, progress=lambda m: say(m))
        if capacity is not None and not cap_hit:
            cap_hit.extend(t_search + at for at, pk in res.history if pk <= capacity)
        if res.peak < best_peak:
            cands.append((res.offsets, res.method))
            best_peak = res.peak
        lower = max(lower, res.lower_bound)
        detail = (f"peak {res.peak}, {res.nodes} nodes" +
                  (", optimal" if res.peak <= lower else f", lower bound {lower}"))
        if res.lower_bound > lb:
            detail += f" (raised from {lb} by a complete search)"
        phase("search", best_peak, detail)

    want_mip = solver in ("mip-highs", "mip-cbc") or (
        solver == "auto" and inst.n <= AUTO_MIP_MAX_BUFFERS)
    left = deadline - time.perf_counter()
    if want_mip and not settled() and left <= 0:
        # a review: the MIP was set up with 0.5 s after a greedy that had used the whole limit (0.1 s: 0.63 s)
        phase(f"mip-{'cbc' if solver == 'mip-cbc' else 'highs'}", best_peak,
              f"not run: the time limit ({float(time_limit_s):g} s) was reached before it; the best plan so far "
              f"stands")
    elif want_mip and not settled():
        which = "cbc" if solver == "mip-cbc" else "highs"
        start = min(cands, key=lambda c: peak_of(inst, c[0]))[0]
        mr = solve_mip(inst, start, solver=which, time_limit_s=left, lower_bound=lower, rel_gap=rel_gap)
        if mr.improved and mr.offsets is not None and mr.peak is not None and mr.peak < best_peak:
            cands.append((mr.offsets, f"mip-{mr.solver}"))
            best_peak = mr.peak
        lower = max(lower, min(mr.bound, best_peak))
        phase(f"mip-{mr.solver}", best_peak, _mip_words(mr, float(time_limit_s), left))

    # Validate, best first; an invalid candidate is dropped with a note.
    say("checking the plan")
    ids = [b.id for b in trace.buffers]
    chosen: tuple[dict[str, int], int, str] | None = None
    for off, method in sorted(cands, key=lambda c: peak_of(inst, c[0])):
        pk = peak_of(inst, off)
        plan = {ids[i]: int(off[i]) for i in range(inst.n)}
        problems = validate_placement(trace, plan, pk)
        if problems:
            phase("validate", None, f"rejected the {method} plan: {problems[0]}")
            continue
        chosen = (plan, pk, method)
        break
    if chosen is None:
        raise RuntimeError("no valid DSA plan was produced; the greedy placement failed validation")
    plan, pk, method = chosen
    lower = min(lower, pk)
    elapsed = time.perf_counter() - t0
    fits = None if capacity is None else pk <= capacity
    return DSASolution(
        offsets=plan, peak_bytes=pk, lower_bound_bytes=lower,
        gap=(pk / lower - 1.0) if lower else 0.0, method=method, proven_optimal=pk <= lower,
        solve_time_s=elapsed, greedy_peak_bytes=g.peak, capacity_bytes=capacity,
        fits_capacity=fits, time_to_capacity_s=(cap_hit[0] if (cap_hit and fits) else None),
        phases=phases)
