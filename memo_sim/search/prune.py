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

from dataclasses import dataclass, field, fields
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
    not_built_margin: float | None = None  # 1 - (the best unbuilt family's bound / best simulated throughput)
    skipped_margin: float | None = None  # 1 - (the best bound still skipped / best simulated throughput)
    failed: int = 0  # of ``simulated``: out of memory in the simulation (fit by the analytic tier only)
    # top N: fitting plans left unsimulated whose proved bound is above the best simulated throughput (the answer is
    # not proved best while there are any; `set_unproved`)
    unproved: int = 0
    top: int = 0  # top N: the N asked for (``simulate_top``)
    # each fitting candidate's proved throughput bound by id (`simulate_by_bound`'s), so the margin can be recomputed
    # when plans it skipped are simulated since; not part of the report's JSON
    bounds: dict | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "bounds"}

    def add_verdict_sides(self, n: int, still_skipped: list | None = None, open_skipped: list | None = None) -> None:
        """``n`` more candidates simulated for the verdict lines (`memo_sim.search.verdicts`),
        each one the search had skipped (bound mode) or left out (top N). ``still_skipped`` (bound
        mode): the fitting candidates not simulated after them; the skipped count and the proof margin are
        theirs (a review: the margin stayed the one of a plan simulated since for a verdict line, 0.2% where
        the closest still skipped was 1.09% below). ``open_skipped``: those of them the margin is of (default: all):
        the what-if leaves out a plan whose twin under another policy name was simulated (the same bytes moved and
        rebuilt, `memo_sim.search.whatif.behaviour_key`: its throughput is known, and the ranking folds it into the
        simulated row)."""
        self.simulated += n
        self.for_verdicts += n
        if self.mode != SIMULATE_BOUND:
            return
        if still_skipped is None:
            self.skipped_by_bound -= n
            return
        self.skipped_by_bound = len(still_skipped)
        skipped = None
        among = still_skipped if open_skipped is None else open_skipped
        if among and self.best_tgs and self.bounds is not None:
            top = max(self.bounds[id(c)] if id(c) in self.bounds else tgs_upper_bound(c) for c in among)
            skipped = 1.0 - top / self.best_tgs
        self.skipped_margin = skipped
        self.margin = _closest(skipped, self.not_built_margin)

    def set_unproved(self, unsimulated: list) -> None:
        """Top N: count the fitting ``unsimulated`` candidates whose proved bound is above the best simulated
        throughput: any of them could be the best plan (no bound search ran to rule them out)."""
        if self.best_tgs:
            self.unproved = sum(1 for c in unsimulated if tgs_upper_bound(c) > self.best_tgs)

    def add_not_built(self, not_built: dict | None) -> None:
        """Count the pipeline families the bound left unbuilt (``searched["pipeline"]["not_built"]``)
        among what the proof skipped: the margin is the closest bound of either kind."""
        if not not_built:
            return
        self.not_built += not_built["candidates"]
        self.not_built_families += not_built["families"]
        top = not_built.get("best_bound_tgs")
        if top is not None and self.best_tgs:
            self.not_built_margin = 1.0 - top / self.best_tgs
            self.margin = _closest(self.margin, self.not_built_margin)

    def line(self) -> str:
        """The tier-2 line: how many simulated (of them, how many for the verdict lines: part of the count, not
        beside it; a review read '60 simulated ... 32 more simulated' as 92), skipped, and the proof's margin."""
        extra = ""
        if self.not_built:
            extra += (f"; {self.not_built} micro-batch pipeline candidates ({self.not_built_families} layout, batch "
                      f"split and schedule families) not built: each family's proved bound is below the best "
                      f"throughput simulated before the pipelines were priced (--simulate-top all builds them)")
        failed = (f"; {self.failed} of the simulated ran out of memory there (the analytic tier fit them)"
                  if self.failed else "")
        if self.mode != SIMULATE_BOUND:
            first = self.fitting if self.mode == SIMULATE_ALL else min(self.top, self.fitting)
            how = "every one" if self.mode == SIMULATE_ALL else f"the analytic best {first}"
            if (sppo := self.simulated - self.for_verdicts - first) > 0:  # `memo_sim.search.whatif.sppo_always`'s
                how += f", {sppo} of SPPO's points (its heuristic's choice and its best)"
            if self.for_verdicts:
                how += (f", and {self.for_verdicts} for the verdict lines so that each verdict line compares two "
                        f"simulated plans")
            many = self.unproved != 1
            unproved = ("" if not self.unproved else
                        f"; the answer is not proved best: {self.unproved} fitting plan{'s' if many else ''} not "
                        f"simulated {'have' if many else 'has'} a proved bound above its throughput (--simulate-top "
                        f"bound simulates until none has)")
            return (f"tier 2: {self.simulated} of the {self.fitting} candidates the analytic tier fits simulated "
                    f"({how}){failed}{unproved}{extra}")
        # what the margin is the bound of: a skipped plan's, else an unbuilt pipeline family's; where every plan
        # skipped was simulated since (for the verdicts) and none was left unbuilt, nothing stands on it (a review:
        # '0 skipped by a proved bound; the closest skipped bound is 9.9% below')
        # each named with its own margin (a review: 0.8% was an unbuilt family's, said of the closest skipped plan)
        skipped = (self.skipped_margin if self.skipped_margin is not None else
                   self.margin if self.not_built_margin is None else None)
        parts = [f"{whose} is {100 * m:.1f}% below the best simulated throughput" for whose, m, on in (
            ("the closest skipped bound", skipped, self.skipped_by_bound > 0),
            ("the closest bound of a pipeline family left unbuilt", self.not_built_margin, self.not_built > 0))
            if on and m is not None]
        proof = (f"; {', and '.join(parts)} (proof margin; allowed gap {100 * self.allowed_gap:g}%)"
                 if parts else "")
        how = ("" if not self.for_verdicts else
               f" ({self.simulated - self.for_verdicts} by the bound search, {self.for_verdicts} after it so that "
               f"each verdict line compares two simulated plans)")
        return (f"tier 2: {self.simulated} of the {self.fitting} candidates the analytic tier fits simulated{how}, "
                f"{self.skipped_by_bound} skipped by a proved bound{proof}{failed}{extra}")


