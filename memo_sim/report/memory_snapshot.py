"""The predicted memory of one iteration in PyTorch's snapshot format (``torch.cuda.memory._snapshot()``),
so it opens in PyTorch's memory_viz beside a measured snapshot. ``memo_what`` in the snapshot says which of the two
below it is.

A single-stage run (`_replay_snapshot`): the caching-allocator replay of its iteration
(`memo_sim.memplan.iteration_replay`: the model states and static buffers, then every tensor of every layer's
forward and backward, the classifier's, one request each, on the GPU's usable memory with the layout's allocator
settings and stream lag), the very replay summary.json's ``allocator`` fields report (a review: the snapshot of the
README toy under full_recompute held 122 MiB of segments and 104.99 MiB allocated where summary.json's replay
reserved 96 MiB and allocated 86.25 MiB: the snapshot was the simulator's lumps, not that replay). Every replayed
iteration is written (warm-up first), each request with its tensor's name and phase, the segments as the replay
leaves them: the trace's largest live total is the stream's max-live bytes, its segments peak at the replay's
reserved peak. summary.json's ``peak_gpu_bytes`` is the simulator's memory curve, whose layer phases are lumps of
the phase's peak, and is not this trace's peak. Under a static memory plan (MEMO, ``--allocator plan``) the arena is
one static request (memo_exec/arena.py allocates it once: the largest placed max-live of a layer's phases, the
replay's ``ARENA_ID``) and the classifier's chunks sit in it (memo_exec/arena.py ``between_layers``; a review: the
lumps of gpt-7b at 1M did not fit the GPU although the plan does). Where the replay runs out of memory the trace
ends in PyTorch's ``oom`` entry (``{"action": "oom", "device_free", "size", ...}``, as
``record_trace(TraceEntry::OOM, device_free, params.size(), ...)`` writes it) at the start of the failing request's
phase, and ``memo_note`` names the request and the stream lag.

A pipeline stage or an SPPO run (`_lump_snapshot`; no per-tensor replay models them): the simulator's
allocations of the stage. The simulated run (``record``) applied its GPU allocations in an order its memory
samples keep (one sample per allocation or free, with the bytes in use after it): the static allocations, then
each op's allocations at its start and frees at its end. `allocation_stream` recovers that order with the tensor
names (each sample matched to the allocation of its instant whose size it adds), so the trace's running total is
the simulator's memory curve and its peak the simulated peak. Addresses come from memo's model of PyTorch's
caching allocator (`memo_sim.memplan.caching_allocator`) serving the same requests in the same order, on the GPU's
usable memory with the layout's allocator settings: where a request finds no room it frees the cached segments and
tries again, as PyTorch does (the trace's ``segment_free`` entries), so the segments never hold more than the GPU
has. Where even that fails (the requests are lumps of a layer's tensors, whose rounding the per-tensor replay does
not pay) the addresses are an unbounded allocator's and ``memo_note`` says so (`memo-sim simulate` prints it as a
warning). Under a static memory plan the arena is allocated with the static buffers and each phase's working lump
asks the caching allocator only for what the plan leaves to it (the lump less the arena).

Expandable segments (``expandable_segments:True``): PyTorch records the pages it maps and unmaps
(c10/cuda/CUDACachingAllocator.cpp, ``map_block``: ``record_trace(TraceEntry::SEGMENT_MAP,
mapped_range.ptr, mapped_range.size, ...)``; ``unmap_block``: ``SEGMENT_UNMAP``) and its snapshot lists one
segment per contiguous mapped range (``snapshot()``: "we report one segment for each contiguous mapped range
of memory", ``total_size`` the sum of its mapped blocks), not the virtual reservation; so does this one.

Frames name the tensor, the layer and the phase. `replay_oom_site` places a replay's failure on the simulator's
clock (summary.json's failure).

Format (PyTorch's, as ``torch.cuda._memory_viz`` reads it): ``{"segments": [...], "device_traces":
[[...]]}``; a trace entry is ``{"action": "alloc" | "free_requested" | "free_completed" |
"segment_alloc" | "segment_free" | "segment_map" | "segment_unmap", "addr", "size", "stream": 0, "time_us",
"frames": [{"filename", "line", "name"}]}`` (``oom``: ``device_free`` in place of ``addr``)
(alloc and free sizes are the requested bytes); a segment is ``{"device", "address", "total_size",
"allocated_size", "active_size", "requested_size", "stream": 0, "segment_type": "small" | "large",
"segment_pool_id": [0, 0], "is_expandable", "frames": [], "blocks": [{"address", "size",
"requested_size", "state": "active_allocated" | "inactive", "frames"}]}``.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

from memo_sim.cost.memory import CLASSIFIER_CHUNK_TOKENS
from memo_sim.engine.result import SimResult
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_bytes
from memo_sim.memplan.allocator_report import AllocatorOutOfMemory
from memo_sim.memplan.caching_allocator import AllocatorConfig, CachingAllocatorModel
from memo_sim.memplan.iteration_replay import allocator_config, engine_replay
from memo_sim.memplan.iteration_requests import ARENA_ID, iteration_stream
from memo_sim.memplan.iteration_stream import MALLOC
from memo_sim.policy.base import uses_memory_plan
from memo_sim.profile.schema import HardwareProfile


@dataclass(frozen=True)
class Allocation:
    time_s: float
    tensor: str
    nbytes: float  # > 0 allocates, < 0 frees
    layer: int | None
    phase: str


def allocation_stream(res: SimResult, device: int = 0) -> list[Allocation]:
    """``device``'s GPU allocations and frees in the order the simulator applied them."""
    if res.timeline is None or (not res.ops and not res.static_memory):
        raise MemoError("a memory snapshot needs a recorded simulation (simulate(..., record=True))")
    pool: dict[float, list[Allocation]] = {0.0: [Allocation(0.0, t, b, None, "static")
                                                for d, t, b in res.static_memory if d == device]}
    for op in res.ops:
        if op.device != device or op.start is None:
            continue
        for when, acts in ((op.start, op.mem_start), (op.end, op.mem_end)):
            for a in acts:
                if a.space == "gpu" and when is not None:
                    pool.setdefault(when, []).append(Allocation(when, a.tensor, a.nbytes, op.layer, op.phase))
    out, level = [], 0.0
    for s in res.timeline.memory:
        if s.device != device or s.kind != "gpu":
            continue
        delta = s.nbytes - level
        level = s.nbytes
        cands = pool.get(s.time) or []
        if not cands:  # the engine samples every MemAction it applies (core.Engine._apply): a bug, not bad input
            raise RuntimeError(f"internal error: no allocation at {s.time} s to match the simulator's memory sample")
        best = min(range(len(cands)), key=lambda i: (abs(cands[i].nbytes - delta), i))
        out.append(cands.pop(best))
    return out


