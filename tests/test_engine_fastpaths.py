"""[sim-speed] The engine's fast paths -- kernels as plain timeouts where no host copy can slow
them, a kernel re-timed when a copy of its device starts or ends (by an interrupt where it speeds
up, when its timeout comes where it slowed down), collectives
whose links no other stream uses as plain timeouts, rates recomputed per connected component of
the link network -- give the timeline of the reference engine (every kernel and collective a
flow of the fluid network) within 1e-9, on every policy, METP and SPPO included."""

from __future__ import annotations

import dataclasses
import math

import pytest

from memo_sim.engine.core import Engine
from memo_sim.engine.schedules.sppo import build_pipeline_iteration
from memo_sim.engine.schedules import build_iteration
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
    ("gpt-7b", Layout(tp=4, cp=2), 256 * K, "full_recompute", None),
    ("gpt-7b", Layout(tp=2, cp=4), 256 * K, "full_offload", None),
    ("gpt-7b", Layout(tp=2, cp=4, zero=3), 1024 * K, "memo", 0.059),
    ("gpt-7b", Layout(tp=8, sp=False), 128 * K, "memo", 0.5),
    ("gpt-13b", Layout(tp=8, cp=2, dp=2, zero=1), 256 * K, "memo", 0.3),
    ("gpt-7b", Layout(tp=8, tp_mode="metp"), 256 * K, "memo", 0.4),
    ("gpt-7b", Layout(tp=8, tp_mode="metp_ffn"), 256 * K, "full_offload", None),
    ("gpt-7b", Layout(tp=2, ulysses=4, zero=3), 256 * K, "full_recompute", None),
]


def _graph(case, profile=A800):
    m, lay, seq, pol, a = case
    sched = build_iteration(get_model(m), lay, 1, seq, get_policy(pol, a), profile)
    return sched.graph, sched.memory.gpu_capacity_bytes, sched.memory.host_capacity_bytes


def _run(graph, gcap, hcap, profile, fast):
    run = Engine(graph, profile, gpu_capacity=gcap, host_capacity=hcap, fast_paths=fast).run()
    return run, [(op.uid, op.start, op.end) for op in graph.ops]


def _same(build, profile):
    g1, gcap, hcap = build()
    g2, _, _ = build()
    fast, ops_fast = _run(g1, gcap, hcap, profile, True)
    ref, ops_ref = _run(g2, gcap, hcap, profile, False)
    assert (fast.failure is None) == (ref.failure is None)
    tol = 1e-9 * max(ref.end_time, 1e-9)
    assert math.isclose(fast.end_time, ref.end_time, rel_tol=1e-9)
    for (u, s1, e1), (_, s2, e2) in zip(ops_fast, ops_ref):
        if s2 is None:
            assert s1 is None
            continue
        assert abs(s1 - s2) <= tol, (u, s1, s2)
        assert (e1 is None) == (e2 is None) and (e2 is None or abs(e1 - e2) <= tol), (u, e1, e2)
    for d in ref.peak_gpu_bytes:
        assert fast.peak_gpu_bytes[d] == ref.peak_gpu_bytes[d]
    for name, carried in ref.link_carried.items():
        assert math.isclose(fast.link_carried[name], carried, rel_tol=1e-9, abs_tol=1e-3), name
    return fast


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].label()}-{c[3]}")
def test_fast_paths_equal_reference(case):
    run = _same(lambda: _graph(case), A800)
    assert run.failure is None


@pytest.mark.parametrize("tp,pp,seq,n,mux", [(8, 2, 256 * K, 4, False), (4, 4, 256 * K, 8, True)])
def test_fast_paths_equal_reference_sppo(tp, pp, seq, n, mux):
    model, lay = get_model("gpt-7b"), Layout(tp=tp, pp=pp)
    pol = Sppo(None, subseqs=n, multiplex=mux).with_bounds(model, lay, 1, seq)
    pol = solve_alphas(model, lay, 1, seq, pol, A100)[0]

    def build():
        sched = build_pipeline_iteration(model, lay, 1, seq, pol, A100, detail="ops")
        mem = sched.memory.breakdown
        return sched.graph, mem.gpu_capacity_bytes, mem.host_capacity_bytes

    assert _same(build, A100).failure is None


