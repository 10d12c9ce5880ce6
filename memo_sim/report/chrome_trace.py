"""Chrome trace (Perfetto / chrome://tracing) from a `Timeline`.

One process (pid) per GPU of the timeline with one track (tid) per stream; a simulated timeline
holds one GPU per group of identical GPUs (every rank of a single-stage plan, every rank of one
pipeline stage), and its process name says which GPUs it stands for (`memo_sim.report.ranks`).
Tracks are named by ``thread_name`` metadata and ordered compute, comm, cp_comm, tp_p2p, tp_bcast,
dp_comm, d2h, h2d, then any other stream; every op is an
``"X"`` complete event (``ts`` and ``dur`` in microseconds) with its layer, phase, bytes and
FLOPs in ``args``. Memory is a ``"C"`` counter per GPU (allocated GiB) on the GPU's process and
one per node's pinned host memory on a process of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

from memo_sim.fileio import atomic_write_text
from memo_sim.report.ranks import device_role
from memo_sim.timeline import Timeline

STREAM_ORDER = ("compute", "comm", "cp_comm", "ep_comm", "tp_p2p", "tp_bcast", "dp_comm", "d2h", "h2d")
STREAM_LABEL = {
    "compute": "compute", "comm": "comm (TP/Ulysses, NVLink)", "cp_comm": "cp_comm (ring CP)",
    "ep_comm": "ep_comm (MoE token dispatch)",
    "tp_p2p": "tp_p2p (METP ring send/recv)", "tp_bcast": "tp_bcast (METP weight broadcast/reduce)",
    "dp_comm": "dp_comm (gradients)", "d2h": "d2h (offload copy engine)", "h2d": "h2d (prefetch copy engine)",
}
HOST_PID_BASE = 10_000  # node n's host memory is process HOST_PID_BASE + n
GiB = 1024**3


def _tids(timeline: Timeline) -> dict[str, int]:
    streams = sorted({e.stream for e in timeline.events},
                     key=lambda s: (STREAM_ORDER.index(s) if s in STREAM_ORDER else len(STREAM_ORDER), s))
    return {s: i + 1 for i, s in enumerate(streams)}


def chrome_trace(timeline: Timeline) -> dict:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    tids = _tids(timeline)
    devices = sorted({e.device for e in timeline.events} | {m.device for m in timeline.memory if m.kind == "gpu"})
    hosts = sorted({m.device for m in timeline.memory if m.kind == "host"})
    meta = timeline.meta or {}
    dev = timeline.device_word
    title = " ".join(str(meta[k]) for k in ("model", "layout", "policy") if meta.get(k))
    ev: list[dict] = []
    for d in devices:
        ev.append({"ph": "M", "name": "process_name", "pid": d, "tid": 0,
                   "args": {"name": device_role(timeline, d) + (f" - {title}" if title else "")}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": d, "tid": 0, "args": {"sort_index": d}})
        streams_here = sorted({e.stream for e in timeline.events if e.device == d}, key=lambda s: tids[s])
        for s in streams_here:
            ev.append({"ph": "M", "name": "thread_name", "pid": d, "tid": tids[s],
                       "args": {"name": STREAM_LABEL.get(s, s)}})
            ev.append({"ph": "M", "name": "thread_sort_index", "pid": d, "tid": tids[s],
                       "args": {"sort_index": tids[s]}})
    for h in hosts:
        node = -1 - h
        ev.append({"ph": "M", "name": "process_name", "pid": HOST_PID_BASE + node, "tid": 0,
                   "args": {"name": f"host memory, node {node}"}})
    for e in timeline.events:
        label = e.op if e.layer is None else f"{e.op} L{e.layer}"
        args = {"layer": e.layer, "phase": e.phase}
        if e.nbytes:
            args["bytes"] = e.nbytes
        if e.flops:
            args["flops"] = e.flops
        ev.append({"ph": "X", "name": label, "cat": e.phase, "pid": e.device, "tid": tids[e.stream],
                   "ts": e.start * 1e6, "dur": max(0.0, e.end - e.start) * 1e6, "args": args})
    for m in timeline.memory:
        if m.kind == "gpu":
            ev.append({"ph": "C", "name": f"{dev} memory (GiB)", "pid": m.device, "tid": 0, "ts": m.time * 1e6,
                       "args": {"allocated": m.nbytes / GiB}})
        else:
            ev.append({"ph": "C", "name": "pinned host memory (GiB)", "pid": HOST_PID_BASE + (-1 - m.device),
                       "tid": 0, "ts": m.time * 1e6, "args": {"allocated": m.nbytes / GiB}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) or v is None}}


def write_chrome_trace(timeline: Timeline, path: str | Path) -> Path:
    """Write the trace JSON; open it in https://ui.perfetto.dev or chrome://tracing."""
    return atomic_write_text(path, json.dumps(chrome_trace(timeline), separators=(",", ":")) + "\n")