ARENA_TENSOR = "memory_plan_arena"  # the static memory plan's arena in the snapshot (memo_exec/arena.py)
# a layer phase's working lump (`memo_sim.engine.schedules.single_stage` ``L{i}.{phase}.working``; a micro-batch
# pipeline's ``mb{k}.L{i}...``): the phase peak, of which a static memory plan places the arena's share; and the
# classifier's, whose chunk tensors memo-exec places in the arena between the layers (memo_exec/arena.py
# ``between_layers``)
_WORKING = re.compile(r"(?:^|\.)(?:L\d+\.(?:fwd|bwd|recompute)|classifier)\.working$")


@dataclass(frozen=True)
class ReplayOom:
    """Where the whole-iteration caching-allocator replay ran out of memory, on the simulator's clock: the
    start of the phase whose request failed (the replay's requests keep no clock of their own)."""

    time_s: float
    op: str
    layer: int | None
    phase: str  # the replay's phase name (``L27.bwd``)
    tensor: str  # the replay's request
    requested_bytes: int
    device_free_bytes: int  # the allocator's capacity less what it reserved when the request failed
    stream_lag_layers: int


def memory_plan_arena_bytes(res: SimResult) -> int:
    """The static memory plan's arena of ``res``'s GPU (0: none): what memo-exec allocates once
    (memo_exec/arena.py) and `memo_sim.memplan.iteration_replay` replays as the static ``ARENA_ID`` request.
    SPPO's units run on PyTorch's allocator (`memo_sim.memplan.footprint.sppo_unit_working_bytes`): none."""
    if res.schedule == "sppo" or not uses_memory_plan(res.policy, res.layout):
        return 0
    stream = iteration_stream(res.model, res.layout, res.micro_batch or res.batch, res.seq, res.policy)
    return sum(size for _kind, bid, size in stream.static if bid == ARENA_ID)


