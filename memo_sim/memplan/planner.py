"""MEMO's bi-level memory plan (paper sec. 4.2) on top of `solve_dsa`.

Level 1 solves one layer's forward and one layer's backward transient traces; every layer
reuses those addresses. Level 2 replaces each layer phase by a pseudo block of the level-1
peak and solves the whole model (embedding, n layers, classifier, skeletal blocks by policy).
Because skeletal blocks live from a layer's forward to its backward, the whole-model plan is
judged against the whole-trace max-live bound, not per layer.

Under a micro-batch pipeline level 1 is the same (a stage runs one layer phase at a time) and
level 2 is solved per pipeline rank over the micro-batches it holds in flight, in its schedule's
order (`memo_sim.memplan.stage_plan`); the rank's order is the caller's (the schedules live in the
engine, above this module): ``stage_order(stage)`` gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.solve import DSASolution, solve_dsa
from memo_sim.request_trace import RequestTrace
from memo_sim.memplan.stage_plan import StageStep, stage_model_trace
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, model_trace, placed_only, unplaced_in
from memo_sim.memplan.placement_check import check_placement
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy


@dataclass(frozen=True)
class StageLevel:
    """Level 2 of one pipeline rank: its trace and the solution placing it."""

    stage: int
    solution: DSASolution
    trace: RequestTrace

    def to_plan_json(self) -> dict:
        sol = self.solution
        return {"stage": self.stage, "arena_bytes": int(sol.peak_bytes), "lower_bound_bytes": int(sol.lower_bound_bytes),
                "method": sol.method, "solve_time_s": sol.solve_time_s,
                "offsets": {k: int(v) for k, v in sol.offsets.items()}}


@dataclass
class BiLevelPlan:
    fwd: DSASolution
    bwd: DSASolution
    model: DSASolution | None  # level 2 of a run in one pass; None under a pipeline (``stages``)
    fwd_trace: RequestTrace  # the tensors level 1 places (the arena's); `unplaced` names the others
    bwd_trace: RequestTrace
    model_trace: RequestTrace | None
    unplaced: dict[str, dict[str, str]] | None = None  # phase -> tensor -> why the runtime places it elsewhere
    stages: tuple[StageLevel, ...] = ()  # a micro-batch pipeline: level 2 per rank

    @property
    def arena_bytes(self) -> int:
        """Level 2's arena: the whole model's, or the largest pipeline rank's."""
        if self.model is not None:
            return int(self.model.peak_bytes)
        return max(int(s.solution.peak_bytes) for s in self.stages)

    def to_plan_json(self) -> dict:
        """The ``memory_plan`` slot of plan.json: offsets by tensor name per phase, arena size."""
        def phase(sol: DSASolution, trace: RequestTrace, ph: str) -> dict:
            names = {b.id: (b.name or b.id) for b in trace.buffers}
            return {"peak_bytes": int(sol.peak_bytes), "lower_bound_bytes": int(sol.lower_bound_bytes),
                    "method": sol.method, "solve_time_s": sol.solve_time_s,
                    "offsets": {names[i]: int(o) for i, o in sol.offsets.items()},
                    "unplaced": dict((self.unplaced or {}).get(ph) or unplaced_in(trace, ph))}

        phases = {"fwd": phase(self.fwd, self.fwd_trace, "fwd"), "bwd": phase(self.bwd, self.bwd_trace, "bwd")}
        if self.model is None:
            return {"arena_bytes": self.arena_bytes,
                    "lower_bound_bytes": max(int(s.solution.lower_bound_bytes) for s in self.stages),
                    "phases": phases, "stages": [s.to_plan_json() for s in self.stages]}
        layer_base = {b.id: int(self.model.offsets[b.id]) for b in self.model_trace.buffers if b.kind == "pseudo"}
        return {"arena_bytes": self.arena_bytes,
                "lower_bound_bytes": int(self.model.lower_bound_bytes),
                "phases": phases,
                "layer_block_offsets": layer_base,
                "model_offsets": {k: int(v) for k, v in self.model.offsets.items()}}

    def summary(self) -> dict:
        def one(sol: DSASolution) -> dict:
            return {"peak_bytes": int(sol.peak_bytes), "lower_bound_bytes": int(sol.lower_bound_bytes),
                    "gap": sol.gap, "solve_time_s": sol.solve_time_s, "method": sol.method,
                    "proven_optimal": sol.proven_optimal}
        out = {"level1_fwd": one(self.fwd), "level1_bwd": one(self.bwd)}
        if self.model is not None:
            out["level2_model"] = one(self.model)
        for s in self.stages:
            out[f"level2_stage{s.stage}"] = one(s.solution)
        return out


