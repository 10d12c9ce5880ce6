"""Solving one point (partition, alphas, memory, estimate), its cheap bound for the branch and
bound, the memory floor that prunes a point outright, and the best point of one fixed layout."""

from __future__ import annotations

from dataclasses import replace

from memo_sim.cost.memo import memoised
from memo_sim.cost.sppo import (
    stage_gpu_shard,
    kv_cache_bytes,
    sequence_aware_alphas,
    stage_model_state_bytes,
)
from memo_sim.errors import MemoError
from memo_sim.layout.alloc_conf import gpu_limit_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.schema import HardwareProfile
from memo_sim.search.sppo.alphas import overlap_threshold, solve_alphas
from memo_sim.search.sppo.estimate import _active, estimate_sppo
from memo_sim.search.sppo.grid import edge_subseqs, search_points
from memo_sim.search.sppo.points import (
    BOUND_QUANTUM,
    BOUND_SLACK,
    SppoPoint,
    _rank_key,
)


# ------------------------------------------------------------------------------------------ points
def solve_point(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile, subseqs: int,
                partition: str = "flops", multiplex: bool = False, bounds: tuple[int, ...] | None = None,
                lower_bound: float | None = None, threshold: float | None = None) -> SppoPoint:
    """Solve one point: partition, alphas, memory, estimate. Raises `MemoError` where the point
    cannot exist (the sequence does not split into N SP-divisible subsequences). ``threshold``:
    the point's overlap threshold where the caller has it already (the bounding pass's,
    `_lower_bound`: the same bytes `overlap_threshold` gives for these bounds and this layout)."""
    pol = Sppo(None, subseqs=subseqs, bounds=tuple(bounds) if bounds else (), partition=partition,
               multiplex=multiplex and layout.pp > 1)
    pol = pol.with_bounds(model, layout, batch, seq)
    pol, ac, mem = solve_alphas(model, layout, batch, seq, pol, profile, threshold=threshold)
    est, grid = estimate_sppo(model, layout, batch, seq, pol, profile)
    return SppoPoint(layout, pol, est, mem, ac, est.iteration_s if lower_bound is None else lower_bound, grid)


def _lower_bound(model, layout, batch, seq, profile, subseqs, partition, multiplex) -> tuple[float, Sppo] | None:
    """(the estimate with the overlap-threshold alphas, that plan), or None where the point cannot
    exist or certainly overflows the GPU (`memory_floor`)."""
    pol = bound_plan(model, layout, batch, seq, profile, subseqs, partition, multiplex)
    if pol is None:
        return None
    est = estimate_sppo(model, layout, batch, seq, pol, profile, quantum=BOUND_QUANTUM)[0].iteration_s
    return est * (1 - BOUND_SLACK), pol


def point_alive(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile, subseqs: int,
                partition: str) -> bool:
    """Whether `bound_plan` gives a plan: the sequence splits so and the memory floor fits the GPU."""
    return _fitting_partition(model, layout, batch, seq, profile, subseqs, partition) is not None


def _fitting_partition(model, layout, batch, seq, profile, subseqs, partition) -> Sppo | None:
    """The unmultiplexed plan with its subsequence bounds, or None where the sequence does not split
    so or the memory floor (`memory_floor`) overflows the GPU."""
    pol = _partition(model, stage_gpu_shard(layout), batch, seq, subseqs, partition)
    return pol if pol is not None and memory_floor(model, layout, batch, pol) <= gpu_limit_bytes(profile, layout.alloc_conf) else None


def bound_plan(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile, subseqs: int,
               partition: str, multiplex: bool, threshold: float | None = None) -> Sppo | None:
    """The plan `_lower_bound` prices (the partition with the overlap-threshold alphas), or None
    where the point cannot exist or certainly overflows the GPU. ``threshold``: its overlap
    threshold where it is known (a plan's ``threshold_bytes``, from another process that priced the
    point: `memo_sim.search.sppo.shared_bounds`); the plan is then rebuilt without timing a piece."""
    pol = _fitting_partition(model, layout, batch, seq, profile, subseqs, partition)
    if pol is None:
        return None
    pol = _overlap_alphas(model, stage_gpu_shard(layout), _active(layout, profile), batch, profile, pol, threshold)
    if multiplex and layout.pp > 1:
        pol = replace(pol, multiplex=True)
    return pol


@memoised()
def _partition(model: ModelConfig, shard: Layout, batch: int, seq: int, subseqs: int, partition: str) -> Sppo | None:
    """The unmultiplexed plan with its subsequence bounds (None where the sequence does not split
    so), memoised: every pipeline depth and ZeRO stage of a TP+SP shard shares it."""
    try:
        return Sppo(None, subseqs=subseqs, partition=partition).with_bounds(model, shard, batch, seq)
    except MemoError:
        return None


