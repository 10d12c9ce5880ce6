"""The simulator's public API, for programs that close the loop around it (the executor's
``validate``, ``calibrate``, ``trace`` and its report's re-prediction, benchmarks, notebooks).

Everything here is stable across internal moves; import from here rather than from the
packages inside memo_sim.
"""

from memo_sim.engine.schedules import registered_schedules
from memo_sim.engine.simulate import SimResult, entry_arguments, simulate, sweep_alpha
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
from dataclasses import MISSING, fields

from memo_sim.search.estimate import IterationEstimate, estimate_pipeline, memo_alpha
from memo_sim.search.estimate import estimate_iteration as _estimate_iteration
from memo_sim.search.maxseq import MAXSEQ_DEGREES, MaxSeqAnswer, max_seq_runs, maxseq_fixed, maxseq_runs_asked
from memo_sim.search.pipeline import pipeline_memory
from memo_sim.search.plan_build import attach_memory_plan, build_plan
from memo_sim.search.plan_check import plan_problems, runnable_problems, traced_by_executor
from memo_sim.search.request import WhatifAnswer, WhatifRequest, answer_whatif, in_request_words
from memo_sim.report.whatif_json import whatif_json
from memo_sim.search.sppo import SppoPoint, SppoSearch, search_sppo, solve_point
from memo_sim.search.whatif import (Candidate, WhatIfResult, candidates_for, default_jobs, fold_duplicates, rank,
                                    simulate_candidates)
from memo_sim.policy.sppo import Sppo
from memo_sim.cost.sppo import multiplex_phases, partition_bounds
from memo_sim.cost.collectives import fit_params as collective_fit_params
from memo_sim.cost.attention_measured import pricing_words as attention_pricing_words
from memo_sim.cost.loss_kernels import loss_kernel
from memo_sim.cost.gemm_format import MIN_CAPABILITY as GEMM_MIN_CAPABILITY, check_gemm_format
from memo_sim.timeline import Timeline, TimelineEvent
from memo_sim.errors import MemoError

__all__ = [
    "Buffer", "RequestTrace", "greedy_trace",
    "BiLevelPlan", "Candidate", "HardwareProfile", "IterationEstimate", "Layout", "MemoryBreakdown", "ModelConfig",
    "Plan", "Policy", "SimResult", "Timeline", "TimelineEvent", "WhatIfResult", "candidates_for", "check_layout",
    "attach_memory_plan", "engine_replay", "estimate_iteration", "get_model", "get_policy", "load_profile", "memo_alpha", "memory_breakdown", "plan_memory",
    "policy_names", "rank", "read_plan", "simulate", "simulate_candidates", "sweep_alpha", "write_plan",
    "default_jobs", "fold_duplicates", "build_plan", "plan_problems", "runnable_problems", "traced_by_executor",
    "WhatifAnswer", "WhatifRequest", "answer_whatif", "whatif", "whatif_json", "MaxSeqAnswer", "max_seq",
    "SCHEDULE_NAMES", "check_schedule", "default_schedule", "estimate_pipeline", "pipeline_memory",
    "registered_schedules", "collective_fit_params", "attention_pricing_words", "loss_kernel",
    "Sppo", "SppoPoint", "SppoSearch", "multiplex_phases", "partition_bounds", "search_sppo", "solve_point",
    "sppo_memory", "GEMM_MIN_CAPABILITY",
]


def whatif(request: WhatifRequest, progress=None) -> WhatifAnswer:
    """The answer `memo-sim whatif` gives to ``request``: ``whatif(req).plans()["plan.json"]``
    (or ``whatif(req).best.to_plan()``) is byte for byte the plan.json the command writes for
    the same question. A request the search refuses raises one `MemoError` naming the request's fields
    (``WhatifRequest: tp=3 does not divide the 8 GPUs of gpus``) where the command names its options (``--tp``)."""
    if not isinstance(request, WhatifRequest):
        raise MemoError(f"whatif: request is a {type(request).__name__}, not a WhatifRequest; pass "
                        f"memo_sim.api.WhatifRequest(model=..., seq=..., gpus=..., profile=...)")
    try:
        return answer_whatif(request, progress=progress)
    except MemoError as e:  # the search's words are the command's (--tp): the request's fields instead
        e.args = (in_request_words(str(e)),)
        raise


# the request's fields a maxseq question reads (`memo-sim maxseq`'s options); every other must keep its default
MAXSEQ_FIELDS = ("model", "seq", "gpus", "profile", "policies", "framework", "allocator", "alloc_conf",
                 "kernel_fusion", "attention", "grad_overlap", "tp_mode",
                 "moe_dispatcher", "moe_balance", "jobs", *MAXSEQ_DEGREES)