def plan_memory(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy, *,
                time_limit_s: float = 10.0, solver: str = "auto", classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS,
                progress=None, stage_order: Callable[[int], Sequence[StageStep]] | None = None) -> BiLevelPlan:
    """The bi-level plan of one micro-batch of ``batch`` sequences. With ``layout.pp > 1`` level 2 is
    solved per pipeline rank over ``stage_order(rank)`` (required then), each rank's solver given
    ``time_limit_s / pp`` (at least 1 s): the ranks' plans are independent."""
    ft_all = layer_forward_trace(model, layout, batch, seq)
    bt_all = layer_backward_trace(model, layout, batch, seq, policy)
    ft, bt = placed_only(ft_all, "fwd"), placed_only(bt_all, "bwd")
    f = solve_dsa(ft, time_limit_s=time_limit_s, solver=solver, progress=progress)
    b = solve_dsa(bt, time_limit_s=time_limit_s, solver=solver, progress=progress)
    unplaced = {"fwd": unplaced_in(ft_all, "fwd"), "bwd": unplaced_in(bt_all, "bwd")}
    for sol, tr in ((f, ft), (b, bt)):
        check_placement(tr, sol.offsets, int(sol.peak_bytes))
    if layout.pp > 1:
        if stage_order is None:
            raise MemoError(f"a memory plan of a {layout.pp}-stage pipeline needs each stage's schedule order")
        stages = []
        for s in range(layout.pp):
            st = stage_model_trace(model, layout, batch, seq, policy, int(f.peak_bytes), int(b.peak_bytes),
                                   list(stage_order(s)), s, classifier_chunk_tokens)
            sol = solve_dsa(st, time_limit_s=max(1.0, time_limit_s / layout.pp), solver=solver, progress=progress)
            check_placement(st, sol.offsets, int(sol.peak_bytes))
            stages.append(StageLevel(s, sol, st))
        return BiLevelPlan(f, b, None, ft, bt, None, unplaced, tuple(stages))
    mt = model_trace(model, layout, batch, seq, policy, int(f.peak_bytes), int(b.peak_bytes), classifier_chunk_tokens)
    m = solve_dsa(mt, time_limit_s=time_limit_s, solver=solver, progress=progress)
    check_placement(mt, m.offsets, int(m.peak_bytes))
    return BiLevelPlan(f, b, m, ft, bt, mt, unplaced)


MEMORY_PLAN_TIME_LIMIT_S = 10.0  # what `memo-sim whatif` and `memo-exec validate` give each level's solver


def attach_memory_plan(plan, *, time_limit_s: float = MEMORY_PLAN_TIME_LIMIT_S,
                       stage_order: Callable[[int], Sequence[StageStep]] | None = None):
    """Give ``plan`` (a `memo_sim.plan.schema.Plan`) whose policy places its transient tensors by a
    static plan (MEMO) its bi-level memory plan, the ``memory_plan`` slot of plan.json; a plan of
    another policy is left as it is. A plan with a pipeline (``layout.pp > 1``) gets one only with
    ``stage_order`` (each rank's order of its schedule: `memo_sim.search.plan_build` passes it; SPPO's
    pipelines over subsequences have no such order and no static plan). Returns the plan."""
    if plan.policy.static_memory_plan and (plan.layout.pp == 1 or stage_order is not None):
        plan.memory_plan = plan_memory(plan.model, plan.layout, plan.micro_batch, plan.seq_tokens, plan.policy,
                                       time_limit_s=time_limit_s,
                                       classifier_chunk_tokens=plan.classifier_chunk_tokens,
                                       stage_order=stage_order).to_plan_json()
    return plan