# A proved bound and the simulation it bounds sum the same seconds in different orders: a tight bound (a pure
# compute chain) came out up to 1.8e-15 of itself below its own simulated throughput (a review: 6 rows of 24
# exhaustive queries), and 3.3e-12 where the simulator adds a single stage's 512 micro-batches of 128 layers op by op
# at clock times near 240 s (a review, 2026-12-03: the summation's error grows with the ops summed, about n x 1.1e-16
# for n ops, 1e-10 at a million). A candidate is skipped only where its bound is below the best by more than this
# share: 1e-9, a tie at any size the simulator runs, the tolerance the bound's property test holds it to.
BOUND_ROUNDING = 1e-9


def below(bound: float, best: float) -> bool:
    """Whether a candidate of proved throughput bound ``bound`` cannot beat (or tie) ``best``, rounding aside."""
    return bound < best * (1 - BOUND_ROUNDING)


_BOUND_ATTR = "_tgs_upper_bound"  # where `tgs_upper_bound` keeps a candidate's bound (not a dataclass field)


def tgs_upper_bound(c) -> float:
    """The candidate's throughput at its lower-bound iteration time (the estimate's throughput
    scaled: throughput is tokens over iteration time).

    Kept on the candidate once proved: it is a pure function of what the candidate was built with (model, layout,
    policy, batch split, schedule, profile: never reassigned; tier 2 fills ``simulated`` only), and a query asks for
    it several times (the bound search before the pipelines, the one over every fitting candidate, the verdict
    sides and the runner-up's line). A cluster-scale query proved each single-stage bound twice or more (2026-12-02,
    deepseek-v3 on 256 GB200s: 78,591 bounds for 43,540 candidates)."""
    ub = c.__dict__.get(_BOUND_ATTR)
    if ub is None:
        lb = lower_bound(c)
        ub = c.estimate.tgs * c.estimate.iteration_s / lb if lb > 0 else float("inf")
        c.__dict__[_BOUND_ATTR] = ub
    return ub