@memoised()
def _overlap_alphas(model: ModelConfig, shard: Layout, active: int, batch: int, profile: HardwareProfile,
                    pol: Sppo, threshold: float | None = None) -> Sppo:
    """``pol`` with its overlap-threshold alphas (`overlap_threshold`, or ``threshold`` where the
    caller knows it), memoised like `_partition`: the threshold depends on the shard, the bounds
    and how many GPUs of a node copy at once."""
    m = overlap_threshold(model, shard, batch, pol, profile, active) if threshold is None else threshold
    a_i = pol.subsequence_offloadable(model, shard, batch)
    return replace(pol, alphas=sequence_aware_alphas(a_i, m), threshold_bytes=m)


def memory_floor(model: ModelConfig, layout: Layout, batch: int, policy: Sppo) -> float:
    """Bytes the fullest stage certainly holds at the end of its last piece's backward, whatever
    the alphas: its model states, the K/V cache of every earlier subsequence in each of its layers
    and as many bytes of dK/dV accumulators (a lower bound used to prune)."""
    n_l = model.layers // layout.pp
    kv = kv_cache_bytes(model, stage_gpu_shard(layout), batch, policy.bounds[-2]) if policy.subseqs > 1 else 0.0
    return _fullest_stage_states(model, layout) + 2 * n_l * kv


@memoised()
def _fullest_stage_states(model: ModelConfig, layout: Layout) -> float:
    """The largest model-state bytes of one GPU of any stage (every N, partition and multiplexing of
    a layout asks again)."""
    return max(stage_model_state_bytes(model, layout, s) for s in range(layout.pp))


def resolve_for_layout(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                       subseqs: int | None = None, multiplex: bool | None = None) -> SppoPoint:
    """The best SPPO point for one fixed layout: for commands that hold the layout (sweep-seq, sweep-layouts, a what-if
    with a fixed layout). It searches the what-if's points of the layout (`search_points`: N over `subseq_grid`, both
    partitions, multiplexing off and on; ``subseqs`` / ``multiplex`` fix them) and ranks them as the what-if does
    (`_rank_key`), so that a plan the what-if wrote (plan-sppo.json) comes back with its N at its own length. Every
    point whose memory floor fits (`point_alive`, the points the what-if's branch and bound prices) is solved: on one
    layout the branch and bound (`memo_sim.search.sppo.exhaustive.exhaustive_search`) finds the same best, since an
    unsolved point's estimate is at least its bound, and this module cannot call it (it builds on this one). Where
    no point's floor fits, every point is solved, so that the length reads as out of memory (its least-over point),
    not as refused. A review: this searched the heuristic's N only (seq/(N*SP) in 2K-16K, `efficient_subseqs`), FLOPs
    partitions only, and sweep-seq gave gpt-7b's tp8+sp-pp4 plan N=64 at 1M (177.72 s analytic) where the what-if
    had chosen N=128 (175.77 s)."""
    if layout.pp > 1 and (layout.cp > 1 or layout.ulysses > 1):
        raise MemoError(f"sppo: {layout.label()}: pipeline stages use TP+SP only")
    why = Sppo(None).check(model, layout, batch, seq)
    if why and "not solved" not in why:
        raise MemoError(f"sppo: {layout.label()}: {why}")
    muxes = (multiplex,) if multiplex is not None else (False, True)
    points = search_points(layout, seq, subseqs, multiplex=muxes)
    best: SppoPoint | None = None

    def solve_all(points: list, fallback: bool) -> None:
        nonlocal best
        alive = [p for p in points if point_alive(model, layout, batch, seq, profile, p[0], p[1])]
        for n, part, mux in alive or (points if fallback else []):
            try:
                pt = solve_point(model, layout, batch, seq, profile, n, part, mux)
            except MemoError:
                continue
            if best is None or _rank_key(pt) < _rank_key(best):
                best = pt

    solve_all(points, True)
    # past the grid's edge while the best fitting point sits on it (`edge_subseqs`), as the what-if's branch and
    # bound extends it
    top = max((n for n, _p, _m in points), default=0)
    while best is not None and best.status == "OK":
        n = edge_subseqs(best.policy.subseqs, top, subseqs)
        if n is None:
            break
        top = n
        solve_all(search_points(layout, seq, top, multiplex=muxes), False)
    if best is None:
        raise MemoError(f"sppo: {seq} tokens do not split into subsequences for {layout.label()}")
    return best
