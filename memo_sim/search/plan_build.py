"""The plan of a what-if candidate, built in one place: `memo-sim whatif` (through
`memo_sim.search.request.WhatifAnswer.plans`), `memo_sim.api.build_plan` and
`Candidate.to_plan` all call `build_plan`, so a program gets byte for byte the plan the command
writes.

A candidate's own fields give the layout, policy, batch split and predictions (`bare_plan`); a
policy with a static memory plan (MEMO) also gets its bi-level plan
(`memo_sim.memplan.planner.attach_memory_plan`), which the executor places its transients by.
"""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.plan.schema import Plan


def build_plan(candidate, time_limit_s: float | None = None) -> Plan:
    """The plan.json of ``candidate`` (a `memo_sim.search.candidate.Candidate`), memory plan
    included (solved within ``time_limit_s``, default `memo_sim.memplan.planner.MEMORY_PLAN_TIME_LIMIT_S`).
    The planner (and numpy with it) is imported here: a what-if that writes no plan never needs it.
    A plan `prebuild_plan` made of the same candidate, with the same fields and limit, is taken
    instead of building it again (once: a second call builds afresh), stamped with this call's time."""
    bare = bare_plan(candidate)
    hit = _PREBUILT.pop(id(candidate), None)
    if hit is not None and hit[0] is candidate and hit[1] == (_unstamped(bare), time_limit_s):
        return replace(hit[2], created=bare.created)
    return attach_memory_plan(bare, time_limit_s=time_limit_s)


# id(candidate) -> (candidate, (its bare plan unstamped, time limit), its plan): what `prebuild_plan` made
_PREBUILT: dict[int, tuple[object, tuple, Plan]] = {}


def _unstamped(plan: Plan) -> Plan:
    """``plan`` without the time it was made (what two builds of one candidate differ in)."""
    return replace(plan, created="")


def prebuild_plan(candidate, time_limit_s: float | None = None) -> None:
    """Build ``candidate``'s plan now, for the `build_plan` of the same candidate later: the what-if
    calls it while it waits for SPPO's simulation in the forked child, on the best plan simulated so
    far (`memo_sim.search.sppo_beside.SppoBeside.take`), so that writing plan.json takes no memory
    plan solve (nor the planner's imports) once the child is done. Where the candidate's fields
    change meanwhile, `build_plan` builds afresh; where another plan turns out best (SPPO's), this
    one was built for nothing, in time this process would otherwise have waited."""
    bare = bare_plan(candidate)
    key = (_unstamped(bare), time_limit_s)
    plan = attach_memory_plan(bare, time_limit_s=time_limit_s)  # fills in the plan it is given
    if len(_PREBUILT) >= 4:
        _PREBUILT.clear()
    _PREBUILT[id(candidate)] = (candidate, key, plan)


def attach_memory_plan(plan: Plan, time_limit_s: float | None = None) -> Plan:
    """`memo_sim.memplan.planner.attach_memory_plan` with the plan's own schedule: under a micro-batch
    pipeline each rank's order (`stage_order_of`) for its level 2 (what `memo_sim.api` exports)."""
    from memo_sim.memplan import planner

    limit = planner.MEMORY_PLAN_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    return planner.attach_memory_plan(plan, time_limit_s=limit, stage_order=stage_order_of(plan))


def stage_order_of(plan: Plan):
    """``rank -> that rank's order`` of a plan's micro-batch pipeline (1F1B, interleaved 1F1B), for its
    per-rank memory plan; None for a plan in one stage or a pipeline over subsequences (SPPO)."""
    from memo_sim.engine.schedules.microbatch import micro_batch_pipelines, pipeline_order

    if plan.layout.pp == 1 or plan.schedule not in micro_batch_pipelines():
        return None
    order = pipeline_order(plan.schedule)
    lay, m = plan.layout, plan.micro_batches
    return lambda rank: order(lay.pp, m, lay.vpp, rank)


def bare_plan(c, classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> Plan:
    """The plan of candidate ``c`` without its memory plan: layout, policy, batch split, and the
    predictions (the simulator's where tier 2 ran, else the analytic ones)."""
    e = c.estimate
    sim = c.simulated
    predicted = {
        "source": "simulated" if sim else "analytic",
        "status": c.status,
        "iteration_s": sim["iteration_s"] if sim else e.iteration_s,
        "mfu": sim["mfu"] if sim else e.mfu,
        "tgs_tokens_per_gpu_s": sim["tgs_tokens_per_gpu_s"] if sim else e.tgs,
        "peak_gpu_bytes": sim["peak_gpu_bytes"] if sim else c.memory.peak_gpu_bytes,
        "peak_host_bytes_per_node": sim["peak_host_bytes_per_node"] if sim else c.memory.host_bytes_per_node,
        "exposed_copy_s": sim["exposed_copy_s"] if sim else e.exposed_copy_s,
        "analytic_iteration_s": e.iteration_s,
        "memory_breakdown_bytes": {k: v for k, v in c.memory.to_dict().items() if k != "status"},
        # a simulated peak no caching-allocator replay reserved (a pipeline's summed allocations), so that what reads
        # the plan names it as the what-if did (`memo_sim.report.peaks.planned_peak`)
        **({"allocator": {"replayed": False}} if sim and (sim.get("allocator") or {}).get("replayed") is False
           else {}),
    }
    timings = dict(sim["layer_timings_s"]) if sim and "layer_timings_s" in sim else e.layer.to_dict()
    return Plan(model=c.model, batch=c.batch, seq_tokens=c.seq, gpus=c.layout.gpus,
                layout=c.layout, policy=c.policy, profile=c.profile.name, predicted=predicted,
                layer_timings_s=timings, classifier_chunk_tokens=classifier_chunk_tokens,
                schedule=c.schedule, micro_batch=c.micro_batch)