def _in_arena(stream: list[Allocation], arena: int) -> list[Allocation]:
    """``stream`` with the arena allocated once after the static allocations and each layer phase's working
    lump cut by it (what the plan leaves to the caching allocator); a lump the arena covers is left out."""
    if not arena:
        return stream
    out: list[Allocation] = []
    for a in stream:
        if a.phase != "static" and not any(x.tensor == ARENA_TENSOR for x in out):
            out.append(Allocation(0.0, ARENA_TENSOR, float(arena), None, "static"))
        if _WORKING.search(a.tensor):
            rest = max(abs(a.nbytes) - arena, 0.0)
            if rest < 1:
                continue
            a = Allocation(a.time_s, a.tensor, rest if a.nbytes > 0 else -rest, a.layer, a.phase)
        out.append(a)
    if not any(x.tensor == ARENA_TENSOR for x in out):
        out.append(Allocation(0.0, ARENA_TENSOR, float(arena), None, "static"))
    return out


def _phase_start(res: SimResult, phase: str, device: int):
    """The first timeline event of the replay's ``phase`` (``L{i}.fwd``, ``L{i}.bwd`` with its recompute,
    ``classifier``, ``embedding``, ``embedding.bwd``) on ``device``; None where the timeline has none."""
    m = re.fullmatch(r"L(\d+)\.(fwd|bwd)", phase)
    if m:
        layer, phases = int(m.group(1)), ("fwd",) if m.group(2) == "fwd" else ("recompute", "bwd")
        hits = [e for e in res.timeline.events if e.layer == layer and e.phase in phases]
    elif phase == "classifier":
        hits = [e for e in res.timeline.events if e.phase == "classifier"]
    else:  # the embedding (its backward: the last event)
        hits = list(res.timeline.events)
        if phase.endswith(".bwd"):
            hits = [max(hits, key=lambda e: e.end, default=None)] if hits else []
    hits = [e for e in hits if e is not None and e.device == device and e.start is not None]
    return min(hits, key=lambda e: e.start, default=None)


