"""What one simulated iteration gives, whatever its schedule: `SimResult`, and the helpers every
schedule's runner (`memo_sim.engine.schedules`) shares: exposed-wait accounting, the timeline,
rates (MFU, TGS) and the deadlock check."""

from __future__ import annotations

from dataclasses import dataclass, field

from memo_sim.model.flops import mfu as mfu_of, tgs as tgs_of
from memo_sim.engine.core import Engine, EngineRun, Failure
from memo_sim.engine.graph import Op
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.base import Policy
from memo_sim.profile.schema import HardwareProfile
from memo_sim.timeline import Timeline, TimelineEvent

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
    # with ``record``: the allocations applied before the first op (model states, static buffers),
    # as (device, tensor, bytes), in the order the engine applied them
    static_memory: list[tuple[int, str, float]] = field(default_factory=list)
    allocator: dict = field(default_factory=dict)  # caching-allocator replay of unplanned policies
    exposed_p2p_s: float = 0.0  # time waiting on METP's ring transfers beyond the compute they overlap
    pipeline: dict = field(default_factory=dict)  # pipelines: stages, per-stage peaks, busy time and bubbles
    schedule: str = "single_stage"  # the schedule that ran (`memo_sim.layout.schedule`)
    micro_batch: int = 0  # sequences per micro-batch (0: the whole batch, one micro-batch)
    folded: int = 0  # layers (micro-batch pipelines: micro-batches) not simulated but unfolded from a periodic
    # short run (`memo_sim.engine.periodic`, `memo_sim.engine.schedules.microbatch_fold`);
    # a folded run that failed keeps no ``link_carried`` (its flows stopped half way)

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    def in_use_at_failure(self, status: str, peak: float) -> float:
        """The bytes in use when the run failed, of the memory a ``status`` failure (OOM: GPU, OOHM: host) runs out
        of: the failure's own count where it is of that memory, else ``peak`` (the engine's peak, which stopped at
        the failure). A caching-allocator OOM (`memo_sim.engine.schedules.single_stage.simulate`: the replay of the
        whole iteration fails where the engine run completed) is found after the engine ran to the end: its
        ``peak`` is the completed run's, and the replay's allocated bytes at the failing request are the ones in
        use (a review: 77.76 GiB in the JSON beside '67.97 GiB in use' in the failure's words)."""
        f = self.failure
        return float(f.in_use_bytes) if f is not None and f.status == status else peak

    def to_dict(self) -> dict:
        """Summary in the keys the what-if and plan.json use (units in key names), no timeline."""
        return {
            "status": self.status,
            "iteration_s": self.iteration_s,
            "mfu": self.mfu,
            "tgs_tokens_per_gpu_s": self.tgs,
            # a failed run has no peak: the memory in use when it stopped is below the capacity it ran out of
            "peak_gpu_bytes": self.peak_gpu_bytes if self.ok else None,
            "peak_host_bytes_per_node": self.peak_host_bytes_per_node if self.ok else None,
            **({} if self.ok else {"in_use_at_failure_bytes": self.in_use_at_failure("OOM", self.peak_gpu_bytes),
                                   "in_use_at_failure_host_bytes_per_node": self.in_use_at_failure(
                                       "OOHM", self.peak_host_bytes_per_node)}),
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
            "schedule": self.schedule,
            "micro_batch": self.micro_batch or self.batch,
            **({"pipeline": dict(self.pipeline)} if self.pipeline else {}),
        }


def _span(ops: list[Op] | None) -> float:
    """The time some op of ``ops`` (one layer's phase) ran: the union of their intervals, so that a wait inside
    the phase (its next op held for a host copy, another stage, a collective of another layer) is not counted as
    the layer's time, as memo-exec's report measures a layer (its ops, stalls excluded) and the analytic tier
    prices it (a review: a full-offload layer's simulated forward was 0.178 s, its offload's time, against 0.069 s
    of ops); 0 for none or an op not run."""
    if not ops or any(o.end is None for o in ops):
        return 0.0
    return busy_time([(o.start, o.end) for o in ops])


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals (`_span`)."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def exposed_wait_seconds(ops: list[Op], wait_on: tuple[str, ...]) -> float:
    """Time the other streams sat ready except for an op on a ``wait_on`` stream they waited for.

    For each op not on a ``wait_on`` stream: the part of its wait that starts after its stream's
    previous op and its other dependencies ended and lasts until its last ``wait_on``
    dependency ended (`exposed_wait_parts`), summed in (start, uid) order.
    """
    return exposed_wait_totals(ops, (wait_on,))[0]


