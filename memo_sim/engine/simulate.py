"""Simulate one training iteration: `simulate` and `sweep_alpha`.

A pipelined policy (SPPO, ``policy.pipelined``) is scheduled by `memo_sim.engine.pipeline`, one
representative device per stage (`simulate_pipeline`, which `simulate` calls for it).

``batch`` is sequences per data-parallel replica (what `memo_sim.cost.activations` splits across
a replica's GPUs), so an iteration trains ``batch x dp`` sequences; MFU and TGS count them all.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterable

from memo_sim.model.flops import mfu as mfu_of, tgs as tgs_of
from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.engine.core import Engine, EngineRun, Failure
from memo_sim.engine.graph import Op, OpGraph
from memo_sim.engine.periodic import Fold, plan_fold, unfold
from memo_sim.engine.schedules import Schedule, build_iteration, layer_signature, middle_layer
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.iteration_replay import replay_iteration
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy
from memo_sim.policy.registry import get_policy
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import COPY_STREAMS, TP_RING_STREAMS, Timeline, TimelineEvent

DEFAULT_ALPHAS = tuple(i / 8 for i in range(9))  # 0, 0.125, ..., 1

Progress = Callable[[int, int], None]  # (done, total)


@dataclass
class SimResult:
    """One simulated iteration. ``iteration_s``, ``mfu`` and ``tgs`` are None when the run
    failed (status OOM / OOHM; ``failure`` says when, which tensor and how much)."""

    model: ModelConfig
    layout: Layout
    batch: int
    seq: int
    policy: Policy
    profile: str
    status: str  # OK | OOM | OOHM
    iteration_s: float | None
    mfu: float | None
    tgs: float | None
    peak_gpu_bytes: float
    peak_host_bytes_per_node: float
    gpu_capacity_bytes: float
    host_capacity_bytes: float
    exposed_copy_s: float  # compute-path time spent waiting for host copies
    layer_timings: dict[str, float]  # forward, backward, recompute, offload, prefetch of one middle layer
    timeline: Timeline | None
    failure: Failure | None = None
    contention: bool = True
    sim_wall_s: float = 0.0  # host seconds the simulation took
    n_ops: int = 0
    start_gpu_bytes: float = 0.0
    end_gpu_bytes: float = 0.0
    end_host_bytes: float = 0.0
    link_log: list = field(default_factory=list)
    link_capacity: dict = field(default_factory=dict)
    link_carried: dict = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    allocator: dict = field(default_factory=dict)  # caching-allocator replay of unplanned policies
    exposed_p2p_s: float = 0.0  # time waiting on METP's ring transfers beyond the compute they overlap
    pipeline: dict = field(default_factory=dict)  # SPPO: stages, pieces, per-stage peaks and bubbles
    folded: int = 0  # layers not simulated but unfolded from a periodic short run (`memo_sim.engine.periodic`);
    # a folded run that failed keeps no ``link_carried`` (its flows stopped half way)

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    def to_dict(self) -> dict:
        """Summary in the keys the what-if and plan.json use (units in key names), no timeline."""
        return {
            "status": self.status,
            "iteration_s": self.iteration_s,
            "mfu": self.mfu,
            "tgs_tokens_per_gpu_s": self.tgs,
            "peak_gpu_bytes": self.peak_gpu_bytes,
            "peak_host_bytes_per_node": self.peak_host_bytes_per_node,
            "gpu_capacity_bytes": self.gpu_capacity_bytes,
            "host_capacity_bytes": self.host_capacity_bytes,
            "exposed_copy_s": self.exposed_copy_s,
            "exposed_p2p_s": self.exposed_p2p_s,
            "layer_timings_s": dict(self.layer_timings),
            "failure": self.failure.to_dict() if self.failure else None,
            "allocator": dict(self.allocator),
            "contention": self.contention,
            "sim_wall_s": self.sim_wall_s,
            "policy": self.policy.to_dict(),
            "layout": self.layout.to_dict(),
            "seq_tokens": self.seq,
            "batch": self.batch,
            **({"pipeline": dict(self.pipeline)} if self.pipeline else {}),
        }


def _span(ops: list[Op] | None) -> float:
    if not ops or any(o.end is None for o in ops):
        return 0.0
    return max(o.end for o in ops) - min(o.start for o in ops)


_PHASES = (("forward", "fwd"), ("backward", "bwd"), ("recompute", "recompute"))  # layer_timings key, phase
_COPIES = ("offload", "prefetch")


def layer_timings(sched: Schedule, layer: int | None = None) -> dict[str, float]:
    """Simulated seconds of one layer's forward, backward, recompute, offload and prefetch."""
    i = sched.middle_layer if layer is None else layer
    out = {k: _span(sched.phases.get((i, p))) for k, p in _PHASES}
    for k in _COPIES:
        op = sched.copies.get((i, k))
        out[k] = (op.end - op.start) if op is not None and op.end is not None else 0.0
    return out


