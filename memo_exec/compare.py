"""Measured against predicted, stream by stream and op class by op class, layer by layer.

The prediction is the plan re-simulated with the simulator's public API
(`memo_sim.api.simulate`, ``keep_timeline=True``) for the layers the executor ran, on
the plan's profile, layout, batch, sequence length, policy and classifier chunk. Both sides are
`memo_sim.timeline.Timeline` s, so the same functions measure both.

Per stream (compute, d2h, h2d, and METP's tp_p2p / tp_bcast where either side has them):
``busy`` is the union of the stream's op intervals (compute-stream stalls -- waits on copy
events or ring transfers -- are not work); ``overlapped`` is the part of ``busy`` during which
the other side runs (for a copy or ring stream: compute; for compute: either copy stream);
``exposed`` = busy - overlapped (a copy or ring stream: transfer time not hidden under compute).
METP's exposed ring time proper -- the time the compute stream waited on the ring -- is
`ring_stall_seconds` (the executor's ``wait_tp_p2p`` / ``wait_tp_bcast`` stall spans) against the
simulator's ``exposed_p2p_s`` (its streams' waits on tp_p2p / tp_bcast).

Per layer and op class: forward, recompute, backward (the summed compute ops of that layer's
phase), offload, prefetch (that layer's copy). Every row carries
rel_error = (measured - predicted) / predicted.
"""

from __future__ import annotations

import dataclasses

from memo_exec.measure import steady_value
from memo_sim.timeline import TP_RING_STREAMS, Timeline

STREAMS = ("compute", "d2h", "h2d")  # always reported; TP_RING_STREAMS where a timeline has them
COPY_STREAMS = ("d2h", "h2d")
OP_CLASSES = (("forward", "compute", "fwd"), ("recompute", "compute", "recompute"), ("backward", "compute", "bwd"),
              ("offload", "d2h", "offload"), ("prefetch", "h2d", "prefetch"))


def rel_error(measured, predicted):
    if measured is None or predicted is None or not predicted:
        return None
    return (measured - predicted) / predicted


# --------------------------------------------------------------------------------------------------
# prediction
# --------------------------------------------------------------------------------------------------
def resimulate(plan, layers: int):
    """(SimResult, note) for the plan's ``layers``-layer model, or (None, why not)."""
    try:
        from memo_sim.api import load_profile, simulate  # noqa: PLC0415 - the simulator needs simpy
        from memo_sim.errors import MemoError  # noqa: PLC0415
    except ImportError as e:
        return None, f"the simulator cannot run here ({e})"
    model = dataclasses.replace(plan.model, layers=layers)
    try:
        res = simulate(model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, load_profile(plan.profile),
                       classifier_chunk_tokens=plan.classifier_chunk_tokens, keep_timeline=True)
    except MemoError as e:
        return None, f"the simulator refused the plan ({str(e).splitlines()[0]})"
    note = f"re-simulated: {layers} layers on profile {plan.profile}"
    if res.status != "OK":
        note += f" (simulated status {res.status}: the timeline stops at the failure)"
    return res, note


def sim_memory_breakdown(plan, layers: int) -> dict | None:
    """The simulator's memory breakdown for the plan with ``layers`` layers (``to_dict()``), or None
    when it cannot be computed."""
    try:
        from memo_sim.api import load_profile, memory_breakdown  # noqa: PLC0415
        from memo_sim.errors import MemoError  # noqa: PLC0415
    except ImportError:
        return None
    model = dataclasses.replace(plan.model, layers=layers)
    try:
        mem = memory_breakdown(model, plan.layout, plan.batch, plan.seq_tokens, plan.policy,
                               load_profile(plan.profile), plan.classifier_chunk_tokens)
    except MemoError:  # e.g. an unknown profile: the report shows the simulator column empty
        return None
    return mem.to_dict()