def replay_oom_site(res: SimResult, profile: HardwareProfile,
                    classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> ReplayOom | None:
    """Where ``res``'s caching-allocator replay on ``profile``'s GPU ran out of memory (None: it did not, or the
    run has no replay):
    the engine's own replay again (`engine_replay`, memoised; ``res.allocator``'s stream lag), its failing
    request's phase (``IterationStream.phase_of``), and that phase's first op on the simulator's clock. The
    engine gives the failure no time (core.Failure: "the caching-allocator replay ... keeps no clock"); README
    promises an OOM with the tensor and the time, which this supplies."""
    alloc = res.allocator or {}
    if not alloc.get("oom") or res.schedule != "single_stage" or res.timeline is None:
        return None
    lag = int(alloc.get("stream_lag_layers") or 0)
    mb = res.micro_batch or res.batch
    rep = engine_replay(res.model, res.layout, mb, res.seq, res.policy, profile,
                        classifier_chunk_tokens=classifier_chunk_tokens, allocator_lag=lag)
    ev = rep.oom_event if rep is not None else None
    if ev is None:
        return None
    stream = iteration_stream(res.model, res.layout, mb, res.seq, res.policy, classifier_chunk_tokens)
    k = ev.step - 1 - max(rep.oom_iteration or 0, 0) * len(stream.iteration)
    phase = stream.phase_name(stream.phase_of[k]) if rep.oom_iteration >= 0 and 0 <= k < len(stream.phase_of) \
        else "embedding"
    device = res.failure.device if res.failure is not None else 0
    first = _phase_start(res, phase, device)
    if first is None:
        return None
    return ReplayOom(float(first.start), first.op, first.layer, phase, ev.buffer_id, int(ev.requested_bytes),
                     int(ev.available_bytes), lag)


def predicted_snapshot(res: SimResult, profile: HardwareProfile | None = None, device: int = 0,
                       classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> dict:
    """The snapshot dict of ``device`` (see the module docs) on ``profile``'s GPU (None: an unbounded one).
    A single-stage run's is its caching-allocator replay (`_replay_snapshot`); a pipeline stage's or an SPPO
    run's the simulator's allocations (`_lump_snapshot`). ``memo_what`` says which; ``memo_note`` says where the
    snapshot is not the allocator state the run would have (the replay ran out of memory: the trace ends in its
    ``oom``; or a stage's lumps did not fit)."""
    if res.schedule == "single_stage":
        if res.timeline is None:
            raise MemoError("a memory snapshot needs a recorded simulation (simulate(..., record=True))")
        return _replay_snapshot(res, profile, classifier_chunk_tokens)
    snap = _lump_snapshot(res, profile, device, classifier_chunk_tokens)
    snap["memo_what"] = LUMP_WHAT
    return snap


LUMP_WHAT = ("the simulator's allocations of this stage (one working lump per layer phase, as its memory curve and "
             "summary.json's peak_gpu_bytes count them; the trace's peak is that peak), served by memo's model of "
             "PyTorch's caching allocator: not a per-tensor replay")


def _replay_snapshot(res: SimResult, profile: HardwareProfile | None,
                     classifier_chunk_tokens: int = CLASSIFIER_CHUNK_TOKENS) -> dict:
    """A single-stage run's snapshot: the caching-allocator replay of its iteration (`iteration_stream`, the
    requests `memo_sim.memplan.iteration_replay.replay_iteration` replays and summary.json's ``allocator`` fields
    report, on ``profile``'s usable memory with the layout's settings and stream lag), every request of every
    replayed iteration written as PyTorch records it, the segments as the replay leaves them. Its clock is the
    simulator's for the reported (last) iteration: a request at its phase's first op (`_phase_start`), each
    warm-up iteration one ``iteration_s`` before the next (so at negative times), the static requests at the first
    one's start. A free on a collective's stream (``record_stream``) is written where it is called, though the
    replay reuses its block only once the stream lag has passed."""
    from memo_sim.memplan.iteration_replay import record_stream_lag, replay_stream  # noqa: PLC0415

    lay, mb = res.layout, res.micro_batch or res.batch
    stream = iteration_stream(res.model, lay, mb, res.seq, res.policy, classifier_chunk_tokens)
    if profile is None:
        cfg = AllocatorConfig(capacity_bytes=1 << 62, expandable_segments=lay.expandable_segments)
    else:
        cfg = allocator_config(profile, None, lay.expandable_segments, None, lay.alloc_conf)
    lag = int((res.allocator or {}).get("stream_lag_layers") or 0)
    if not lag and lay.nccl_record_stream:  # what replay_iteration replays for the layout
        lag = record_stream_lag(res.model, lay, mb, res.seq, res.policy, classifier_chunk_tokens)
    starts: list[float] = []
    for k in range(stream.phases):  # a phase without an op of its own starts where the one before it did
        ev = _phase_start(res, stream.phase_name(k), 0)
        starts.append(max(float(ev.start) if ev is not None else 0.0, starts[-1] if starts else 0.0))
    period = float(res.iteration_s or 0.0) or max((e.end or 0.0 for e in res.timeline.events), default=0.0)
    trace: list[dict] = []
    frames_of: dict[str, list[dict]] = {}
    addr_of: dict[str, int] = {}
    live: dict[str, int] = {}
    seen = {"model": None, "look": (0, 0, 0), "held": {}}

    def observe(m, it: int, ph: int, kind: str, bid: str, size: int) -> None:
        seen["model"] = m
        t_us = int(round(((it * period + starts[ph]) if it >= 0 else 0.0) * 1e6))
        if kind == MALLOC:
            layer = re.match(r"L(\d+)\.", bid)  # a layer's tensor (iteration_requests names them L{i}.<phase>...)
            frames = [{"filename": f"layer {layer.group(1)}" if layer else "model",
                       "line": 0, "name": f"{bid} ({stream.phase_name(ph) if ph >= 0 else 'static'})"}]
            frames_of[bid], addr_of[bid], live[bid] = frames, m.address_of(bid), size
        look = (m.reserved_bytes, m.num_cuda_malloc, m.num_cuda_free)
        if look != seen["look"]:  # segments allocated or freed, pages mapped or unmapped
            now = _mapped(m)
            trace.extend(_segment_entries(seen["held"], now, t_us, frames_of[bid]))
            seen["held"], seen["look"] = now, look
        if kind == MALLOC:
            trace.append({"action": "alloc", "addr": addr_of[bid], "size": size, "stream": 0, "time_us": t_us,
                          "frames": frames_of[bid]})
        else:
            was = live.pop(bid)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr_of[bid], "size": was, "stream": 0, "time_us": t_us,
                              "frames": frames_of[bid]})

    r = replay_stream(stream, cfg, policy=res.policy, stream_lag_phases=lag or None, observer=observe)
    shift = int(round((r.iterations - 1) * period * 1e6))  # the reported iteration on the simulator's clock
    for e in trace:
        e["time_us"] -= shift
    model = seen["model"] or CachingAllocatorModel(cfg)
    snap = {"segments": _segments(model, {b: [(b, n)] for b, n in live.items()}, frames_of, 0),
            "device_traces": [trace]}
    planned = any(bid == ARENA_ID for _k, bid, _n in stream.static)
    what = (f"the caching-allocator replay of one GPU's iteration: {r.iterations} iteration(s) of per-tensor "
            f"requests after the model states and static buffers"
            + (" (the memory plan's arena one of them)" if planned else "")
            + f", peak allocated {r.peak_allocated_bytes} B, peak reserved {r.peak_reserved_bytes} B"
            + ("" if planned else " (summary.json's allocator fields)")
            + "; summary.json's peak_gpu_bytes is the simulator's curve, whose layer phases are lumps, not this "
              "trace's peak")
    snap["memo_what"] = what + ("; " + r.steadiness() if r.steadiness() else "")
    ev = r.oom_event
    if ev is not None:
        it = r.oom_iteration if r.oom_iteration is not None else -1
        k = ev.step - 1 - max(it, 0) * len(stream.iteration)
        phase = stream.phase_name(stream.phase_of[k]) if it >= 0 and 0 <= k < len(stream.phase_of) else "static"
        t = starts[stream.phase_of[k]] if phase != "static" else 0.0  # the failing iteration is the reported one
        trace.append({"action": "oom", "device_free": int(ev.available_bytes), "size": int(ev.requested_bytes),
                      "stream": 0, "time_us": int(round(t * 1e6)) - (shift if phase == "static" else 0),
                      "frames": [{"filename": "model", "line": 0,
                                  "name": f"{ev.buffer_id} ({phase}, caching-allocator replay)"}]})
        snap["memo_note"] = (f"the caching-allocator replay of the whole iteration (stream lag {lag} layers) ran "
                             f"out of memory at {ev.buffer_id} in phase {phase} ({int(ev.requested_bytes)} B "
                             f"requested, {int(ev.available_bytes)} B free); the trace ends there in an oom entry")
    return snap


