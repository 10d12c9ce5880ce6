"""Tier 2 that skips with proof: simulate candidates in order of their throughput bound and stop
when no candidate left can beat the best simulated one.

Each fitting candidate's iteration time has a provable lower bound
(`memo_sim.search.bound.lower_bound`), so its simulated throughput (tokens per GPU per second,
what the ranking orders by) has an upper bound. Candidates are simulated in order of that upper
bound, best first, a batch at a time; the search stops when the next candidate's upper bound is
below the best simulated throughput: no candidate left can overtake it, so the best plan is the
one the exhaustive search (every fitting candidate simulated) finds. The bound is proved, not
fitted, so the margin the stop allows is zero; `PruneReport.margin` says by how much the closest
skipped candidate's bound fell short of the best (the proof's slack).

Modes (``simulate_top`` of `memo_sim.search.whatif.rank`): `SIMULATE_BOUND` (this search),
`SIMULATE_ALL` (every fitting candidate: the exhaustive search), or a count (the analytic tier's
best that many, as before).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from memo_sim.errors import MemoError
from memo_sim.search.bound import lower_bound

SIMULATE_ALL = "all"
SIMULATE_BOUND = "bound"
SIMULATE_MODES = (SIMULATE_BOUND, SIMULATE_ALL)
ALLOWED_GAP = 0.0  # the bound is proved (module docs): a skipped candidate is never within any gap of the best


def parse_simulate_top(value) -> int | str:
    """``--simulate-top``: ``bound``, ``all`` or a count of at least 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise MemoError(f"--simulate-top must be at least 0, got {value}")
        return value
    text = str(value).strip().lower()
    if text in SIMULATE_MODES:
        return text
    try:
        n = int(text)
    except ValueError:
        raise MemoError(f"--simulate-top {value!r}: give a count, 'bound' (simulate until no candidate left can "
                        f"win) or 'all' (every fitting candidate)") from None
    return parse_simulate_top(n)


@dataclass
class PruneReport:
    mode: str  # bound | all | top
    fitting: int  # candidates the analytic tier says fit: the ones tier 2 may simulate
    simulated: int
    skipped_by_bound: int  # fitting candidates whose throughput bound is below the best simulated
    allowed_gap: float = ALLOWED_GAP
    margin: float | None = None  # 1 - (best skipped bound / best simulated throughput); None: none skipped
    best_tgs: float | None = None  # the best simulated throughput
    for_verdicts: int = 0  # of ``simulated``: the verdict lines' sides, simulated after the search stopped
    # micro-batch pipeline candidates never built: their family's proved bound was below the best throughput
    # simulated before the pipelines were priced (`memo_sim.search.pipeline.pipeline_candidates`' ``floor``)
    not_built: int = 0
    not_built_families: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def add_verdict_sides(self, n: int) -> None:
        """``n`` more candidates simulated for the verdict lines (`memo_sim.search.verdicts`),
        each one the search had skipped (bound mode) or left out (top N)."""
        self.simulated += n
        self.for_verdicts += n
        if self.mode == SIMULATE_BOUND:
            self.skipped_by_bound -= n

    def add_not_built(self, not_built: dict | None) -> None:
        """Count the pipeline families the bound left unbuilt (``searched["pipeline"]["not_built"]``)
        among what the proof skipped: the margin is the closest bound of either kind."""
        if not not_built:
            return
        self.not_built += not_built["candidates"]
        self.not_built_families += not_built["families"]
        top = not_built.get("best_bound_tgs")
        if top is not None and self.best_tgs:
            m = 1.0 - top / self.best_tgs
            self.margin = m if self.margin is None else min(self.margin, m)

    def line(self) -> str:
        extra = (f"; {self.for_verdicts} more simulated so that each verdict line compares two simulated plans"
                 if self.for_verdicts else "")
        if self.not_built:
            extra += (f"; {self.not_built} micro-batch pipeline candidates ({self.not_built_families} layout, batch "
                      f"split and schedule families) not built: each family's proved bound is below the best "
                      f"throughput simulated before the pipelines were priced (--simulate-top all builds them)")
        if self.mode != SIMULATE_BOUND:
            return (f"tier 2: {self.simulated} of the {self.fitting} candidates the analytic tier fits simulated "
                    f"({'every one' if self.mode == SIMULATE_ALL else 'the analytic best'}){extra}")
        # what the margin is the bound of: a skipped plan's, else an unbuilt pipeline family's; where every plan
        # skipped was simulated since (for the verdicts) and none was left unbuilt, nothing stands on it (a review:
        # '0 skipped by a proved bound; the closest skipped bound is 9.9% below')
        whose = ("the closest skipped bound" if self.skipped_by_bound > 0 else
                 "the closest bound of a pipeline family left unbuilt" if self.not_built else None)
        proof = ("" if self.margin is None or whose is None else
                 f"; {whose} is {100 * self.margin:.1f}% below the best simulated throughput "
                 f"(proof margin; allowed gap {100 * self.allowed_gap:g}%)")
        return (f"tier 2: {self.simulated} of the {self.fitting} candidates the analytic tier fits simulated, "
                f"{self.skipped_by_bound} skipped by a proved bound{proof}{extra}")