# --------------------------------------------------------------------------------------------------
# interval arithmetic
# --------------------------------------------------------------------------------------------------
def union_spans(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def spans_length(spans) -> float:
    return sum(e - s for s, e in spans)


def spans_intersection(a, b) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def busy_spans(tl: Timeline, streams: tuple[str, ...]) -> list[tuple[float, float]]:
    return union_spans([(e.start, e.end) for e in tl.events if e.stream in streams and e.phase != "stall"])


def ring_streams(timelines: list[Timeline | None]) -> tuple[str, ...]:
    """METP's streams that any of the timelines uses."""
    used = {e.stream for t in timelines if t is not None for e in t.events}
    return tuple(s for s in TP_RING_STREAMS if s in used)


def ring_stall_seconds(tl: Timeline) -> dict[str, float]:
    """Measured exposed METP ring time per stream: the compute stream's waits on it
    (`memo_exec.metp.lane.exposed_ring_seconds`)."""
    from memo_exec.metp.lane import exposed_ring_seconds  # noqa: PLC0415 - torch.distributed, METP runs only

    return exposed_ring_seconds(tl.events)


def stream_stats(tl: Timeline, extra: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """busy / overlapped / exposed seconds of each of compute, d2h, h2d and the ``extra``
    (ring) streams."""
    compute, copies = busy_spans(tl, ("compute",)), busy_spans(tl, COPY_STREAMS)
    out = {}
    for s in STREAMS + extra:
        mine = busy_spans(tl, (s,))
        other = copies if s == "compute" else compute
        busy, over = spans_length(mine), spans_intersection(mine, other)
        out[s] = {"busy_s": busy, "overlapped_s": over, "exposed_s": busy - over}
    return out


def op_times(tl: Timeline) -> dict[tuple[int, str], float]:
    """(layer, op class) -> seconds."""
    out: dict[tuple[int, str], float] = {}
    for e in tl.events:
        if e.layer is None:
            continue
        for cls, stream, phase in OP_CLASSES:
            if e.stream == stream and e.phase == phase:
                out[(e.layer, cls)] = out.get((e.layer, cls), 0.0) + e.duration
    return out


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------
def _steady_dicts(ds: list[dict]) -> dict:
    keys = {k for d in ds for k in d}
    return {k: steady_value([d.get(k, 0.0) for d in ds]) for k in keys}


def stream_rows(measured: list[Timeline], predicted: Timeline | None) -> list[dict]:
    """One row per stream and quantity; measured values are medians over the given steps (`steady_value`)."""
    rings = ring_streams([*measured, predicted])
    meas = [stream_stats(t, rings) for t in measured]
    pred = stream_stats(predicted, rings) if predicted is not None else None
    rows = []
    for s in STREAMS + rings:
        m = _steady_dicts([x[s] for x in meas])
        for q in ("busy_s", "exposed_s", "overlapped_s"):
            p = pred[s][q] if pred is not None else None
            rows.append({"stream": s, "quantity": q[:-2], "measured_s": m[q], "predicted_s": p,
                         "rel_error": rel_error(m[q], p)})
    return rows


def op_rows(measured: list[Timeline], predicted: Timeline | None) -> list[dict]:
    """One row per layer and op class present on either side."""
    meas = _steady_dicts([{f"{k[0]}:{k[1]}": v for k, v in op_times(t).items()} for t in measured])
    pred = op_times(predicted) if predicted is not None else {}
    keys = {(int(k.split(":")[0]), k.split(":")[1]) for k in meas} | set(pred)
    order = {c[0]: n for n, c in enumerate(OP_CLASSES)}
    rows = []
    for layer, cls in sorted(keys, key=lambda k: (k[0], order[k[1]])):
        m, p = meas.get(f"{layer}:{cls}"), pred.get((layer, cls)) if predicted is not None else None
        rows.append({"layer": layer, "op": cls, "measured_s": m, "predicted_s": p, "rel_error": rel_error(m, p)})
    return rows