def _lump_snapshot(res: SimResult, profile: HardwareProfile | None, device: int,
                   classifier_chunk_tokens: int) -> dict:
    """A pipeline stage's or an SPPO run's snapshot: the simulator's allocations (`allocation_stream`, lumps)."""
    stream = _in_arena(allocation_stream(res, device), memory_plan_arena_bytes(res))
    if profile is None:
        return _snapshot(stream, AllocatorConfig(capacity_bytes=1 << 62), device)
    lay = res.layout
    cfg = allocator_config(profile, None, lay.expandable_segments, None, lay.alloc_conf)
    oom = replay_oom_site(res, profile, classifier_chunk_tokens)
    note = ""
    if oom is not None and (res.failure is None or res.failure.device == device):
        stream = [a for a in stream if a.time_s < oom.time_s or a.phase == "static"]
        note = (f"the caching-allocator replay of the whole iteration (stream lag {oom.stream_lag_layers} layers) "
                f"ran out of memory at {oom.tensor} in phase {oom.phase} ({oom.requested_bytes} B requested, "
                f"{oom.device_free_bytes} B free); the trace ends there, at the phase's start, in an oom entry")
    else:
        oom = None
    try:
        snap = _snapshot(stream, cfg, device, oom)
    except AllocatorOutOfMemory as e:
        snap = _snapshot(stream, AllocatorConfig(capacity_bytes=1 << 62), device, oom)
        note = "; ".join(x for x in (note, (
            f"the simulator's lumped requests did not fit {profile.name}'s usable memory in the caching-allocator "
            f"model ({e}); addresses are an unbounded allocator's")) if x)
    if note:
        snap["memo_note"] = note
    return snap