def exposed_wait_seconds(ops: list[Op], wait_on: tuple[str, ...]) -> float:
    """Time the other streams sat ready except for an op on a ``wait_on`` stream they waited for.

    For each op not on a ``wait_on`` stream: the part of its wait that starts after its stream's
    previous op and its other dependencies ended and lasts until its last ``wait_on``
    dependency ended (`exposed_wait_parts`), summed in (start, uid) order.
    """
    total = 0.0
    for _s, _u, x in sorted(exposed_wait_parts(ops, wait_on)):
        total += x
    return total


def exposed_wait_parts(ops: list[Op], wait_on: tuple[str, ...]) -> list[tuple[float, int, float]]:
    """(start, uid, seconds) of each op that waited on a ``wait_on`` stream (see
    `exposed_wait_seconds`); what an op contributes is settled when it starts."""
    # A stream runs its ops one at a time in issue order, so the op before one in (start, uid)
    # order on its stream is the one issued before it: each stream is walked in issue order and
    # only the ops that waited on a ``wait_on`` stream contribute, summed in (start, uid) order.
    parts: list[tuple[float, int, float]] = []
    append = parts.append
    prev_end: dict[tuple[int, str], float] = {}  # read only for streams not in wait_on
    for op in ops:
        start = op.start
        if start is None:
            continue
        stream = op.stream
        if stream in wait_on:
            continue
        deps = op.deps
        if deps:
            wait_end = None
            for d in deps:
                if d.stream in wait_on:
                    e = d.end
                    if e is not None and (wait_end is None or e > wait_end):
                        wait_end = e
            if wait_end is not None:
                other = prev_end.get((op.device, stream), 0.0)
                for d in deps:
                    if d.stream not in wait_on:
                        e = d.end
                        if e is not None and e > other:
                            other = e
                append((start, op.uid, max(0.0, min(wait_end, start) - other)))
        if op.end is not None:
            prev_end[(op.device, stream)] = op.end
    return parts


def exposed_copy_seconds(ops: list[Op]) -> float:
    """Time non-copy streams sat ready except for a host copy they waited on."""
    return exposed_wait_seconds(ops, COPY_STREAMS)


def exposed_p2p_seconds(ops: list[Op]) -> float:
    """Time the other streams waited on METP's ring (send/recv, broadcast, reduce) beyond the
    compute it overlaps: the ring steps whose transfer outlasts their compute block."""
    return exposed_wait_seconds(ops, TP_RING_STREAMS)


def _timeline_events(run: EngineRun) -> list[TimelineEvent]:
    events = [TimelineEvent(op.name, op.layer, op.phase, op.stream, op.device, op.start, op.end, op.nbytes, op.flops)
              for op in run.ops if op.start is not None and op.end is not None]
    events.sort(key=lambda e: (e.start, e.device, e.stream))
    return events