def max_seq(request: WhatifRequest, progress=None) -> list[MaxSeqAnswer]:
    """The answers `memo-sim maxseq` gives, one per policy of ``request.policies`` (default: the framework's that
    price the model, but sppo) and allocator (``both``: the caching allocator's and a static plan's): the longest
    multiple of ``request.seq`` tokens (the command's ``--step``) the policy trains on ``request.gpus`` GPUs
    (``answer.max_seq``; None: not even ``request.seq`` fits), its best plan there (``answer.best``, whose
    ``to_plan()`` is the plan to run) and what binds at the next length (``answer.binding``). The layout fields (tp,
    cp, ulysses, dp, zero, sp, pp, optimizer_offload, ep, etp, tp_mode, moe_dispatcher, moe_balance, alloc_conf,
    kernel_fusion, attention, grad_overlap) fix the layout as the command's options do; a field the command has no option for (batch,
    micro_batch, alpha, vpp, schedules, ...) must keep its default, or one `MemoError` names it. ``request.jobs``
    answers the policies in that many processes (the serial answers); ``progress()`` is called as each finishes."""
    if not isinstance(request, WhatifRequest):
        raise MemoError(f"max_seq: request is a {type(request).__name__}, not a WhatifRequest; pass "
                        f"memo_sim.api.WhatifRequest(model=..., seq=STEP, gpus=..., profile=...)")
    for f in fields(WhatifRequest):
        if f.name in MAXSEQ_FIELDS:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        if getattr(request, f.name) != default:
            raise MemoError(f"max_seq: WhatifRequest.{f.name} = {getattr(request, f.name)!r}: maxseq does not take "
                            f"it (`memo-sim maxseq` has no such option: it searches the what-if's default for it); "
                            f"leave it at {default!r}, or ask memo_sim.api.whatif at one length")
    if request.allocator not in ("caching", "plan", "both"):  # (the search's own check says "one answer")
        raise MemoError(f"max_seq: WhatifRequest.allocator = {request.allocator!r}: give caching, plan or both")
    model, profile = request.model, request.profile
    try:
        profile.peak(model.dtype)  # a clear error if the profile has no peak for the model's dtype
        check_gemm_format(model, profile)
        fixed = maxseq_fixed(request.tp_mode, request.moe_dispatcher, request.moe_balance, request.alloc_conf,
                             request.kernel_fusion, request.attention, request.grad_overlap,
                             **{k: getattr(request, k) for k in MAXSEQ_DEGREES})
        runs = maxseq_runs_asked(model, request.framework, request.policies, request.allocator)
        return max_seq_runs(model, request.gpus, profile, runs, step=request.seq, framework=request.framework,
                            fixed=fixed, jobs=request.jobs, done=progress or (lambda: None))
    except MemoError as e:  # the search's words are the command's (--tp): the request's fields instead
        e.args = (in_request_words(str(e)),)
        raise


def estimate_iteration(model: ModelConfig | str, layout: Layout, batch: int, seq: int, policy: Policy | str,
                       profile: HardwareProfile | str, micro_batch: int | None = None) -> IterationEstimate:
    """The analytic (tier 1) estimate of one single-stage iteration (`memo_sim.search.estimate.estimate_iteration`):
    ``batch`` sequences per data-parallel replica of ``seq`` tokens, in micro-batches of ``micro_batch`` sequences
    (default: the whole batch). ``model``, ``policy`` and ``profile`` may be given by name, as `simulate` takes them.

    Checked once here, as `simulate` and the what-if check them (the search calls the estimate itself, unchecked):
    batch, seq and micro_batch whole numbers of at least 1 (micro_batch dividing batch), a layout of whole degrees
    of at least 1 that `check_layout` accepts for the model on ``layout.gpus`` GPUs of the profile's nodes, without
    pipeline stages (`estimate_pipeline` prices those), and a policy that runs the model and layout in the single
    stage. Anything else raises one `MemoError` naming the argument and the fix."""
    model, layout, batch, seq, policy, profile, micro_batch = entry_arguments(
        "estimate_iteration", model, layout, batch, seq, policy, profile, micro_batch)
    mb = batch if micro_batch is None else micro_batch
    if batch % mb:
        raise MemoError(f"estimate_iteration: micro_batch = {mb} does not divide batch = {batch}; give a divisor of "
                        f"the batch (sequences), or None for the whole batch")
    if layout.pp > 1:
        raise MemoError(f"estimate_iteration: layout.pp = {layout.pp}: this estimate prices the single stage; use "
                        f"memo_sim.api.estimate_pipeline for pipeline stages, or pp=1")
    if default_schedule(layout.pp, policy.name) != "single_stage":
        raise MemoError(f"estimate_iteration: policy {policy.label()} runs the {default_schedule(1, policy.name)} "
                        f"schedule, not the single stage; use memo_sim.api.solve_point / search_sppo for it")
    why = check_layout(layout, model, layout.gpus, profile.node_gpus, seq, mb, metp_across_nodes=True) or \
        policy.model_why_not(model) or policy.layout_why_not(layout)
    if why:
        raise MemoError(f"estimate_iteration: layout {layout.label()} {policy.label()} on {profile.name}: {why}")
    return _estimate_iteration(model, layout, batch, seq, policy, profile, micro_batch=micro_batch)
