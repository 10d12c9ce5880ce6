"""The plan of a what-if candidate, built in one place: `memo-sim whatif` and `memo_sim.api`
both call `build_plan`, so a program gets byte for byte the plan the command writes.

A candidate's own fields give the layout, policy, batch split and predictions
(`Candidate.to_plan`); a policy with a static memory plan (MEMO) also gets its bi-level plan
(`memo_sim.memplan.planner.attach_memory_plan`), which the executor places its transients by.
"""

from __future__ import annotations

from memo_sim.memplan.planner import MEMORY_PLAN_TIME_LIMIT_S, attach_memory_plan
from memo_sim.plan.schema import Plan


def build_plan(candidate, time_limit_s: float = MEMORY_PLAN_TIME_LIMIT_S) -> Plan:
    """The plan.json of ``candidate`` (a `memo_sim.search.whatif.Candidate`)."""
    return attach_memory_plan(candidate.to_plan(), time_limit_s=time_limit_s)