def _timeline(run: EngineRun, meta: dict) -> Timeline:
    return Timeline(_timeline_events(run), list(run.memory), meta)


def simulate(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
             profile: HardwareProfile, *, contention: bool = True,
             classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS, keep_timeline: bool = True,
             record: bool = False, allocator_lag: int = 0, detail: str = "auto", fold: bool = True) -> SimResult:
    """Simulate one training iteration of ``model`` at ``seq`` tokens x ``batch`` sequences per
    data-parallel replica under ``layout`` and ``policy`` on ``profile``.

    One representative GPU is simulated; the node's shared PCIe switches and host memory see the
    traffic of every GPU of the node (see `memo_sim.engine.core`). ``contention=False`` gives
    every op its stand-alone time (the analytic model's assumptions). Running out of GPU or host
    memory is a result (``status`` OOM / OOHM with ``failure``), not an exception; a bad input
    raises `MemoError`. ``record=True`` also keeps the op graph (``ops``, with dependencies) and
    the links' load at every rate change (``link_log``), for checks and debugging.

    A policy without a static memory plan runs on PyTorch's caching allocator: its whole
    iteration is replayed (`memo_sim.memplan.iteration_replay`) against the GPU's capacity, each
    reorganisation's stall is charged on the compute stream where it happens, and a replay that
    runs out of memory (fragmentation, where the byte count alone fits) ends the run as OOM.
    ``allocator_lag`` models ``record_stream`` on collective buffers with the GPU that many layers
    behind the CPU (0: the GPU keeps up).

    ``fold`` (default; not with ``record``): identical layers are simulated once where the
    iteration is periodic (`memo_sim.engine.periodic`; ``folded`` says how many layers the
    short run stood for), else the whole schedule runs.
    """
    if batch < 1 or seq < 1:
        raise MemoError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    if getattr(policy, "pipelined", False):
        return simulate_pipeline(model, layout, batch, seq, policy, profile, contention=contention,
                                 keep_timeline=keep_timeline, record=record, detail=detail)
    if layout.pp > 1:
        raise MemoError(f"layout {layout.label()} has pipeline stages: only the sppo policy schedules a pipeline")
    t0 = time.perf_counter()
    replay, stall = None, None
    if not policy.static_memory_plan:
        replay = replay_iteration(model, layout, batch, seq, policy, profile,
                                  classifier_chunk_tokens=classifier_chunk_tokens,
                                  expandable_segments=layout.expandable_segments,
                                  stream_lag_phases=allocator_lag or None)
        stall = replay.stall_by_phase(profile)
    plan = None
    if fold and not record:
        plan = plan_fold(model.layers, partial(layer_signature, policy), stall)
    out = None
    if plan is not None:
        out = _run_folded(model, layout, batch, seq, policy, profile, plan, contention=contention,
                          classifier_chunk_tokens=classifier_chunk_tokens, stall=stall, keep_timeline=keep_timeline)
    if out is None:
        out = _run_whole(model, layout, batch, seq, policy, profile, contention=contention,
                         classifier_chunk_tokens=classifier_chunk_tokens, stall=stall, keep_timeline=keep_timeline,
                         record=record)
    sched = out.sched
    dev = sched.device.index
    failure = out.failure
    if failure is None and replay is not None and replay.oom:
        ev = replay.oom_event
        failure = Failure("OOM", 0.0, f"{replay.oom_request} (caching-allocator fragmentation)",
                          float(ev.requested_bytes) if ev else 0.0, float(ev.allocated_bytes) if ev else 0.0,
                          sched.memory.gpu_capacity_bytes, dev, None, None)
    status = failure.status if failure else "OK"
    it, mfu, tgs = _rates(out.end_time, failure, model, layout, batch, seq, profile)
    meta = {
        "source": "simulated", "model": model.name, "layers": model.layers, "layout": layout.label(),
        "policy": policy.label(), "profile": profile.name, "seq_tokens": seq, "batch": batch, "gpus": layout.gpus,
        "status": status, "iteration_s": it, "mfu": mfu, "contention": contention,
        "gpu_capacity_bytes": sched.memory.gpu_capacity_bytes,
        "host_capacity_bytes": sched.memory.host_capacity_bytes,
        "representative": {"device": dev, "gpus_on_node": sched.device.group,
                           "gpus_on_pcie_switch": sched.device.switch_group},
        "middle_layer": middle_layer(model.layers),
        "failure": failure.to_dict() if failure else None,
        "allocator": _allocator_summary(replay, profile),
    }
    tl = Timeline(out.events, out.memory, meta) if keep_timeline else None
    wall = time.perf_counter() - t0
    node = sched.device.node
    return SimResult(
        model=model, layout=layout, batch=batch, seq=seq, policy=policy, profile=profile.name, status=status,
        iteration_s=it, mfu=mfu, tgs=tgs, peak_gpu_bytes=out.peak_gpu[dev], peak_host_bytes_per_node=out.peak_host[node],
        gpu_capacity_bytes=sched.memory.gpu_capacity_bytes, host_capacity_bytes=sched.memory.host_capacity_bytes,
        exposed_copy_s=out.exposed_copy_s, layer_timings=out.layer_timings, timeline=tl,
        failure=failure, contention=contention, sim_wall_s=wall, n_ops=out.n_ops,
        start_gpu_bytes=out.start_gpu.get(dev, 0.0), end_gpu_bytes=out.end_gpu[dev],
        end_host_bytes=out.end_host[node], link_log=out.link_log,
        link_capacity=out.link_capacity, link_carried=out.link_carried,
        ops=out.ops, allocator=_allocator_summary(replay, profile),
        exposed_p2p_s=out.exposed_p2p_s if layout.metp else 0.0, folded=out.folded)