def test_fast_paths_equal_reference_when_memory_runs_out():
    case = ("gpt-7b", Layout(tp=8), 1024 * K, "store_all", None)  # OOM part-way through the forward
    g1, gcap, hcap = _graph(case)
    g2, _, _ = _graph(case)
    fast, _ = _run(g1, gcap, hcap, A800, True)
    ref, _ = _run(g2, gcap, hcap, A800, False)
    assert fast.failure is not None and dataclasses.asdict(fast.failure) == dataclasses.asdict(ref.failure)


def _copy_over_kernels():
    """Kernels a copy slows part of the way (the copy starts inside one and ends inside another),
    one started while the copy runs, and two copies back to back over a long kernel (slowed,
    sped up, slowed again): the re-timings the fast path does lazily or by an interrupt."""
    from memo_sim.engine.graph import Device, OpGraph

    g = OpGraph([Device(0)])
    bw = float(A800.host_link.d2h_bandwidth)
    wait = g.add("wait", device=0, stream="side", kind="comm", phase="fwd", layer=0, work=0.002)
    g.add("k0", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=0.005)
    c1 = g.add("c1", device=0, stream="d2h", kind="copy", phase="fwd", layer=0, work=bw * 0.004, deps=[wait],
               direction="d2h")
    g.add("k1", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=0.0015)
    g.add("k2", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=0.02)
    g.add("c2", device=0, stream="d2h", kind="copy", phase="fwd", layer=0, work=bw * 0.003, deps=[c1],
          direction="d2h")
    late = g.add("late", device=0, stream="side", kind="comm", phase="fwd", layer=0, work=0.012, deps=[wait])
    g.add("c3", device=0, stream="h2d", kind="copy", phase="fwd", layer=0, work=bw * 0.002, deps=[late],
          direction="h2d")
    return g, 1e12, 1e12


def test_fast_paths_equal_reference_where_copies_slow_kernels_part_way():
    run = _same(_copy_over_kernels, A800)
    assert run.failure is None
    g, _, _ = _copy_over_kernels()
    Engine(g, A800).run()
    ops = {op.name: op for op in g.ops}
    slow = float(A800.gpu.copy_compute_slowdown)
    assert slow > 0  # else nothing here is slowed
    # k0 runs alone for 2 ms, then beside c1 at the slow rate: it takes longer than its 5 ms alone
    assert ops["k0"].end - ops["k0"].start > 0.005
    assert ops["k2"].end - ops["k2"].start > 0.02  # slowed by the copies over it, sped up between them


def _copy_over_last_kernel():
    """The iteration's last op a kernel that a copy slows part of the way (the copy starts and ends
    inside it): timeouts a re-timing left behind must not run the iteration's end on past it."""
    from memo_sim.engine.graph import Device, OpGraph

    g = OpGraph([Device(0)])
    bw = float(A800.host_link.d2h_bandwidth)
    g.add("k", device=0, stream="compute", kind="compute", phase="fwd", layer=0, work=0.02)
    wait = g.add("wait", device=0, stream="side", kind="comm", phase="fwd", layer=0, work=0.014)
    g.add("c", device=0, stream="d2h", kind="copy", phase="fwd", layer=0, work=bw * 0.002, deps=[wait],
          direction="d2h")
    return g, 1e12, 1e12


@pytest.mark.parametrize("build", [_copy_over_last_kernel, _copy_over_kernels])
def test_the_iteration_ends_when_its_last_op_does(build):
    _same(build, A800)
    for fast in (True, False):
        g, gcap, hcap = build()
        run = Engine(g, A800, gpu_capacity=gcap, host_capacity=hcap, fast_paths=fast).run()
        assert run.end_time == max(op.end for op in g.ops)