def _mapped(model: CachingAllocatorModel) -> dict[int, tuple[bool, list[tuple[int, int]]]]:
    """Per segment base: whether it is expandable, and its mapped address ranges ``[start, end)``, merged."""
    out = {}
    for sg in model.segments():
        ranges: list[tuple[int, int]] = []
        for b in sg["blocks"]:
            if b["state"] == "unmapped":
                continue
            if ranges and ranges[-1][1] == b["address"]:
                ranges[-1] = (ranges[-1][0], b["address"] + b["size"])
            else:
                ranges.append((b["address"], b["address"] + b["size"]))
        out[sg["address"]] = (sg["expandable"], ranges if sg["expandable"] else [(sg["address"],
                                                                                   sg["address"] + sg["size"])])
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the ranges ``a`` outside the ranges ``b`` (both sorted, disjoint)."""
    out = []
    for lo, hi in a:
        for blo, bhi in b:
            if bhi <= lo or blo >= hi:
                continue
            if blo > lo:
                out.append((lo, blo))
            lo = max(lo, bhi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


def _segment_entries(before: dict, after: dict, t_us: int, frames: list[dict]) -> list[dict]:
    """The trace entries of the change from ``before`` to ``after`` (`_mapped`): segments freed or pages
    unmapped (PyTorch's free-and-retry, or a reorganisation), then segments allocated or pages mapped."""
    def entry(action: str, lo: int, hi: int) -> dict:
        return {"action": action, "addr": lo, "size": hi - lo, "stream": 0, "time_us": t_us, "frames": frames}

    gone, new = [], []
    for base in sorted(set(before) | set(after)):
        exp = (before.get(base) or after.get(base))[0]
        old, now = (before.get(base) or (exp, []))[1], (after.get(base) or (exp, []))[1]
        gone += [entry("segment_unmap" if exp else "segment_free", lo, hi) for lo, hi in _minus(old, now)]
        new += [entry("segment_map" if exp else "segment_alloc", lo, hi) for lo, hi in _minus(now, old)]
    return gone + new


def _snapshot(stream: list[Allocation], config: AllocatorConfig, device: int, oom: ReplayOom | None = None) -> dict:
    """`predicted_snapshot` with the allocator ``config``; ``oom``: end the trace in that replay's ``oom``."""
    model = CachingAllocatorModel(config)
    live: dict[str, list[tuple[str, int]]] = {}
    trace: list[dict] = []
    frames_of: dict[str, list[dict]] = {}
    held = _mapped(model)
    for k, a in enumerate(stream):
        frames = [{"filename": "model" if a.layer is None else f"layer {a.layer}", "line": 0,
                   "name": f"{a.tensor} ({a.phase})"}]
        t_us = int(round(a.time_s * 1e6))
        size = int(round(abs(a.nbytes)))
        if size == 0:  # PyTorch's allocator records nothing for an empty tensor (CUDACachingAllocator.cpp
            continue  # ``NativeCachingAllocator::allocate``: ``if (size != 0)``, a null pointer otherwise)
        if a.nbytes > 0:
            bid = f"{a.tensor}#{k}"
            addr = model.malloc(bid, max(size, 1), step=k)
            now = _mapped(model)
            trace += _segment_entries(held, now, t_us, frames)
            held = now
            live.setdefault(a.tensor, []).append((bid, size))
            frames_of[bid] = frames
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t_us,
                          "frames": frames})
        else:
            mine = live.get(a.tensor) or []
            if not mine:  # the schedules name each free after its allocation: a bug in one, not bad input
                raise RuntimeError(f"internal error: the simulator frees {a.tensor!r} at {a.time_s} s without an "
                                   f"allocation of that name")
            i = min(range(len(mine)), key=lambda j: (abs(mine[j][1] - size), -j))
            bid, was = mine.pop(i)
            addr = model.address_of(bid)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": was, "stream": 0, "time_us": t_us,
                              "frames": frames_of[bid]})
            model.free(bid, step=k)
    if oom is not None:
        trace.append({"action": "oom", "device_free": oom.device_free_bytes,
                      "size": oom.requested_bytes, "stream": 0, "time_us": int(round(oom.time_s * 1e6)),
                      "frames": [{"filename": "layer" if oom.layer is None else f"layer {oom.layer}", "line": 0,
                                  "name": f"{oom.tensor} ({oom.phase}, caching-allocator replay)"}]})
    return {"segments": _segments(model, live, frames_of, device), "device_traces": [trace]}