@dataclass
class _Outcome:
    """What one engine run (whole, or folded and unfolded) gives `simulate`."""

    sched: Schedule
    end_time: float
    failure: Failure | None
    peak_gpu: dict[int, float]
    peak_host: dict[int, float]
    start_gpu: dict[int, float]
    end_gpu: dict[int, float]
    end_host: dict[int, float]
    n_ops: int
    exposed_copy_s: float
    exposed_p2p_s: float
    layer_timings: dict[str, float]
    events: list[TimelineEvent]
    memory: list
    link_capacity: dict
    link_carried: dict
    link_log: list = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    folded: int = 0


def _run_whole(model, layout, batch, seq, policy, profile, *, contention, classifier_chunk_tokens, stall,
               keep_timeline, record) -> _Outcome:
    sched = build_iteration(model, layout, batch, seq, policy, profile, classifier_chunk_tokens=classifier_chunk_tokens,
                            allocator_stall=stall)
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=sched.memory.gpu_capacity_bytes,
                    host_capacity=sched.memory.host_capacity_bytes, record_links=record, keep_memory=keep_timeline)
    run = engine.run()
    _check_deadlock(engine, run, "schedule")
    return _Outcome(
        sched, run.end_time, run.failure, run.peak_gpu_bytes, run.peak_host_bytes, run.start_gpu_bytes,
        run.end_gpu_bytes, run.end_host_bytes, len(run.ops), exposed_copy_seconds(run.ops),
        exposed_p2p_seconds(run.ops) if layout.metp else 0.0, layer_timings(sched),
        _timeline_events(run) if keep_timeline else [], list(run.memory), run.link_capacity, run.link_carried,
        run.link_log, run.ops if record else [])


