"""[sim-speed] Identical layers simulated once (`memo_sim.engine.periodic`): a folded run gives
the whole run's results within 1e-9 -- status, iteration time, MFU, peaks, exposed copy and P2P
time, layer timings, op count, bytes per link, and the timeline (every stream's events, every
memory sample) -- on every policy with TP/SP, CP, Ulysses, METP and ZeRO-3; failures found in
the unfolded event stream equal the whole run's, or the fold steps aside; a run that is not
periodic, or a model too short, runs whole."""

from __future__ import annotations

import dataclasses
import math

import pytest

from memo_sim.engine import periodic
from memo_sim.engine.core import Engine
from memo_sim.engine.schedules import build_iteration, layer_signature
from memo_sim.engine.simulate import exposed_wait_parts, exposed_wait_seconds, simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.timeline import COPY_STREAMS
from tests.test_engine_fastpaths import CASES as FASTPATH_CASES

K = 1024
A800 = load_profile("a800-80gb")
H100 = load_profile("h100-sxm5-80gb")

# the fast-path cases (every policy; TP/SP, CP, Ulysses, METP, ZeRO) and a larger model
CASES = FASTPATH_CASES + [("gpt-30b", Layout(tp=8, cp=2, dp=2, zero=2), 256 * K, "full_offload", None)]


def failure_compared(unfolded, whole, where: set) -> bool:
    """Assert the unfolded run failed as the whole run did (same kind, tensor, op, layer, device and
    instant); True when the rest of the two can be compared too (no tie at the failing instant),
    with the window it failed in added to ``where``."""
    u, w = unfolded.failure, whole.failure
    assert w is not None and u is not None
    assert (u.status, u.tensor, u.op, u.layer, u.device) == (w.status, w.tensor, w.op, w.layer, w.device)
    assert math.isclose(u.time_s, w.time_s, rel_tol=1e-9)
    if unfolded.tie:
        return False
    where.add(unfolded.failure_at[0])
    return True


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)


def _by_stream(events):
    """Each stream's events in start order (a stream runs one op at a time, so its order is
    not a matter of rounding; ties between streams are)."""
    out: dict = {}
    for e in sorted(events, key=lambda e: e.start):
        out.setdefault((e.device, e.stream), []).append(
            (e.op, e.layer, e.phase, e.start, e.end, e.nbytes, e.flops))
    return out