def _better(best: float | None, s: dict | None) -> float | None:
    """The best simulated throughput with summary ``s`` counted (a fitting one)."""
    if s and s["status"] == "OK" and s.get("tgs_tokens_per_gpu_s") is not None:
        return s["tgs_tokens_per_gpu_s"] if best is None else max(best, s["tgs_tokens_per_gpu_s"])
    return best


def simulate_by_bound(fitting: list, simulate: Callable[[list], object], *, batch: int = 4,
                      always: list | None = None, window: int | None = None,
                      on_step: Callable[[int, float | None], None] | None = None,
                      on_bound: Callable[[int, int], None] | None = None,
                      floor: float | None = None) -> PruneReport:
    """Simulate ``fitting`` candidates (``simulate(list)`` fills each one's ``simulated``) in order
    of `tgs_upper_bound`, ``batch`` at a time, until the next bound is below the best simulated
    throughput; ``always`` (e.g. SPPO's heuristic choice) are simulated in the first batch too.
    Candidates already simulated (an earlier search over part of ``fitting``) count as simulated
    and their throughput as the best so far.

    ``window`` (a multiple of ``batch``; default ``batch``): how many positions one ``simulate`` call takes, so that
    a process pool has work for all its processes; the decisions stay ``batch`` at a time, and a candidate simulated
    past the position where they stop is un-simulated, so the result is the same whatever the window (a review:
    ``--jobs 4`` simulated in batches of 8 and ranked 79 plans where ``--jobs 1`` ranked 76).

    ``on_step(simulated, gap)`` after each window's decisions: how many are simulated, and the bound gap, how far
    the next candidate's bound is above the best simulated throughput (a fraction; the search stops where it falls
    below 0; None before anything fitting was simulated or when none is left), for a progress line.
    ``on_bound(i, n)`` after each of the ``n`` bounds is proved (a review: 12 s of silence over 7,933 bounds).
    ``floor``: a throughput a plan of the same search space was simulated at elsewhere, counted as the best so far
    (a candidate whose bound is below it cannot be the answer); the report's ``best_tgs`` is then at least it."""
    ub = {}
    for i, c in enumerate(fitting, 1):
        ub[id(c)] = tgs_upper_bound(c)
        if on_bound is not None:
            on_bound(i, len(fitting))
    order = sorted(fitting, key=lambda c: -ub[id(c)])
    extra = [c for c in (always or []) if c.simulated is None]
    best = floor
    done = 0
    for c in fitting:  # simulated before this search (an earlier search over some of them): kept, counted
        if c.simulated is not None:
            done += 1
            best = _better(best, c.simulated)
    window = max(batch, -(-(window or batch) // batch) * batch)
    i, stop = 0, False
    while i < len(order) and not stop:
        if best is not None and below(ub[id(order[i])], best):
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
            if best is not None and below(ub[id(order[j])], best):
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
        if on_step is not None:
            on_step(done, bound_gap(ub[id(order[i])], best) if i < len(order) else None)
    if extra:
        simulate(extra)
        done += len(extra)
    skipped = [c for c in order[i:] if c.simulated is None]
    margin = (1.0 - max(ub[id(c)] for c in skipped) / best) if skipped and best else None
    return PruneReport(SIMULATE_BOUND, len(fitting), done, len(skipped), margin=margin, best_tgs=best, bounds=ub,
                       skipped_margin=margin)


def bound_gap(bound: float, best: float | None) -> float | None:
    """How far a throughput ``bound`` is above the ``best`` simulated throughput, as a fraction (negative: below it,
    where the bound search stops); None with no best yet."""
    return bound / best - 1.0 if best else None


def _closest(a: float | None, b: float | None) -> float | None:
    """The smaller of two margins (None: none)."""
    return b if a is None else a if b is None else min(a, b)


__all__ = ["ALLOWED_GAP", "BOUND_ROUNDING", "PruneReport", "below", "bound_gap",
           "SIMULATE_ALL", "SIMULATE_BOUND", "SIMULATE_MODES", "parse_simulate_top",
           "simulate_by_bound", "tgs_upper_bound"]