def tgs_upper_bound(c) -> float:
    """The candidate's throughput at its lower-bound iteration time (the estimate's throughput
    scaled: throughput is tokens over iteration time)."""
    lb = lower_bound(c)
    return c.estimate.tgs * c.estimate.iteration_s / lb if lb > 0 else float("inf")


def _better(best: float | None, s: dict | None) -> float | None:
    """The best simulated throughput with summary ``s`` counted (a fitting one)."""
    if s and s["status"] == "OK" and s.get("tgs_tokens_per_gpu_s") is not None:
        return s["tgs_tokens_per_gpu_s"] if best is None else max(best, s["tgs_tokens_per_gpu_s"])
    return best


def simulate_by_bound(fitting: list, simulate: Callable[[list], object], *, batch: int = 4,
                      always: list | None = None, window: int | None = None) -> PruneReport:
    """Simulate ``fitting`` candidates (``simulate(list)`` fills each one's ``simulated``) in order
    of `tgs_upper_bound`, ``batch`` at a time, until the next bound is below the best simulated
    throughput; ``always`` (e.g. SPPO's heuristic choice) are simulated in the first batch too.
    Candidates already simulated (an earlier search over part of ``fitting``) count as simulated
    and their throughput as the best so far.

    ``window`` (a multiple of ``batch``; default ``batch``): how many positions one ``simulate`` call takes, so that
    a process pool has work for all its processes; the decisions stay ``batch`` at a time, and a candidate simulated
    past the position where they stop is un-simulated, so the result is the same whatever the window (a review:
    ``--jobs 4`` simulated in batches of 8 and ranked 79 plans where ``--jobs 1`` ranked 76)."""
    ub = {id(c): tgs_upper_bound(c) for c in fitting}
    order = sorted(fitting, key=lambda c: -ub[id(c)])
    extra = [c for c in (always or []) if c.simulated is None]
    best = None
    done = 0
    for c in fitting:  # simulated before this search (an earlier search over some of them): kept, counted
        if c.simulated is not None:
            done += 1
            best = _better(best, c.simulated)
    window = max(batch, -(-(window or batch) // batch) * batch)
    i, stop = 0, False
    while i < len(order) and not stop:
        if best is not None and ub[id(order[i])] < best:
            break
        end = i + window
        pending = [c for c in order[i:end] if c.simulated is None]
        pending += [c for c in extra if not any(c is x for x in pending)]
        if pending:
            simulate(pending)
        now = {id(c) for c in pending}
        accepted: set[int] = set()
        j = i
        while j < min(end, len(order)):  # the decisions a window of ``batch`` would make
            if best is not None and ub[id(order[j])] < best:
                stop = True
                break
            chunk = [c for c in order[j:j + batch] if id(c) in now and id(c) not in accepted]
            chunk += [c for c in extra if not any(c is x for x in chunk)]
            extra = []
            done += len(chunk)
            for c in chunk:
                accepted.add(id(c))
                best = _better(best, c.simulated)
            j += batch
        for c in pending:  # simulated past the stop: as if never simulated
            if id(c) not in accepted:
                c.simulated = None
        i = j
    if extra:
        simulate(extra)
        done += len(extra)
    skipped = [c for c in order[i:] if c.simulated is None]
    margin = (1.0 - max(ub[id(c)] for c in skipped) / best) if skipped and best else None
    return PruneReport(SIMULATE_BOUND, len(fitting), done, len(skipped), margin=margin, best_tgs=best)


__all__ = ["ALLOWED_GAP", "PruneReport", "SIMULATE_ALL", "SIMULATE_BOUND", "SIMULATE_MODES", "parse_simulate_top",
           "simulate_by_bound", "tgs_upper_bound"]
