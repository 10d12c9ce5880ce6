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

Mixture of experts: the token dispatcher's collectives run on stream ``ep_comm`` on both sides
(reported as a stream where either timeline has it; overlapped = the part under compute). Per MoE
layer, `alltoall_rows` sets the executor's measured all-to-all time -- the ``ep_comm`` spans named
``moe_dispatch_alltoall_ep`` and ``moe_combine_alltoall_ep`` of that layer, forward, recompute and
backward summed (`memo_exec.moe.dispatchers`) -- beside the simulator's ops of the same names (a
pipeline's tagged by micro-batch, ``...@m1``), with the counts on each side (so a layer one side
prices and the other does not shows) and the ratio measured / predicted. The executor's two other
``ep_comm`` collectives, the per-expert counts' exchange and the router weights' all-to-all
(`UNPRICED_EP_OPS`), are priced by no simulator op: both the ep_comm stream rows and the per-layer
rows leave them out, and `unpriced_ep_seconds` gives their time for the report to show apart.
"""

from __future__ import annotations

import bisect
import dataclasses

from memo_exec.measure import steady_value
from memo_sim.timeline import TP_RING_STREAMS, Timeline

STREAMS = ("compute", "d2h", "h2d")  # always reported; TP_RING_STREAMS and EP_STREAMS where a timeline has them
COPY_STREAMS = ("d2h", "h2d")
EP_STREAMS = ("ep_comm",)  # the MoE dispatcher's collectives (`memo_sim.timeline.STREAMS`)
# collectives a compute op issues and blocks in (the MoE dispatcher's; TP's on ``comm``): not compute time
NESTED_COMM_STREAMS = EP_STREAMS + ("comm",)
# the TP, ring-CP and data-parallel collectives' streams: in the stream rows where a timeline has them
COMM_STREAMS = ("comm", "cp_comm", "dp_comm")
# `memo_exec.moe.dispatchers.A2A_OPS`: the alltoall dispatcher's rows, and DeepEP's deduplicated ones
ALLTOALL_OPS = ("moe_dispatch_alltoall_ep", "moe_combine_alltoall_ep", "moe_dispatch_alltoall_dedup_ep",
                "moe_combine_alltoall_dedup_ep")
# the executor's other ep_comm collectives, which the simulator does not price (`memo_exec.moe.dispatchers`: the
# per-expert counts' exchange, the copies' router weights and the deepep dispatcher's slots): left out of ep_comm's
# stream rows and the per-layer all-to-all rows alike, and reported beside them (`unpriced_ep_seconds`)
UNPRICED_EP_OPS = ("moe_dispatch_counts_alltoall_ep", "moe_dispatch_probs_alltoall_ep",
                   "moe_dispatch_slots_alltoall_ep")


def alltoall_names() -> str:
    """The rows' all-to-alls as the reports name them: each dispatcher's dispatch + combine (`ALLTOALL_OPS`)."""
    pairs = [ALLTOALL_OPS[i:i + 2] for i in range(0, len(ALLTOALL_OPS), 2)]
    return " or ".join(" + ".join(f"`{o}`" for o in p) for p in pairs)
OP_CLASSES = (("forward", "compute", "fwd"), ("recompute", "compute", "recompute"), ("backward", "compute", "bwd"),
              ("offload", "d2h", "offload"), ("prefetch", "h2d", "prefetch"))


REL_ERROR_FLOOR = 1e-9  # a prediction below this (1 ns, 1 byte) is a float residue of zero: no relative error


def rel_error(measured, predicted):
    """(measured - predicted) / predicted; None where either is missing or the prediction is zero
    (within the engine's float residue, ``REL_ERROR_FLOOR``: an exposed time of 1e-19 s once printed
    as an error of 6e13 %)."""
    if measured is None or predicted is None or abs(predicted) < REL_ERROR_FLOOR:
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
                       schedule=plan.schedule, micro_batch=plan.micro_batch,  # the plan's pipeline, as it ran
                       classifier_chunk_tokens=plan.classifier_chunk_tokens, keep_timeline=True)
    except MemoError as e:
        return None, f"the simulator refused the plan ({str(e).splitlines()[0]})"
    note = f"re-simulated: {layers} layers on profile {plan.profile}"
    if res.status != "OK":
        note += f" (simulated status {res.status}: the timeline stops at the failure)"
    return res, note


def stale_prediction(plan, sim) -> str | None:
    """Why the plan's stored prediction is not what the simulator predicts for it now -- a hand-edited plan, or one
    predicted with another profile or memo version -- or None; ``sim`` is the plan re-simulated as it stands
    (`resimulate` with every layer). The rule is `memo-sim check-plan`'s (`memo_sim.plan.stale`), over every
    number the report compares: the step time, MFU, tokens/s, exposed copy time, the peaks and the plan's
    ``layer_timings_s`` (`memo_sim.plan.stale.stale_plan`; a review's plan with every layer timing x 10, or its MFU
    set to 0.9, was compared with without a warning, its step time unchanged)."""
    if sim is None:
        return None
    from memo_sim.plan.stale import stale_plan  # noqa: PLC0415

    words = stale_plan(plan, sim)
    if words is None:
        return None
    why = ("the plan was edited, or predicted with another profile or memo version" if plan.predicted.source ==
           "simulated" else f"the stored one is the {plan.predicted.source} estimate, or the plan was edited")
    return f"the plan's {words} ({why})"


def sim_memory_breakdown(plan, layers: int) -> dict | None:
    """The simulator's memory breakdown for the plan with ``layers`` layers (``to_dict()``), or None
    when it cannot be computed; a micro-batch pipeline's is stage 0's, in the plan's schedule and
    micro-batch (`memo_sim.search.pipeline.pipeline_memory`): rank 0 holds stage 0, and its estimate is
    what the terms are compared with (the plan's peak, the fullest stage's, is the totals' row); an SPPO plan's
    (any ``pp``) is stage 0's of the SPPO walk (`memo_sim.memplan.footprint.sppo_memory`, the plan's own
    ``memory_breakdown_bytes`` where stage 0 is the fullest), not the single-stage `memory_breakdown`, which
    prices a whole layer's activations for one sequence and none of the SPPO pieces."""
    try:
        from memo_sim.api import load_profile, memory_breakdown, pipeline_memory, sppo_memory  # noqa: PLC0415
        from memo_sim.errors import MemoError  # noqa: PLC0415
    except ImportError:
        return None
    model = dataclasses.replace(plan.model, layers=layers)
    try:
        if plan.schedule == "sppo":
            pm = sppo_memory(model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, load_profile(plan.profile))
            return pm.stages[0].breakdown.to_dict()
        if plan.layout.pp > 1 and plan.schedule in ("1f1b", "interleaved_1f1b"):
            mem, _rows = pipeline_memory(model, plan.layout, plan.batch, plan.micro_batch, plan.seq_tokens, plan.policy,
                                         load_profile(plan.profile), plan.schedule, stage=0)
            return mem.to_dict()
        # one micro-batch in flight (gradient accumulation runs them one after the other)
        mem = memory_breakdown(model, plan.layout, plan.micro_batch or plan.batch, plan.seq_tokens, plan.policy,
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


def side_streams(timelines: list[Timeline | None]) -> tuple[str, ...]:
    """The streams beside compute and the copies that any of the timelines uses and the stream rows
    report: METP's ring streams, the MoE dispatcher's ``ep_comm`` and the collectives' (`COMM_STREAMS`)."""
    used = {e.stream for t in timelines if t is not None for e in t.events}
    return ring_streams(timelines) + tuple(s for s in EP_STREAMS + COMM_STREAMS if s in used)


def ring_stall_seconds(tl: Timeline) -> dict[str, float]:
    """Measured exposed METP ring time per stream: the compute stream's waits on it
    (`memo_exec.metp.lane.exposed_ring_seconds`)."""
    from memo_exec.metp.lane import exposed_ring_seconds  # noqa: PLC0415 - torch.distributed, METP runs only

    return exposed_ring_seconds(tl.events)


def spans_minus(a, b) -> list[tuple[float, float]]:
    """The parts of the sorted disjoint spans ``a`` outside the sorted disjoint spans ``b``."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def compute_spans(tl: Timeline) -> list[tuple[float, float]]:
    """The compute stream's busy spans, less the time it sat blocked in a collective it issued: a MoE dispatcher
    all-to-all (``ep_comm``) or a tensor-parallel all-gather / reduce-scatter / all-reduce (``comm``) that lies
    inside a compute op (`nested_comm`): each is blocking, so the op that issues it -- the executor's ``moe`` op, a
    TP layer's ``qkv`` or ``fc1`` -- holds the wait (a TP 2 run on CPU read compute +182% and its collectives
    'overlapped'). A collective beside the compute ops, only partly under one, runs on its own stream and
    overlaps; the simulator's compute ops never contain one, so its timeline is unchanged."""
    return spans_minus(busy_spans(tl, ("compute",)), union_spans([(e.start, e.end) for e, _c in nested_comm(tl)]))


