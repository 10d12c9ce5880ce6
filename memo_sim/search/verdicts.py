"""The what-if's one-line verdicts (METP against Megatron TP, SPPO against MEMO): which candidates
each side holds, the best fitting plan of each side in a ranking, and the plans tier 2 simulates
so that every verdict compares two simulated plans, never an analytic number with a simulated one.

A side's plan is the first fitting candidate of the ranking that belongs to it (the ranking puts
simulated candidates first, `memo_sim.search.candidate.Candidate.sort_key`). Where that plan was
not simulated (tier 2 stopped at a proved bound before reaching it, or simulated only the top N),
`verdict_sides_to_simulate` names it; the what-if simulates it and ranks again, until both sides
of every verdict with two sides are simulated plans (a side whose simulation does not fit gives
way to the next plan of that side). The compared plans are then each side's best simulated plan:
the best of its side the exhaustive search would find wherever the side's own best was simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from memo_sim.search.prune import tgs_upper_bound

VERDICT_ROUNDS = 4  # simulate-and-rank rounds: a side whose simulated plan does not fit gives way to the next,
# and a side's unsimulated plans whose bounds beat its simulated best are simulated, SIDE_BATCH a round at most
SIDE_BATCH = 4


@dataclass(frozen=True)
class Verdict:
    """One verdict line: its title, the two sides' names and which candidates each side holds."""

    what: str
    a_name: str
    b_name: str
    a: Callable[[object], bool]
    b: Callable[[object], bool]


def _megatron_tp(c) -> bool:
    """A Megatron TP plan: tensor parallelism without METP, and not an SPPO pipeline. The verdict compares like with
    like, as the --details table does (METP against Megatron TP+SP with the same degrees and policy): an SPPO plan
    runs TP inside its own pipeline of sub-sequences, and is SPPO vs MEMO's side (a review: METP was compared with
    tp8+sp-pp2 sppo at half its throughput while a Megatron TP plan of METP's throughput ranked below it)."""
    return c.sppo is None and c.layout.tp > 1 and not c.layout.metp


METP_VS_MEGATRON = Verdict("METP vs Megatron TP", "METP", "Megatron TP",
                           lambda c: c.sppo is None and bool(c.layout.metp), _megatron_tp)
SPPO_VS_MEMO = Verdict("SPPO vs MEMO", "SPPO", "MEMO",
                       lambda c: c.sppo is not None, lambda c: c.sppo is None and c.policy.takes_alpha)
VERDICTS = (METP_VS_MEGATRON, SPPO_VS_MEMO)


def best_fit(cands, keep: Callable[[object], bool]):
    """The first fitting candidate of ``cands`` (a ranking) that ``keep`` accepts, or None."""
    return next((c for c in cands if c.status == "OK" and keep(c)), None)


def sides(cands, v: Verdict) -> tuple[object, object] | None:
    """The two plans verdict ``v`` compares in the ranking ``cands``, or None without both."""
    a, b = best_fit(cands, v.a), best_fit(cands, v.b)
    return None if a is None or b is None else (a, b)


def analytic_tgs(c) -> float:
    """The candidate's analytic throughput (tier 1): what ``--simulate-top N`` ranks the plans it simulates by."""
    return c.estimate.tgs


# How far below its analytic throughput a plan's simulation may come out, for `likely_next_sides`' guess only:
# SPPO's event simulation against its analytic recurrence (benchmarks/sppo_tiers.py, reports/sppo-tiers.md,
# 2026-11-24: 64 points, the simulated iteration 0.16-1.14% longer). No answer depends on it.
TIERS_GAP = 0.0114


def likely_next_sides(cands, pending: Callable[[object], bool]) -> list:
    """The plans `verdict_sides_to_simulate` is likely to name once the side plans that ``pending`` accepts
    (simulated elsewhere and not known yet: `memo_sim.search.sppo_beside`) are known, for the what-if to simulate
    while it waits for them. For a verdict side whose first fitting plan in the ranking ``cands`` is pending: the
    side's other unsimulated fitting plan of the highest proved throughput bound, where that bound reaches the
    pending plan's analytic throughput less `TIERS_GAP` (the simulation may come out that far below it, and every
    plan whose bound beats the simulated throughput is named then). One a side: a guess the verdict does not
    name costs its simulation where the child ends first. A guess only: the verdict still names what it needs
    from simulated plans, and a guess it does not name is dropped."""
    out: list = []
    for v in VERDICTS:
        pair = sides(cands, v)
        for keep, c in zip((v.a, v.b), pair or ()):
            if c.simulated is not None or not pending(c):
                continue
            floor = analytic_tgs(c) * (1 - TIERS_GAP)
            above = [(tgs_upper_bound(u), i, u) for i, u in enumerate(cands)
                     if u is not c and u.simulated is None and u.status == "OK" and keep(u) and not pending(u)]
            top = max((t for t in above if t[0] >= floor), default=None)
            if top is not None and not any(top[2] is x for x in out):
                out.append(top[2])
    return out


def verdict_sides_to_simulate(cands, bounded: bool = False) -> list:
    """The plans of the verdicts' sides in the ranking ``cands`` that tier 2 has not simulated (each once),
    for the verdicts that have both sides: a side's first fitting plan where it is not simulated, and where it
    is, the side's unsimulated plan whose proved throughput bound (`memo_sim.search.prune.tgs_upper_bound`)
    most exceeds that plan's simulated throughput. The overall search stops at a bound below the best plan of
    all, which a side's own best may lie under: a Megatron TP plan skipped because a METP plan is faster can
    still be the best Megatron TP plan, and the verdict compares each side's best. ``bounded`` False
    (``--simulate-top N``, where the user ranks what tier 2 simulates by the analytic tier): where a side's first
    plan is simulated, the side's best by that ranking (`analytic_tgs`, fitting), if it is not (the README: where a
    side's best plan was left to the analytic tier, by the bound search or by --simulate-top N, the what-if
    simulates it too), so a side's slow simulated plan does not stand for it (a review: under --simulate-top 2 a
    262 tokens/GPU/s simulated plan stood for a side whose analytic best gave 528); a simulation that does not fit
    gives way to the side's next; with ``all`` nothing is left unsimulated."""
    out: list = []

    def add(c) -> None:
        if not any(c is x for x in out):
            out.append(c)

    for v in VERDICTS:
        pair = sides(cands, v)
        for keep, c in zip((v.a, v.b), pair or ()):
            if c.simulated is None:
                add(c)
                continue
            if not bounded:
                top = max((u for u in cands if u.status == "OK" and keep(u)), key=analytic_tgs)
                if top.simulated is None:
                    add(top)
                continue
            above = [(tgs_upper_bound(u), i, u) for i, u in enumerate(cands)
                     if u.simulated is None and u.status == "OK" and keep(u)]
            for _bound, _i, u in sorted(t for t in above if t[0] > c.tgs)[::-1][:SIDE_BATCH]:
                add(u)
    return out


__all__ = ["METP_VS_MEGATRON", "SPPO_VS_MEMO", "TIERS_GAP", "VERDICTS", "VERDICT_ROUNDS", "Verdict", "best_fit",
           "likely_next_sides", "sides", "verdict_sides_to_simulate"]
