"""The predicted memory of one iteration in PyTorch's snapshot format (``torch.cuda.memory._snapshot()``),
so it opens in PyTorch's memory_viz beside a measured snapshot.

The simulated run (``record``) applied its GPU allocations in an order its memory samples keep
(one sample per allocation or free, with the bytes in use after it): the static allocations,
then each op's allocations at its start and frees at its end. `allocation_stream` recovers that
order with the tensor names (each sample matched to the allocation of its instant whose size it
adds), so the trace's running total is the simulator's memory curve and its peak the simulated
peak. Addresses come from memo's model of PyTorch's caching allocator
(`memo_sim.memplan.caching_allocator`) serving the same requests in the same order, on the GPU's usable memory with
the layout's allocator settings (`memo_sim.memplan.iteration_replay.allocator_config`, as `memo-sim explain`'s
replay): where a request finds no room it frees the cached segments and tries again, as PyTorch does (the trace's
``segment_free`` entries), so the segments never hold more than the GPU has (a review: an unbounded model kept
79.59 GiB of segments for a plan that fits in 78 GiB). Where even that fails (the simulator's requests are lumps of
a layer's tensors, whose rounding the per-tensor replay does not pay) the addresses are an unbounded allocator's and
the snapshot says so (``memo_note``; `memo-sim simulate` prints it as a warning). For a policy
with a static memory plan (MEMO, ``--allocator plan``) the runtime places a layer's transients inside one arena
allocated once before the first iteration (memo_exec/arena.py; the arena of
`memo_sim.memplan.iteration_replay`'s stream, ``ARENA_ID``): the snapshot allocates that arena with the static
buffers and each phase's working lump asks the caching allocator only for what the plan leaves to it (the lump
less the arena: kernel workspaces, the activation handed between layers), the classifier's too (memo-exec puts
its chunk tensors in the arena between the last forward and the first backward, ``between_layers``). A review:
lumps of the whole phase peak put the 16 MiB lse of the next layer into the freed 20 GiB lump, so every layer's
lump took a fresh segment (88.66 GiB of segments on an 80 GB GPU). The trace's running total is then the
simulator's curve with the arena live from the start (its peak the simulated one wherever a lump at least the
arena's size is live at the peak).

Expandable segments (``expandable_segments:True``): PyTorch records the pages it maps and unmaps
(c10/cuda/CUDACachingAllocator.cpp, ``map_block``: ``record_trace(TraceEntry::SEGMENT_MAP,
mapped_range.ptr, mapped_range.size, ...)``; ``unmap_block``: ``SEGMENT_UNMAP``) and its snapshot lists one
segment per contiguous mapped range (``snapshot()``: "we report one segment for each contiguous mapped range
of memory", ``total_size`` the sum of its mapped blocks), not the virtual reservation; so does this one.

A run that the whole-iteration caching-allocator replay found out of memory (the engine's failure
"... (caching-allocator fragmentation)", with ``--allocator-lag`` or without) is cut where the replay
failed: the trace holds the simulator's allocations before the start of the failing request's phase
(`replay_oom_site`) and ends in PyTorch's ``oom`` entry (``{"action": "oom", "device_free", "size", ...}``,
as ``record_trace(TraceEntry::OOM, device_free, params.size(), ...)`` writes it), and ``memo_note`` names
the replay's request and stream lag. The lumps themselves carry no collective buffer, so the lag itself
(``record_stream``, `memo_sim.memplan.iteration_replay.replay_stream`) shows only through that cut.
Frames name the tensor, the layer and the phase.

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
    ``memo_note`` says where the snapshot is not the allocator state the run would have (its lumps did not fit,
    or the whole-iteration replay ran out of memory: the trace ends in its ``oom``)."""
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