def nested_comm(tl: Timeline) -> list[tuple]:
    """(collective, the compute op of a layer that holds it) for each ``NESTED_COMM_STREAMS`` event lying inside a
    compute op of its device (and of its layer and phase, where it names them)."""
    nested = [e for e in tl.events if e.stream in NESTED_COMM_STREAMS and e.phase != "stall"]
    if not nested:
        return []
    ops: dict[object, list] = {}  # each device's compute ops of a layer, by start
    for c in tl.events:
        if c.stream == "compute" and c.layer is not None and c.phase != "stall":
            ops.setdefault(c.device, []).append(c)
    for cs in ops.values():
        cs.sort(key=lambda c: c.start)
    starts = {d: [c.start for c in cs] for d, cs in ops.items()}
    out = []
    for e in nested:  # the compute op that issued it: the last to start at or before it, if it holds it
        i = bisect.bisect_right(starts.get(e.device, []), e.start) - 1
        if i >= 0:
            c = ops[e.device][i]
            if e.end <= c.end and (e.layer is None or (e.layer, e.phase) == (c.layer, c.phase)):
                out.append((e, c))
    return out


def base_op(op: str) -> str:
    """An op's name without the simulator's micro-batch tag (``moe_dispatch_alltoall_ep@m1`` in a pipeline's
    timeline, `memo_sim.engine.schedules.microbatch`) or the executor's action tag (``...@c0.mb1``)."""
    return op.split("@", 1)[0]


