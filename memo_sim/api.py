"""The simulator's public API, for programs that close the loop around it (the executor's
``validate``, ``calibrate``, ``trace`` and its report's re-prediction, benchmarks, notebooks).

Everything here is stable across internal moves; import from here rather than from the
packages inside memo_sim.
"""

from memo_sim.engine.schedules import registered_schedules
from memo_sim.engine.simulate import SimResult, simulate, sweep_alpha
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.layout.schedule import SCHEDULE_NAMES, check_schedule, default_schedule
from memo_sim.memplan.footprint import MemoryBreakdown, memory_breakdown, sppo_memory
from memo_sim.memplan.greedy import greedy_trace
from memo_sim.memplan.iteration_replay import engine_replay
from memo_sim.memplan.planner import BiLevelPlan, plan_memory
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.plan.schema import Plan, read_plan, write_plan
from memo_sim.policy import Policy, get_policy, policy_names
from memo_sim.profile.loader import load_profile
from memo_sim.profile.schema import HardwareProfile
from memo_sim.request_trace import Buffer, RequestTrace
from memo_sim.search.estimate import IterationEstimate, estimate_iteration, estimate_pipeline, memo_alpha
from memo_sim.search.pipeline import pipeline_memory
from memo_sim.search.plan_build import attach_memory_plan, build_plan
from memo_sim.search.plan_check import plan_problems, runnable_problems, traced_by_executor
from memo_sim.search.request import WhatifAnswer, WhatifRequest, answer_whatif
from memo_sim.search.sppo import SppoPoint, SppoSearch, search_sppo, solve_point
from memo_sim.search.whatif import (Candidate, WhatIfResult, candidates_for, default_jobs, fold_duplicates, rank,
                                    simulate_candidates)
from memo_sim.policy.sppo import Sppo
from memo_sim.cost.sppo import multiplex_phases, partition_bounds
from memo_sim.cost.collectives import fit_params as collective_fit_params
from memo_sim.cost.attention_measured import pricing_words as attention_pricing_words
from memo_sim.cost.loss_kernels import loss_kernel
from memo_sim.cost.gemm_format import MIN_CAPABILITY as GEMM_MIN_CAPABILITY
from memo_sim.timeline import Timeline, TimelineEvent

__all__ = [
    "Buffer", "RequestTrace", "greedy_trace",
    "BiLevelPlan", "Candidate", "HardwareProfile", "IterationEstimate", "Layout", "MemoryBreakdown", "ModelConfig",
    "Plan", "Policy", "SimResult", "Timeline", "TimelineEvent", "WhatIfResult", "candidates_for", "check_layout",
    "attach_memory_plan", "engine_replay", "estimate_iteration", "get_model", "get_policy", "load_profile", "memo_alpha", "memory_breakdown", "plan_memory",
    "policy_names", "rank", "read_plan", "simulate", "simulate_candidates", "sweep_alpha", "write_plan",
    "default_jobs", "fold_duplicates", "build_plan", "plan_problems", "runnable_problems", "traced_by_executor",
    "WhatifAnswer", "WhatifRequest", "answer_whatif", "whatif",
    "SCHEDULE_NAMES", "check_schedule", "default_schedule", "estimate_pipeline", "pipeline_memory",
    "registered_schedules", "collective_fit_params", "attention_pricing_words", "loss_kernel",
    "Sppo", "SppoPoint", "SppoSearch", "multiplex_phases", "partition_bounds", "search_sppo", "solve_point",
    "sppo_memory", "GEMM_MIN_CAPABILITY",
]


def whatif(request: WhatifRequest, progress=None) -> WhatifAnswer:
    """The answer `memo-sim whatif` gives to ``request``: ``whatif(req).plans()["plan.json"]``
    (or ``whatif(req).best.to_plan()``) is byte for byte the plan.json the command writes for
    the same question."""
    return answer_whatif(request, progress=progress)
