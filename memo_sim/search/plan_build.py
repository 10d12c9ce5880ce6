"""The plan of a what-if candidate, built in one place: `memo-sim whatif` and `memo_sim.api`
both call `build_plan`, so a program gets byte for byte the plan the command writes.

A candidate's own fields give the layout, policy, batch split and predictions
(`Candidate.to_plan`); a policy with a static memory plan (MEMO) also gets its bi-level plan
(`memo_sim.memplan.planner.plan_memory`), which the executor places its transients by.
"""

from __future__ import annotations

from memo_sim.memplan.planner import plan_memory
from memo_sim.plan.schema import Plan

MEMORY_PLAN_TIME_LIMIT_S = 10.0  # per DSA solve of the bi-level plan (three solves)


def build_plan(candidate, time_limit_s: float = MEMORY_PLAN_TIME_LIMIT_S) -> Plan:
    """The plan.json of ``candidate`` (a `memo_sim.search.whatif.Candidate`)."""
    plan = candidate.to_plan()
    if plan.policy.static_memory_plan and plan.layout.pp == 1:  # one micro-batch's plan of one stage
        plan.memory_plan = plan_memory(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, plan.policy,
                                       time_limit_s=time_limit_s,
                                       classifier_chunk_tokens=plan.classifier_chunk_tokens).to_plan_json()
    return plan