def is_unpriced_ep(e) -> bool:
    """An ``ep_comm`` span of a collective the simulator does not price (`UNPRICED_EP_OPS`)."""
    return e.stream in EP_STREAMS and base_op(e.op) in UNPRICED_EP_OPS


def unpriced_ep_seconds(tl: Timeline) -> float:
    """Seconds of the ``ep_comm`` spans the simulator does not price (`UNPRICED_EP_OPS`)."""
    return sum(e.duration for e in tl.events if is_unpriced_ep(e) and e.phase != "stall")


def stream_stats(tl: Timeline, extra: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """busy / overlapped / exposed seconds of each of compute, d2h, h2d and the ``extra``
    (ring, ep_comm) streams; ep_comm's without the collectives the simulator does not price
    (`UNPRICED_EP_OPS`: `unpriced_ep_seconds` has them), as the per-layer all-to-all rows."""
    compute, copies = compute_spans(tl), busy_spans(tl, COPY_STREAMS)
    out = {}
    for s in STREAMS + extra:
        if s in EP_STREAMS:
            mine = union_spans([(e.start, e.end) for e in tl.events
                                if e.stream == s and e.phase != "stall" and not is_unpriced_ep(e)])
        else:
            mine = compute if s == "compute" else busy_spans(tl, (s,))
        other = copies if s == "compute" else compute
        busy, over = spans_length(mine), spans_intersection(mine, other)
        out[s] = {"busy_s": busy, "overlapped_s": over, "exposed_s": busy - over}
    return out


def op_times(tl: Timeline) -> dict[tuple[int, str], float]:
    """(layer, op class) -> seconds. A MoE all-to-all (``ep_comm``) that lies inside a compute op of
    its layer and phase (the executor's blocking collective inside its ``moe`` op) is not that
    class's compute time: its duration is taken off (`compute_spans`), as is a TP collective's (``comm``) inside
    its layer's compute op."""
    out: dict[tuple[int, str], float] = {}
    for e in tl.events:
        if e.layer is None:
            continue
        for cls, stream, phase in OP_CLASSES:
            if e.stream == stream and e.phase == phase:
                out[(e.layer, cls)] = out.get((e.layer, cls), 0.0) + e.duration
    cls_of = {phase: cls for cls, stream, phase in OP_CLASSES if stream == "compute"}
    for e, c in nested_comm(tl):
        if c.phase in cls_of:
            key = (c.layer, cls_of[c.phase])
            out[key] = out.get(key, 0.0) - e.duration
    return out


# --------------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------------
def _steady_dicts(ds: list[dict]) -> dict:
    keys = {k for d in ds for k in d}
    return {k: steady_value([d.get(k, 0.0) for d in ds]) for k in keys}


def stream_rows(measured: list[Timeline], predicted: Timeline | None) -> list[dict]:
    """One row per stream and quantity; measured values are medians over the given steps (`steady_value`)."""
    rings = side_streams([*measured, predicted])
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


# the head's spans outside the layers: the executor's classifier (its chunked logits, loss and their backward)
# and its multi-token-prediction modules (`memo_exec.mtp.SPAN`), which the simulator prices as one ``classifier``
# op (`memo_sim.cost.boundary.boundary_times`: the classifier's pass plus `mtp_seconds`)
HEAD_SPANS = ("classifier", "mtp")
HEAD_OP = "head: classifier and loss, forward and backward"
HEAD_MTP_OP = HEAD_OP + ", with the multi-token-prediction modules"


def head_seconds(tl: Timeline) -> float | None:
    """Seconds the compute stream spent on the head in ``tl`` (every micro-batch), None where it ran none: the
    simulator's ``classifier`` ops, the executor's ``classifier`` and ``mtp`` spans (`HEAD_SPANS`; their
    union, so that a span inside another counts once)."""
    spans = [(e.start, e.end) for e in tl.events if e.stream == "compute" and e.layer is None
             and e.phase != "stall" and (e.phase == "classifier" or base_op(e.op) in HEAD_SPANS)]
    return spans_length(union_spans(spans)) if spans else None


def op_rows(measured: list[Timeline], predicted: Timeline | None, mtp: bool = False) -> list[dict]:
    """One row per layer and op class present on either side, then the head's (layer None, `head_seconds`;
    ``mtp``: the plan's model has multi-token-prediction modules, which its row names)."""
    meas = _steady_dicts([{f"{k[0]}:{k[1]}": v for k, v in op_times(t).items()} for t in measured])
    pred = op_times(predicted) if predicted is not None else {}
    keys = {(int(k.split(":")[0]), k.split(":")[1]) for k in meas} | set(pred)
    order = {c[0]: n for n, c in enumerate(OP_CLASSES)}
    rows = []
    for layer, cls in sorted(keys, key=lambda k: (k[0], order[k[1]])):
        m, p = meas.get(f"{layer}:{cls}"), pred.get((layer, cls)) if predicted is not None else None
        rows.append({"layer": layer, "op": cls, "measured_s": m, "predicted_s": p, "rel_error": rel_error(m, p)})
    heads = [h for h in map(head_seconds, measured) if h is not None]
    m = steady_value(heads) if heads else None
    p = head_seconds(predicted) if predicted is not None else None
    if m is not None or p is not None:
        rows.append({"layer": None, "op": HEAD_MTP_OP if mtp else HEAD_OP, "measured_s": m, "predicted_s": p,
                     "rel_error": rel_error(m, p)})
    return rows


def alltoall_times(tl: Timeline) -> dict[int, tuple[float, int]]:
    """layer -> (seconds, count) of the MoE dispatch and combine all-to-alls on ``ep_comm``
    (`ALLTOALL_OPS`, every phase and micro-batch: a pipeline's simulated ops carry an ``@m<k>`` tag)."""
    out: dict[int, tuple[float, int]] = {}
    for e in tl.events:
        if e.stream in EP_STREAMS and base_op(e.op) in ALLTOALL_OPS and e.layer is not None and e.phase != "stall":
            t, n = out.get(e.layer, (0.0, 0))
            out[e.layer] = (t + e.duration, n + 1)
    return out


def alltoall_rows(measured: list[Timeline], predicted: Timeline | None) -> list[dict]:
    """One row per layer with a MoE all-to-all on either side: measured seconds (median over the
    given steps, `steady_value`), predicted seconds, how many all-to-alls each side counted, the
    ratio measured / predicted and rel_error. Empty for a plan without expert-parallel all-to-alls."""
    meas = [alltoall_times(t) for t in measured]
    pred = alltoall_times(predicted) if predicted is not None else {}
    rows = []
    for layer in sorted({k for d in meas for k in d} | set(pred)):
        n = max((d.get(layer, (0.0, 0))[1] for d in meas), default=0)
        m = steady_value([d.get(layer, (0.0, 0))[0] for d in meas]) if n else None  # None: no all-to-all ran
        p, np_ = pred.get(layer, (None, 0)) if predicted is not None else (None, 0)
        rows.append({"layer": layer, "op": "moe all-to-all (dispatch + combine)", "measured_s": m, "predicted_s": p,
                     "measured_count": n, "predicted_count": np_,
                     "ratio": (m / p) if m is not None and p else None, "rel_error": rel_error(m, p)})
    return rows