def exposed_wait_totals(ops: list[Op], groups: tuple[tuple[str, ...], ...],
                        moving: tuple[bool, ...] | None = None) -> list[float]:
    """`exposed_wait_seconds` of each group of ``wait_on`` streams, in one pass over the ops: one GPU's, the GPU
    whose waits sum longest where the run has several (a pipeline's stages: each waits on its own copies while
    the others compute, so their waits do not add up to the step's; a review found a pipeline's 373 s "copy
    stall" in a 63 s iteration, 16 stages' waits summed)."""
    return [max(per.values(), default=0.0) for per in exposed_wait_by_device(ops, groups, moving)]


def exposed_wait_by_device(ops: list[Op], groups: tuple[tuple[str, ...], ...],
                           moving: tuple[bool, ...] | None = None) -> list[dict[int, float]]:
    """Per group of ``wait_on`` streams, each GPU's `exposed_wait_seconds` (GPUs that never waited absent;
    ``moving``: `exposed_wait_parts_of`'s)."""
    device = {op.uid: op.device for op in ops}
    out = []
    for parts in exposed_wait_parts_of(ops, groups, moving):
        per: dict[int, float] = {}
        for _s, u, x in sorted(parts):
            per[device[u]] = per.get(device[u], 0.0) + x
        out.append(per)
    return out


def exposed_wait_parts(ops: list[Op], wait_on: tuple[str, ...]) -> list[tuple[float, int, float]]:
    """(start, uid, seconds) of each op that waited on a ``wait_on`` stream (see
    `exposed_wait_seconds`); what an op contributes is settled when it starts."""
    return exposed_wait_parts_of(ops, (wait_on,))[0]


def exposed_wait_parts_of(ops: list[Op], groups: tuple[tuple[str, ...], ...],
                          moving: tuple[bool, ...] | None = None) -> list[list[tuple[float, int, float]]]:
    """`exposed_wait_parts` of each group of ``wait_on`` streams, in one pass over the ops. Where ``moving`` is True
    for a group, only the part of a wait after the waited-for op started counts (a pipeline's transfer itself, not
    the other stage's work before it: an audit found a pipeline's 4.06 s of fill and drain reported as exposed P2P
    beside 0.04 s of transfers; `memo_sim.report.explain` splits a wait the same way)."""
    moving = moving or (False,) * len(groups)
    # A stream runs its ops one at a time in issue order, so the op before one in (start, uid)
    # order on its stream is the one issued before it: each stream is walked in issue order and
    # only the ops that waited on a ``wait_on`` stream contribute, summed in (start, uid) order.
    # Groups that wait on the same streams share one pass over an op's dependencies (a pipeline's
    # waits on its transfers are counted twice, whole and their own part: 6% of a 300,000-op run).
    out: list[list[tuple[float, int, float]]] = [[] for _ in groups]
    distinct = list(dict.fromkeys(groups))
    members = [[(out[i], moving[i]) for i, g in enumerate(groups) if g == wait_on] for wait_on in distinct]
    shared = list(zip(distinct, members))
    prev_end: dict[tuple[int, str], float] = {}  # per stream, its last op's end (read for streams not waited on)
    for op in ops:
        start = op.start
        if start is None:
            continue
        stream = op.stream
        deps = op.deps
        if deps:
            for wait_on, mine in shared:
                if stream in wait_on:
                    continue
                wait_end = wait_start = None  # the latest waited-for dependency's end, and its start
                beside = None  # the latest end of the other dependencies
                for d in deps:
                    e = d.end
                    if e is None:
                        continue
                    if d.stream in wait_on:
                        if wait_end is None or e > wait_end:
                            wait_end, wait_start = e, d.start
                    elif beside is None or e > beside:
                        beside = e
                if wait_end is None:
                    continue
                last = prev_end.get((op.device, stream), 0.0)
                for parts, transfer_only in mine:
                    other = last
                    if transfer_only and wait_start is not None and wait_start > other:
                        other = wait_start
                    if beside is not None and beside > other:
                        other = beside
                    parts.append((start, op.uid, max(0.0, min(wait_end, start) - other)))
        if op.end is not None:
            prev_end[(op.device, stream)] = op.end
    return out