def _run_folded(model, layout, batch, seq, policy, profile, plan: Fold, *, contention, classifier_chunk_tokens, stall,
                keep_timeline) -> _Outcome | None:
    """Identical layers simulated once (`memo_sim.engine.periodic`); None where the short run is
    not periodic, or failed and a timeline is wanted (the whole run then gives it)."""
    sched = build_iteration(model, layout, batch, seq, policy, profile, classifier_chunk_tokens=classifier_chunk_tokens,
                            allocator_stall=plan.allocator_stall, layers=plan.simulated)
    if not keep_timeline:
        out = _static_failure(sched, profile, plan, contention=contention)
        if out is not None:
            return out
    inf = float("inf")
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=inf, host_capacity=inf, log=True)
    run = engine.run()
    _check_deadlock(engine, run, "schedule")
    u = unfold(run, sched.phases, plan, gpu_capacity=sched.memory.gpu_capacity_bytes,
               host_capacity=sched.memory.host_capacity_bytes, devices=sched.graph.devices,
               routes=engine.routes if contention else None)
    if u is None or (u.failure is not None and (keep_timeline or u.tie)):
        return None
    copy_parts = {uid: x for _s, uid, x in exposed_wait_parts(run.ops, COPY_STREAMS)}
    p2p = u.exposed_wait_seconds({uid: x for _s, uid, x in exposed_wait_parts(run.ops, TP_RING_STREAMS)}) \
        if layout.metp else 0.0
    spans = u.layer_phase_spans(middle_layer(model.layers), tuple(p for _k, p in _PHASES), _COPIES)
    timings = {k: spans[p] for k, p in _PHASES}
    timings.update({c: spans[c] for c in _COPIES})
    return _Outcome(
        # a static allocation that does not fit stops the engine before the iteration starts
        sched, u.end_time, u.failure, u.peak_gpu, u.peak_host,
        u.end_gpu if u.failure is not None and u.failure.op is None else run.start_gpu_bytes, u.end_gpu, u.end_host,
        u.n_ops, u.exposed_wait_seconds(copy_parts), p2p, timings,
        u.timeline_events() if keep_timeline else [], list(u.samples()) if keep_timeline else [],
        run.link_capacity, u.link_carried, folded=plan.copies)


def _static_failure(sched: Schedule, profile: HardwareProfile, plan: Fold, *, contention: bool) -> _Outcome | None:
    """Where the model states and static buffers alone do not fit, the run fails before its
    first op, the whole model's as the short one's: the engine applies the static allocations
    and stops (no op of the short schedule runs), and the whole graph's op count is the short
    one's plus the copied layers' (each as many ops as the short schedule's layer before the cut;
    tests/test_engine_periodic.py holds this to the whole run). None where they fit."""
    g = sched.graph
    probe = OpGraph(list(g.devices.values()))
    probe.static = list(g.static)
    engine = Engine(probe, profile, contention=contention, gpu_capacity=sched.memory.gpu_capacity_bytes,
                    host_capacity=sched.memory.host_capacity_bytes, keep_memory=False)
    run = engine.run()
    if run.failure is None:
        return None
    n_ops = len(g.ops) + plan.copies * sum(1 for op in g.ops if op.layer == plan.cut - 1)
    return _Outcome(
        sched, run.end_time, run.failure, run.peak_gpu_bytes, run.peak_host_bytes, run.start_gpu_bytes,
        run.end_gpu_bytes, run.end_host_bytes, n_ops, 0.0, 0.0, layer_timings(sched), [], [],
        run.link_capacity, run.link_carried, folded=plan.copies)