def _segments(model: CachingAllocatorModel, live: dict, frames_of: dict, device: int) -> list[dict]:
    """The snapshot's segments: one per segment, an expandable one's contiguous mapped ranges each one (PyTorch's
    ``snapshot()``), ``total_size`` their mapped bytes."""
    by_addr = {}
    for bids in live.values():
        for bid, _ in bids:
            by_addr[model.address_of(bid)] = frames_of[bid]
    segments = []
    for sg in model.segments():
        runs: list[list[dict]] = [[]]
        for b in sg["blocks"]:
            if b["state"] == "unmapped":
                runs.append([])
                continue
            runs[-1].append({"address": b["address"], "size": b["size"], "requested_size": b["requested"],
                             "state": "active_allocated" if b["state"] == "allocated" else "inactive",
                             "frames": by_addr.get(b["address"], [])})
        for blocks in (r for r in runs if r):
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            segments.append({"device": device, "address": blocks[0]["address"],
                             "total_size": sum(b["size"] for b in blocks),
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
                             "segment_type": "small" if sg["small"] else "large", "segment_pool_id": [0, 0],
                             "is_expandable": sg["expandable"], "frames": [], "blocks": blocks})
    return segments


def trace_peak_bytes(snapshot: dict, device: int = 0) -> int:
    """The largest sum of live allocations along the snapshot's trace (its Active Memory peak)."""
    level = peak = 0
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            level += e["size"]
            peak = max(peak, level)
        elif e["action"] == "free_completed":
            level -= e["size"]
    return peak


def write_snapshot(snapshot: dict, path: str | Path) -> Path:
    return atomic_write_bytes(path, pickle.dumps(snapshot))