def timeline_events(run: EngineRun) -> list[TimelineEvent]:
    events = [TimelineEvent(op.name, op.layer, op.phase, op.stream, op.device, op.start, op.end, op.nbytes, op.flops)
              for op in run.ops if op.start is not None and op.end is not None]
    events.sort(key=lambda e: (e.start, e.device, e.stream))
    return events


def timeline_of(run: EngineRun, meta: dict) -> Timeline:
    return Timeline(timeline_events(run), list(run.memory), meta)


def allocator_summary(replay, profile: HardwareProfile) -> dict:
    """summary.json's ``allocator`` block: the counts of the whole-iteration caching-allocator replay the engine
    charged (`memo_sim.memplan.iteration_replay.engine_replay`), ``static_memory_plan`` true where a memory plan's
    arena held the placed transients beside it (the replay covers what the plan leaves to the caching allocator:
    README, the snapshot is "the replay whose counts summary.json's allocator fields report"). None (no replay):
    a memory plan's stub."""
    if replay is None:
        return {"static_memory_plan": True, "reorganizations": 0, "stall_s": 0.0}
    return {"static_memory_plan": bool(replay.static_memory_plan), "reorganizations": replay.reorganizations,
            "stall_s": replay.stall_seconds(profile), "cuda_mallocs": replay.cuda_mallocs,
            "cuda_frees": replay.cuda_frees, "fragmentation_at_peak": replay.fragmentation_at_peak,
            "peak_reserved_bytes": replay.peak_reserved_bytes, "max_live_bytes": replay.max_live_bytes,
            "peak_allocated_bytes": replay.peak_allocated_bytes,
            "reserved_at_peak_allocated_bytes": replay.reserved_at_peak_allocated_bytes,
            "oom": replay.oom, "stream_lag_layers": replay.stream_lag_phases,
            # the failure's own counts (`OomEvent`): what the answer's frag/retries cell of an OOM-frag row shows
            "oom_reserved_bytes": replay.oom_event.reserved_bytes if replay.oom_event else None,
            "oom_cached_free_bytes": replay.oom_event.cached_free_bytes if replay.oom_event else None,
            # whether its last iteration left the cache as it found it (`IterationReplay.steadiness`)
            "steady": replay.steady, "iterations": replay.iterations,
            "reorganizations_by_iteration": replay.reorganizations_by_iteration,
            "memory_stats": replay.memory_stats()}


def check_deadlock(engine: Engine, run: EngineRun, what: str) -> None:
    """A run that ended without a failure but left ops unrun is a bug in the schedule."""
    if run.failure is None:
        stuck = engine.unfinished()
        if stuck:
            raise RuntimeError(f"{what} deadlock: {len(stuck)} ops never ran, first {stuck[0]!r} "
                               f"waiting on {stuck[0].deps!r}")


def rates(end_time: float, failure, model: ModelConfig, layout: Layout, batch: int, seq: int,
           profile: HardwareProfile) -> tuple[float | None, float | None, float | None]:
    """Iteration seconds, MFU and tokens per GPU per second of a run that did not fail (else
    Nones); an iteration trains ``batch x dp`` sequences."""
    if failure is not None:
        return None, None, None
    it = end_time
    sequences = batch * layout.dp
    return (it, mfu_of(model, sequences, seq, it, layout.gpus, profile.peak(model.dtype)),
            tgs_of(sequences, seq, it, layout.gpus))
