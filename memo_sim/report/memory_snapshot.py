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
the snapshot says so (``memo_note``). For a policy
with a static memory plan (MEMO) the runtime places a layer's transients inside one arena, which
the simulator's requests stand for as lumps (the arena's phase peaks), so the addresses there are
the lumps' under the caching allocator, not the plan's offsets. Frames name the tensor, the layer
and the phase.

Format (PyTorch's, as ``torch.cuda._memory_viz`` reads it): ``{"segments": [...], "device_traces":
[[...]]}``; a trace entry is ``{"action": "alloc" | "free_requested" | "free_completed" |
"segment_alloc", "addr", "size", "stream": 0, "time_us", "frames": [{"filename", "line", "name"}]}``
(alloc and free sizes are the requested bytes); a segment is ``{"device", "address", "total_size",
"allocated_size", "active_size", "requested_size", "stream": 0, "segment_type": "small" | "large",
"segment_pool_id": [0, 0], "is_expandable", "frames": [], "blocks": [{"address", "size",
"requested_size", "state": "active_allocated" | "inactive", "frames"}]}``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from memo_sim.engine.result import SimResult
from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_bytes
from memo_sim.memplan.allocator_report import AllocatorOutOfMemory
from memo_sim.memplan.caching_allocator import AllocatorConfig, CachingAllocatorModel
from memo_sim.memplan.iteration_replay import allocator_config
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
        if not cands:
            raise MemoError(f"no allocation at {s.time} s to match the simulator's memory sample")
        best = min(range(len(cands)), key=lambda i: (abs(cands[i].nbytes - delta), i))
        out.append(cands.pop(best))
    return out


def predicted_snapshot(res: SimResult, profile: HardwareProfile | None = None, device: int = 0) -> dict:
    """The snapshot dict of ``device`` (see the module docs) on ``profile``'s GPU (None: an unbounded one)."""
    stream = allocation_stream(res, device)
    if profile is not None:
        lay = res.layout
        try:
            return _snapshot(stream, allocator_config(profile, None, lay.expandable_segments, None, lay.alloc_conf),
                             device)
        except AllocatorOutOfMemory as e:
            snap = _snapshot(stream, AllocatorConfig(capacity_bytes=1 << 62), device)
            snap["memo_note"] = (f"the simulator's lumped requests did not fit {profile.name}'s usable memory in the "
                                 f"caching-allocator model ({e}); addresses are an unbounded allocator's")
            return snap
    return _snapshot(stream, AllocatorConfig(capacity_bytes=1 << 62), device)


def _snapshot(stream: list[Allocation], config: AllocatorConfig, device: int) -> dict:
    """`predicted_snapshot` with the allocator ``config``."""
    model = CachingAllocatorModel(config)
    live: dict[str, list[tuple[str, int]]] = {}
    trace: list[dict] = []
    frames_of: dict[str, list[dict]] = {}
    held = {sg["address"]: sg["size"] for sg in model.segments()}
    for k, a in enumerate(stream):
        frames = [{"filename": "model" if a.layer is None else f"layer {a.layer}", "line": 0,
                   "name": f"{a.tensor} ({a.phase})"}]
        t_us = int(round(a.time_s * 1e6))
        size = int(round(abs(a.nbytes)))
        if a.nbytes > 0:
            bid = f"{a.tensor}#{k}"
            addr = model.malloc(bid, max(size, 1), step=k)
            now = {sg["address"]: sg["size"] for sg in model.segments()}
            for base in sorted(set(held) - set(now)):  # released to make room (PyTorch's free-and-retry)
                trace.append({"action": "segment_free", "addr": base, "size": held[base], "stream": 0,
                              "time_us": t_us, "frames": frames})
            for base in sorted(b for b in now if held.get(b) != now[b]):  # new, or an expandable one grown
                trace.append({"action": "segment_alloc", "addr": base, "size": now[base] - held.get(base, 0),
                              "stream": 0, "time_us": t_us, "frames": frames})
            held = now
            live.setdefault(a.tensor, []).append((bid, size))
            frames_of[bid] = frames
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t_us,
                          "frames": frames})
        else:
            mine = live.get(a.tensor) or []
            if not mine:
                raise MemoError(f"the simulator frees {a.tensor!r} at {a.time_s} s without an allocation")
            i = min(range(len(mine)), key=lambda j: (abs(mine[j][1] - size), -j))
            bid, was = mine.pop(i)
            addr = model.address_of(bid)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": addr, "size": was, "stream": 0, "time_us": t_us,
                              "frames": frames_of[bid]})
            model.free(bid, step=k)
    by_addr = {}
    for bids in live.values():
        for bid, _ in bids:
            by_addr[model.address_of(bid)] = frames_of[bid]
    segments = []
    for sg in model.segments():
        blocks = [{"address": b["address"], "size": b["size"], "requested_size": b["requested"],
                   "state": "active_allocated" if b["state"] == "allocated" else "inactive",
                   "frames": by_addr.get(b["address"], [])} for b in sg["blocks"] if b["state"] != "unmapped"]
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segments.append({"device": device, "address": sg["address"], "total_size": sg["size"],
                         "allocated_size": allocated, "active_size": allocated,
                         "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
                         "segment_type": "small" if sg["small"] else "large", "segment_pool_id": [0, 0],
                         "is_expandable": sg["expandable"], "frames": [], "blocks": blocks})
    return {"segments": segments, "device_traces": [trace]}


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