def _summary(r):
    d = r.to_dict()
    d.pop("sim_wall_s")
    return d


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].label()}-{c[2] // K}K-{c[3]}")
def test_folded_run_equals_the_whole_run(case):
    m, lay, seq, pol, a = case
    model, policy = get_model(m), get_policy(pol, a)
    whole = simulate(model, lay, 1, seq, policy, A800, fold=False)
    short = simulate(model, lay, 1, seq, policy, A800)
    assert whole.folded == 0
    assert short.folded == model.layers - periodic.FOLD_LAYERS, "this case should fold"
    assert short.ok and whole.ok
    _close(_summary(whole), _summary(short))
    for f in ("n_ops", "peak_gpu_bytes", "peak_host_bytes_per_node", "start_gpu_bytes", "end_gpu_bytes",
              "end_host_bytes", "exposed_copy_s", "exposed_p2p_s"):
        _close(getattr(whole, f), getattr(short, f), f)
    _close(whole.link_carried, short.link_carried, "link_carried")
    _close(_by_stream(whole.timeline.events), _by_stream(short.timeline.events), "events")
    _close([dataclasses.astuple(s) for s in whole.timeline.memory],
           [dataclasses.astuple(s) for s in short.timeline.memory], "memory")
    assert short.timeline.meta["middle_layer"] == whole.timeline.meta["middle_layer"]
    # and without a timeline (the what-if's tier 2)
    quick = simulate(model, lay, 1, seq, policy, A800, keep_timeline=False)
    assert quick.folded and quick.timeline is None
    _close(_summary(whole), _summary(quick))


def _short_and_whole(case, profile=A800):
    m, lay, seq, pol, a = case
    model, policy = get_model(m), get_policy(pol, a)
    fold = periodic.plan_fold(model.layers, lambda i, n: layer_signature(policy, i, n))
    assert fold is not None
    short = build_iteration(model, lay, 1, seq, policy, profile, layers=fold.simulated)
    eng = Engine(short.graph, profile, gpu_capacity=math.inf, host_capacity=math.inf, log=True)
    run = eng.run()
    return model, lay, seq, policy, fold, short, eng, run


def _whole_at(model, lay, seq, policy, gcap, hcap, profile=A800):
    sched = build_iteration(model, lay, 1, seq, policy, profile)
    return sched, Engine(sched.graph, profile, gpu_capacity=gcap, host_capacity=hcap).run()


@pytest.mark.parametrize("space,case", [
    ("gpu", ("gpt-7b", Layout(tp=8), 64 * K, "store_all", None)),
    ("gpu", ("gpt-7b", Layout(tp=4, cp=2), 256 * K, "full_recompute", None)),
    ("host", ("gpt-7b", Layout(tp=2, cp=4), 256 * K, "full_offload", None)),
], ids=["gpu-store_all", "gpu-full_recompute-cp2", "host-full_offload"])
def test_a_failure_is_found_where_the_whole_run_fails(space, case):
    """Capacities swept from the static bytes to the peak: the first allocation past capacity,
    found in the unfolded event stream, is the whole run's failure (time, tensor, layer, op);
    before the copied layers, or where no other stream has an event at that instant, also the
    bytes in use, the peaks, end bytes and exposed copy time up to it. Where one has
    (`Unfolded.tie`: a pinned-host failure after the cut, an offload starting beside the next
    layer), simulate runs the whole schedule."""
    model, lay, seq, policy, fold, short, eng, run = _short_and_whole(case)
    ok_sched, ok = _whole_at(model, lay, seq, policy, math.inf, math.inf)
    if space == "gpu":
        lo, hi = ok.start_gpu_bytes[0], ok.peak_gpu_bytes[0]
    else:
        lo, hi = 0.0, ok.peak_host_bytes[0]
    parts = {uid: x for _s, uid, x in exposed_wait_parts(run.ops, COPY_STREAMS)}
    compared, where = 0, set()
    for k in range(1, 24):
        cap = lo + (hi - lo) * k / 24
        gcap, hcap = (cap, math.inf) if space == "gpu" else (math.inf, cap)
        u = periodic.unfold(run, short.phases, fold, gpu_capacity=gcap, host_capacity=hcap,
                            devices=short.graph.devices, routes=eng.routes)
        _sched, whole = _whole_at(model, lay, seq, policy, gcap, hcap)
        wf, uf = whole.failure, u.failure
        if not failure_compared(u, whole, where):
            continue
        compared += 1
        for x, y in ((uf.in_use_bytes, wf.in_use_bytes), (uf.requested_bytes, wf.requested_bytes),
                     (u.end_time, whole.end_time), (u.peak_gpu[0], whole.peak_gpu_bytes[0]),
                     (u.peak_host[0], whole.peak_host_bytes[0]), (u.end_gpu[0], whole.end_gpu_bytes[0]),
                     (u.end_host[0], whole.end_host_bytes[0])):
            assert math.isclose(x, y, rel_tol=1e-9), (cap, x, y)
        assert math.isclose(u.exposed_wait_seconds(parts), exposed_wait_seconds(whole.ops, COPY_STREAMS),
                            rel_tol=1e-9, abs_tol=1e-12)
    if space == "gpu":
        assert compared >= 15, compared
        assert {0, 1, 2} <= where, f"failures before, inside and after the copied layers (segments {where})"
    else:
        assert compared >= 1 and where == {0}, (compared, where)


def test_a_failure_of_the_static_bytes_is_found_before_the_first_op():
    case = ("gpt-7b", Layout(tp=8), 64 * K, "store_all", None)
    model, lay, seq, policy, fold, short, eng, run = _short_and_whole(case)
    cap = 1e9  # less than the model states
    u = periodic.unfold(run, short.phases, fold, gpu_capacity=cap, host_capacity=math.inf,
                        devices=short.graph.devices, routes=eng.routes)
    _sched, whole = _whole_at(model, lay, seq, policy, cap, math.inf)
    assert u.failure.op is None and u.failure.tensor == whole.failure.tensor == "model_states"
    assert u.failure.time_s == whole.failure.time_s == 0.0
    assert u.end_gpu[0] == whole.end_gpu_bytes[0]


@pytest.mark.parametrize("lay, pol", [(Layout(tp=2), "store_all"), (Layout(tp=2, dp=2, zero=1), "full_offload"),
                                      (Layout(tp=2, cp=2), "full_recompute"), (Layout(tp=4, tp_mode="metp"), "memo")])
def test_model_states_that_do_not_fit_fail_before_the_first_op_as_in_the_whole_run(lay, pol, monkeypatch):
    """gpt-30b's model states do not fit one A800 at tp <= 4: the folded run stops at the static
    allocation without running its short schedule, with the whole run's summary, op count,
    peaks, end bytes and bytes per link."""
    import importlib

    sim_mod = importlib.import_module("memo_sim.engine.schedules.single_stage")  # the single-stage runner's module
    taken = []
    real = sim_mod._static_failure
    monkeypatch.setattr(sim_mod, "_static_failure", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    model, policy = get_model("gpt-30b"), get_policy(pol, 0.5 if pol == "memo" else None)
    short = simulate(model, lay, 1, 64 * K, policy, A800, keep_timeline=False)
    assert len(taken) == 1 and taken[0] is not None  # the short schedule did not run
    whole = simulate(model, lay, 1, 64 * K, policy, A800, keep_timeline=False, fold=False)
    assert short.folded == model.layers - periodic.FOLD_LAYERS and whole.folded == 0
    assert short.failure is not None and short.failure.op is None and short.failure.time_s == 0.0
    _close(_summary(whole), _summary(short))
    for f in ("n_ops", "peak_gpu_bytes", "peak_host_bytes_per_node", "start_gpu_bytes", "end_gpu_bytes",
              "end_host_bytes", "exposed_copy_s", "exposed_p2p_s", "link_carried"):
        assert getattr(whole, f) == getattr(short, f), f


def test_short_models_per_layer_stalls_and_odd_layers_are_not_folded():
    memo = get_policy("memo", 0.5)
    sig = lambda i, n: layer_signature(memo, i, n)  # noqa: E731
    assert periodic.plan_fold(periodic.FOLD_LAYERS + periodic.MIN_COPIES - 1, sig) is None
    assert periodic.plan_fold(periodic.FOLD_LAYERS + periodic.MIN_COPIES, sig) is not None
    # a stall in a layer that the copies stand for: layers differ, no fold
    assert periodic.plan_fold(32, sig, {"L15.fwd": 1e-3}) is None
    # stalls in the first layer and the embedding stay where they are; one in the last layers
    # moves to its short-schedule layer
    f = periodic.plan_fold(32, sig, {"L0.fwd": 1e-3, "embedding": 2e-3, "L31.bwd": 3e-3, "L20.fwd": 0.0})
    last = periodic.FOLD_LAYERS - 1
    assert f is not None and f.allocator_stall == {"L0.fwd": 1e-3, "embedding": 2e-3, f"L{last}.bwd": 3e-3}
    assert f.model_layer(last) == 31 and f.model_layer(3) == 3


def test_a_run_that_does_not_repeat_is_not_unfolded():
    """Nudge one op of a checked window by 1 ns: the windows no longer repeat, and `unfold`
    refuses (simulate then runs the whole schedule)."""
    case = ("gpt-7b", Layout(tp=4, cp=2), 256 * K, "full_recompute", None)
    model, lay, seq, policy, fold, short, eng, run = _short_and_whole(case)
    args = dict(gpu_capacity=math.inf, host_capacity=math.inf, devices=short.graph.devices, routes=eng.routes)
    assert periodic.unfold(run, short.phases, fold, **args) is not None
    op = short.phases[(fold.cut - 2, "fwd")][1]
    op.end += 1e-9
    assert periodic.unfold(run, short.phases, fold, **args) is None


def test_the_engine_log_orders_starts_ends_and_samples():
    sched = build_iteration(get_model("gpt-7b"), Layout(tp=8), 1, 64 * K, get_policy("memo", 0.5), A800, layers=periodic.FOLD_LAYERS)
    run = Engine(sched.graph, A800, log=True, keep_memory=False).run()
    kinds = [k for k, _x in run.events]
    assert kinds.count(0) == kinds.count(1) == len(run.ops)
    assert kinds.count(2) == len(run.memory) == len(run.sample_src) > 0
    seen = set()
    for kind, x in run.events:
        if kind == 0:
            seen.add(x.uid)
        elif kind == 1:
            assert x.uid in seen  # an op ends after it starts
    times = [run.memory[x].time for k, x in run.events if k == 2]
    assert times == sorted(times)


def test_sppo_runs_whole():
    """A pipelined policy has no period of one layer (pieces differ in their prefix): it is
    simulated whole, fold or not."""
    from memo_sim.policy.sppo import Sppo
    from memo_sim.search.sppo import solve_alphas

    model, lay, seq = get_model("gpt-7b"), Layout(tp=4, pp=2), 128 * K
    pol = solve_alphas(model, lay, 1, seq, Sppo(None, subseqs=4).with_bounds(model, lay, 1, seq), H100)[0]
    a = simulate(model, lay, 1, seq, pol, H100, keep_timeline=False)
    b = simulate(model, lay, 1, seq, pol, H100, keep_timeline=False, fold=False)
    assert a.folded == b.folded == 0
    _close(_summary(a), _summary(b))


# A case with stalls in the first layer, the last layers and the classifier alone (gpt-13b, tp4+metp_ffn-uly2,
# full_offload, 512K on the A800) lost them on 2026-12-01, when the replay came to ask for the logits and their fp32
# copy apart (`memo_sim.memplan.iteration_requests`): a scan of its neighbours (448K-768K, the loss kernels, other
# policies and TP / Ulysses splits) found stalls only in runs that do not fit, so the fold is held to the stall in
# every layer.
@pytest.mark.parametrize("case", [
    # the same stall in every forward layer: the layers still look alike
    ("gpt-7b", Layout(tp=2, sp=False, cp=2, ulysses=2, zero=2), 512 * K, "full_recompute", None),
], ids=["stall-in-every-layer"])
def test_allocator_stalls_fold_with_their_layers(case):
    m, lay, seq, pol, a = case
    model, policy = get_model(m), get_policy(pol, a)
    whole = simulate(model, lay, 1, seq, policy, A800, keep_timeline=False, fold=False)
    short = simulate(model, lay, 1, seq, policy, A800, keep_timeline=False)
    assert short.folded and whole.allocator["stall_s"] > 0
    _close(_summary(whole), _summary(short))


def test_without_contention_the_fold_holds_too():
    model, lay, policy = get_model("gpt-7b"), Layout(tp=2, cp=4), get_policy("memo", 0.3)
    whole = simulate(model, lay, 1, 256 * K, policy, A800, contention=False, fold=False)
    short = simulate(model, lay, 1, 256 * K, policy, A800, contention=False)
    assert short.folded
    _close(_summary(whole), _summary(short))
    _close(_by_stream(whole.timeline.events), _by_stream(short.timeline.events), "events")