def simulate_pipeline(model: ModelConfig, layout: Layout, batch: int, seq: int, policy: Policy,
                      profile: HardwareProfile, *, contention: bool = True, keep_timeline: bool = True,
                      record: bool = False, detail: str = "auto") -> SimResult:
    """`simulate` for a pipelined (SPPO) policy: one representative device per stage
    (`memo_sim.engine.pipeline`; ``detail``: ops, units or auto). ``peak_gpu_bytes`` is the
    fullest stage's, the host peak the fullest node's; ``pipeline`` holds per-stage peaks, busy
    and bubble time and the pieces."""
    from memo_sim.engine.pipeline import build_pipeline_iteration

    t0 = time.perf_counter()
    sched = build_pipeline_iteration(model, layout, batch, seq, policy, profile, detail=detail)
    mem = sched.memory.breakdown
    engine = Engine(sched.graph, profile, contention=contention, gpu_capacity=mem.gpu_capacity_bytes,
                    host_capacity=mem.host_capacity_bytes, record_links=record, keep_memory=keep_timeline)
    run = engine.run()
    _check_deadlock(engine, run, "pipeline schedule")
    failure = run.failure
    status = failure.status if failure else "OK"
    it, mfu, tgs = _rates(run.end_time, failure, model, layout, batch, seq, profile)
    stages = []
    for dev in sched.devices:
        # the graph keeps each (device, stream)'s ops in issue order, as run.ops has them
        busy = sum(o.end - o.start for o in sched.graph.streams.get((dev.index, "compute"), ())
                   if o.end is not None)
        stages.append({"stage": dev.index, "node": dev.node, "gpus_on_node": dev.group,
                       "peak_gpu_bytes": run.peak_gpu_bytes[dev.index], "compute_busy_s": busy,
                       "idle_s": (it - busy) if it else None,
                       "analytic_peak_gpu_bytes": sched.memory.stages[dev.index].breakdown.peak_gpu_bytes,
                       "analytic_peak_at": sched.memory.stages[dev.index].peak_at})
    worst = max(sched.devices, key=lambda dv: run.peak_gpu_bytes[dv.index])
    pipe = {"pp": layout.pp, "subseqs": policy.subseqs, "multiplex": policy.multiplex, "detail": sched.detail,
            "exposed_p2p_s": exposed_wait_seconds(run.ops, ("p2p",)),
            "bounds": list(policy.bounds), "alphas": list(policy.alphas), "stages": stages,
            "bubble_fraction": (1 - sum(st["compute_busy_s"] for st in stages) / (len(stages) * it)) if it else None,
            "worst_stage": worst.index, "memory": sched.memory.to_dict()}
    meta = {
        "source": "simulated", "model": model.name, "layers": model.layers, "layout": layout.label(),
        "policy": policy.label(), "profile": profile.name, "seq_tokens": seq, "batch": batch, "gpus": layout.gpus,
        "status": status, "iteration_s": it, "mfu": mfu, "contention": contention,
        "gpu_capacity_bytes": mem.gpu_capacity_bytes, "host_capacity_bytes": mem.host_capacity_bytes,
        "representative": {"device": worst.index, "gpus_on_node": worst.group,
                           "gpus_on_pcie_switch": worst.switch_group},
        "middle_layer": sched.layers[0][len(sched.layers[0]) // 2],  # the Gantt chart of stage 0 (device 0)
        "failure": failure.to_dict() if failure else None,
        "allocator": {"static_memory_plan": False, "reorganizations": 0, "stall_s": 0.0, "replayed": False},
        "pipeline": {**sched.meta(), "subseqs": policy.subseqs, "multiplex": policy.multiplex,
                     "bounds": list(policy.bounds), "alphas": list(policy.alphas)},
    }
    tl = _timeline(run, meta) if keep_timeline else None
    wall = time.perf_counter() - t0
    node = worst.node
    return SimResult(
        model=model, layout=layout, batch=batch, seq=seq, policy=policy, profile=profile.name, status=status,
        iteration_s=it, mfu=mfu, tgs=tgs, peak_gpu_bytes=max(run.peak_gpu_bytes.values()),
        peak_host_bytes_per_node=max(run.peak_host_bytes.values()),
        gpu_capacity_bytes=mem.gpu_capacity_bytes, host_capacity_bytes=mem.host_capacity_bytes,
        exposed_copy_s=exposed_copy_seconds(run.ops), layer_timings=pipeline_layer_timings(sched),
        timeline=tl, failure=failure, contention=contention, sim_wall_s=wall, n_ops=len(run.ops),
        start_gpu_bytes=run.start_gpu_bytes.get(worst.index, 0.0), end_gpu_bytes=run.end_gpu_bytes[worst.index],
        end_host_bytes=run.end_host_bytes[node], link_log=run.link_log, link_capacity=run.link_capacity,
        link_carried=run.link_carried, ops=run.ops if record else [],
        allocator=dict(meta["allocator"]), pipeline=pipe)


def pipeline_layer_timings(sched) -> dict[str, float]:
    """Simulated seconds of one unit (the middle piece through the middle layer of stage 0)."""
    ps = sched.pieces[0]
    k = len(ps) // 2
    layer = sched.layers[0][len(sched.layers[0]) // 2]
    out = {"forward": _span(sched.phases.get((0, k, layer, "fwd"))),
           "backward": _span(sched.phases.get((0, k, layer, "bwd"))), "recompute": 0.0}
    for kind in ("offload", "prefetch"):
        op = sched.copies.get((0, k, layer, kind))
        out[kind] = (op.end - op.start) if op is not None and op.end is not None else 0.0
    return out


def _allocator_summary(replay, profile: HardwareProfile) -> dict:
    if replay is None:
        return {"static_memory_plan": True, "reorganizations": 0, "stall_s": 0.0}
    return {"static_memory_plan": False, "reorganizations": replay.reorganizations,
            "stall_s": replay.stall_seconds(profile), "cuda_mallocs": replay.cuda_mallocs,
            "cuda_frees": replay.cuda_frees, "fragmentation_at_peak": replay.fragmentation_at_peak,
            "peak_reserved_bytes": replay.peak_reserved_bytes, "max_live_bytes": replay.max_live_bytes,
            "oom": replay.oom, "stream_lag_layers": replay.stream_lag_phases}


def sweep_alpha(model: ModelConfig, layout: Layout, batch: int, seq: int, profile: HardwareProfile,
                alphas: Iterable[float] = DEFAULT_ALPHAS, progress: Progress | None = None, *,
                contention: bool = True, keep_timeline: bool = False) -> list[SimResult]:
    """Simulate the memo policy at each alpha (default 0, 0.125, ..., 1); OOM / OOHM runs are
    kept as results. ``progress(done, total)`` is called after each run."""
    alphas = list(alphas)
    for a in alphas:
        if not (0.0 <= a <= 1.0) or math.isnan(a):
            raise MemoError(f"alpha must lie in [0, 1], got {a}")
    out = []
    for k, a in enumerate(alphas):
        out.append(simulate(model, layout, batch, seq, get_policy("memo", float(a)), profile,
                            contention=contention, keep_timeline=keep_timeline))
        if progress is not None:
            progress(k + 1, len(alphas))
    return out


def _check_deadlock(engine: Engine, run: EngineRun, what: str) -> None:
    """A run that ended without a failure but left ops unrun is a bug in the schedule."""
    if run.failure is None:
        stuck = engine.unfinished()
        if stuck:
            raise RuntimeError(f"{what} deadlock: {len(stuck)} ops never ran, first {stuck[0]!r} "
                               f"waiting on {stuck[0].deps!r}")


def _rates(end_time: float, failure, model: ModelConfig, layout: Layout, batch: int, seq: int,
           profile: HardwareProfile) -> tuple[float | None, float | None, float | None]:
    """Iteration seconds, MFU and tokens per GPU per second of a run that did not fail (else
    Nones); an iteration trains ``batch x dp`` sequences."""
    if failure is not None:
        return None, None, None
    it = end_time
    sequences = batch * layout.dp
    return (it, mfu_of(model, sequences, seq, it, layout.gpus, profile.peak(model.dtype)),
            tgs_of(sequences, seq, it, layout.gpus))
