"""[sim-speed] The second round of engine speed-ups changes no number:

- a flow alone in its component of the link network takes its rate without the progressive-filling
  loop (`FluidNetwork.single_flow_shortcut`): the timeline equals the loop's exactly;
- `exposed_wait_seconds` walks each stream in issue order instead of sorting every op: it equals
  the sorting definition exactly;
- an engine that keeps no memory samples (``keep_memory=False``, what the what-if's tier 2 runs)
  reports the same peaks, end bytes and failure;
- `emit_chain` builds an SPPO piece's phase with the shape of a phase list seen before (same op
  names, streams and overlaps): the graph equals one built from a cold shape cache.
"""

from __future__ import annotations

import dataclasses

import pytest

from memo_sim.engine.schedules import single_stage as schedules
from memo_sim.engine.core import Engine
from memo_sim.engine.fluid import FluidNetwork
from memo_sim.engine.schedules.sppo import build_pipeline_iteration
from memo_sim.engine.schedules import build_iteration
from memo_sim.engine.simulate import exposed_wait_seconds
from memo_sim.timeline import COPY_STREAMS, TP_RING_STREAMS
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.policy.sppo import Sppo
from memo_sim.profile import load_profile
from memo_sim.search.sppo import solve_alphas

K = 1024
A800 = load_profile("a800-80gb")
A100 = load_profile("a100-sxm4-80gb")

CASES = [
    ("gpt-7b", Layout(tp=8), 64 * K, "store_all", None),
    ("gpt-7b", Layout(tp=2, cp=4), 256 * K, "full_offload", None),
    ("gpt-7b", Layout(tp=2, cp=4, zero=3), 1024 * K, "memo", 0.059),
    ("gpt-13b", Layout(tp=8, cp=2, dp=2, zero=1), 256 * K, "memo", 0.3),
    ("gpt-7b", Layout(tp=8, tp_mode="metp"), 256 * K, "memo", 0.4),
    ("gpt-7b", Layout(tp=2, ulysses=4, zero=3), 256 * K, "full_recompute", None),
    ("gpt-7b", Layout(tp=8), 1024 * K, "store_all", None),  # OOM part-way through the forward
]


def _sched(case):
    m, lay, seq, pol, a = case
    return build_iteration(get_model(m), lay, 1, seq, get_policy(pol, a), A800)


def _run(sched, **kw):
    return Engine(sched.graph, A800, gpu_capacity=sched.memory.gpu_capacity_bytes,
                  host_capacity=sched.memory.host_capacity_bytes, **kw).run()


def _times(run):
    return [(op.uid, op.start, op.end) for op in run.ops]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].label()}-{c[3]}")
def test_single_flow_rate_equals_progressive_filling(case, monkeypatch):
    short = _run(_sched(case), record_links=True)
    monkeypatch.setattr(FluidNetwork, "single_flow_shortcut", False)
    full = _run(_sched(case), record_links=True)
    assert _times(short) == _times(full)
    assert short.end_time == full.end_time and short.link_carried == full.link_carried
    assert short.link_log == full.link_log and short.memory == full.memory
    assert (dataclasses.asdict(short.failure) if short.failure else None) == \
        (dataclasses.asdict(full.failure) if full.failure else None)


def _exposed_by_sorting(ops, wait_on):
    """The definition: every op in (start, uid) order, its stream's previous op before it."""
    total = 0.0
    prev_end = {}
    for op in sorted((o for o in ops if o.start is not None), key=lambda o: (o.start, o.uid)):
        key = (op.device, op.stream)
        if op.stream not in wait_on:
            wait_end = max((d.end for d in op.deps if d.stream in wait_on and d.end is not None), default=None)
            if wait_end is not None:
                other = max([prev_end.get(key, 0.0)] + [d.end for d in op.deps
                                                         if d.stream not in wait_on and d.end is not None])
                total += max(0.0, min(wait_end, op.start) - other)
        if op.end is not None:
            prev_end[key] = op.end
    return total


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].label()}-{c[3]}")
def test_exposed_wait_equals_sorting_definition(case):
    run = _run(_sched(case))
    for wait_on in (COPY_STREAMS, TP_RING_STREAMS, ("comm",)):
        assert exposed_wait_seconds(run.ops, wait_on) == _exposed_by_sorting(run.ops, wait_on)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].label()}-{c[3]}")
def test_no_memory_samples_same_peaks(case):
    kept = _run(_sched(case))
    bare = _run(_sched(case), keep_memory=False)
    assert kept.memory and not bare.memory
    assert _times(kept) == _times(bare)
    for f in ("peak_gpu_bytes", "peak_host_bytes", "start_gpu_bytes", "end_gpu_bytes", "end_host_bytes",
              "end_time"):
        assert getattr(kept, f) == getattr(bare, f), f
    assert (dataclasses.asdict(kept.failure) if kept.failure else None) == \
        (dataclasses.asdict(bare.failure) if bare.failure else None)


def _graph_rows(g):
    return [(op.uid, op.name, op.device, op.stream, op.kind, op.phase, op.layer, op.work, op.link,
             tuple(d.uid for d in op.deps), op.mem_start, op.mem_end) for op in g.ops]


def test_shape_by_content_equals_cold_shapes():
    model, lay, seq = get_model("gpt-7b"), Layout(tp=4, pp=2), 256 * K
    pol = Sppo(None, subseqs=4, multiplex=True).with_bounds(model, lay, 1, seq)
    pol = solve_alphas(model, lay, 1, seq, pol, A100)[0]
    warm = build_pipeline_iteration(model, lay, 1, seq, pol, A100, detail="ops")
    schedules._SHAPES.clear()
    schedules._SHAPES_BY_CONTENT.clear()
    cold_rows = []
    real = schedules._chain_rows

    def cold(costs, layout, profile):  # every phase list worked out afresh
        schedules._SHAPES.clear()
        schedules._SHAPES_BY_CONTENT.clear()
        return real(costs, layout, profile)

    schedules._chain_rows = cold
    try:
        cold_rows = _graph_rows(build_pipeline_iteration(model, lay, 1, seq, pol, A100, detail="ops").graph)
    finally:
        schedules._chain_rows = real
    assert _graph_rows(warm.graph) == cold_rows
