"""[search-scale] Micro-batch pipelines folded (`memo_sim.engine.schedules.microbatch_fold`, on
`memo_sim.engine.periodic`'s machinery): a 1F1B or interleaved 1F1B run whose steady state is
simulated a few windows long and unfolded gives the whole run's results within 1e-9 -- status,
iteration time, MFU, peaks, exposed copy and P2P time, layer timings, per-stage rows, op count,
bytes per link and the timeline (every stream's events, every memory sample) -- for every
policy; failures found in the unfolded event stream are the whole run's; a pipeline with too
few micro-batches, or a run that does not repeat, runs whole."""

from __future__ import annotations

import dataclasses
import math

import pytest

from memo_sim.engine import periodic
from memo_sim.engine.core import Engine
from memo_sim.engine.schedules import interleaved, one_f_one_b
from memo_sim.engine.schedules.microbatch import build_microbatch_pipeline, pipeline_costs
from memo_sim.engine.schedules.microbatch_fold import (
    MICRO_BATCHES, WindowFold, mb_name, mb_tensor, order_with_copies, plan_window_fold, split_mb,
)
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from tests.test_engine_periodic import _by_stream, _close, _summary, failure_compared

K = 1024
A800 = load_profile("a800-80gb")
GPT8 = dataclasses.replace(get_model("gpt-7b"), layers=8)  # 8 layers: 4 per stage at pp 2, 2 per chunk at vpp 2
POLICIES = [("store_all", None), ("full_recompute", None), ("full_offload", None), ("memo", 0.5)]
# (schedule, layout, micro-batches, tokens): 1F1B folds windows of 1 micro-batch, interleaved of pp
# (a run whose windows order two simultaneous events differently is not folded: at 8K tokens
# interleaved full_recompute's recompute and sends end together; see the last test)
PIPES = [("1f1b", Layout(tp=4, pp=2), 18, 8 * K), ("interleaved_1f1b", Layout(tp=4, pp=2, vpp=2), 36, 16 * K)]


def _pair(schedule, lay, m, pol, a, seq=8 * K, keep_timeline=True, model=GPT8, profile=A800):
    policy = get_policy(pol, a)
    whole = simulate(model, lay, m, seq, policy, profile, schedule=schedule, micro_batch=1, fold=False,
                     keep_timeline=keep_timeline)
    short = simulate(model, lay, m, seq, policy, profile, schedule=schedule, micro_batch=1,
                     keep_timeline=keep_timeline)
    return whole, short


def _same(whole, short):
    _close(_summary(whole), _summary(short))
    for f in ("n_ops", "peak_gpu_bytes", "peak_host_bytes_per_node", "start_gpu_bytes", "end_gpu_bytes",
              "end_host_bytes", "exposed_copy_s", "exposed_p2p_s", "layer_timings"):
        _close(getattr(whole, f), getattr(short, f), f)
    _close(whole.link_carried, short.link_carried, "link_carried")


# every policy on both schedules; the interleaved ones but store_all (a few seconds each) are slow
CASES = [pytest.param(pipe, pol, id=f"{pol[0]}-{pipe[0]}",
                      marks=[pytest.mark.slow] if pipe[0] != "1f1b" and pol[0] != "store_all" else [])
         for pipe in PIPES for pol in POLICIES]


@pytest.mark.parametrize("pipe, pol", CASES)
def test_folded_pipeline_equals_the_whole_run(pipe, pol):
    schedule, lay, m, seq = pipe
    whole, short = _pair(schedule, lay, m, *pol, seq=seq)
    assert whole.folded == 0 and short.folded > 0, "this case should fold"
    assert whole.ok and short.ok
    _same(whole, short)
    _close(_by_stream(whole.timeline.events), _by_stream(short.timeline.events), "events")
    _close([dataclasses.astuple(s) for s in whole.timeline.memory],
           [dataclasses.astuple(s) for s in short.timeline.memory], "memory")
    _close(whole.timeline.meta, short.timeline.meta, "meta")
    # and without a timeline (the what-if's tier 2)
    quick = simulate(GPT8, lay, m, seq, get_policy(*pol), A800, schedule=schedule, micro_batch=1,
                     keep_timeline=False)
    assert quick.folded == short.folded and quick.timeline is None
    _same(whole, quick)


def test_folded_pipeline_with_cp_zero_and_dp_equals_the_whole_run():
    whole, short = _pair("1f1b", Layout(tp=2, cp=2, pp=2, dp=2, zero=1), 18, "memo", 0.5, seq=16 * K,
                         keep_timeline=False)
    assert short.folded > 0
    _same(whole, short)


def _short_run(schedule_mod, lay, m, policy, seq=8 * K):
    costs = pipeline_costs(GPT8, lay, 1, seq, policy, A800)
    lc = GPT8.layers // (lay.pp * lay.vpp)
    plan = plan_window_fold(schedule_mod.order, lay.pp, m, lay.vpp, lc, policy,
                            bool(policy.offloads and costs.skeletal["total"]))
    assert plan is not None
    sched = build_microbatch_pipeline(costs, lay, A800, policy, GPT8.layers, plan.short, schedule_mod.order,
                                      detail="ops")
    eng = Engine(sched.graph, A800, gpu_capacity=math.inf, host_capacity=math.inf, log=True)
    run = eng.run()
    anchors = [sched.forwards[(0, w * plan.step, 0)] for w in plan.anchor_windows()]
    return costs, plan, sched, eng, run, anchors


@pytest.mark.parametrize("pol", [("store_all", None), ("full_offload", None)], ids=lambda p: p[0])
def test_a_failure_is_found_where_the_whole_run_fails(pol):
    """Capacities swept from the static bytes to the peak: the first allocation past capacity,
    found in the unfolded event stream, is the whole run's (time, tensor, micro-batch, layer,
    op); where no other stream has an event at that instant also the bytes in use, the peaks
    and end bytes. (A 1F1B steady state holds the same bytes window after window, so every
    capacity under the peak fails before the copies.)"""
    lay, m, policy = Layout(tp=4, pp=2), 18, get_policy(*pol)
    costs, plan, sched, eng, run, anchors = _short_run(one_f_one_b, lay, m, policy)
    whole_sched = build_microbatch_pipeline(costs, lay, A800, policy, GPT8.layers, m, one_f_one_b.order,
                                            detail="ops")
    ok = Engine(whole_sched.graph, A800, gpu_capacity=math.inf, host_capacity=math.inf).run()
    lo, hi = max(ok.start_gpu_bytes.values()), max(ok.peak_gpu_bytes.values())
    compared, where = 0, set()
    for k in range(1, 16):
        cap = lo + (hi - lo) * k / 16
        u = periodic.unfold_window(run, anchors, plan.copies, plan.step, MICRO_BATCHES, gpu_capacity=cap,
                                   host_capacity=math.inf, devices=sched.graph.devices, routes=eng.routes)
        ws = build_microbatch_pipeline(costs, lay, A800, policy, GPT8.layers, m, one_f_one_b.order, detail="ops")
        whole = Engine(ws.graph, A800, gpu_capacity=cap, host_capacity=math.inf).run()
        wf, uf = whole.failure, u.failure
        if not failure_compared(u, whole, where):
            continue
        compared += 1
        assert math.isclose(uf.in_use_bytes, wf.in_use_bytes, rel_tol=1e-9)
        assert math.isclose(u.end_time, whole.end_time, rel_tol=1e-9)
        for d in sched.graph.devices:
            for x, y in ((u.peak_gpu[d], whole.peak_gpu_bytes[d]), (u.end_gpu[d], whole.end_gpu_bytes[d])):
                assert math.isclose(x, y, rel_tol=1e-9), (cap, d, x, y)
    assert compared >= 8, compared


def test_an_oom_run_folded_without_a_timeline_equals_the_whole_run():
    """A pipeline that runs out of GPU memory part way: the what-if's summary (no timeline) of
    the folded run is the whole run's, failure included."""
    lay, policy, seq = Layout(tp=2, pp=2), get_policy("store_all"), 128 * K
    whole = simulate(GPT8, lay, 18, seq, policy, A800, schedule="1f1b", micro_batch=1, fold=False,
                     keep_timeline=False)
    short = simulate(GPT8, lay, 18, seq, policy, A800, schedule="1f1b", micro_batch=1, keep_timeline=False)
    assert whole.status == "OOM", "this case should run out of memory"
    assert short.folded > 0
    assert short.link_carried == {}  # a folded run that failed keeps none (`SimResult.folded`)
    short.link_carried = whole.link_carried
    _same(whole, short)
    # with a timeline the whole run gives it
    shown = simulate(GPT8, lay, 18, seq, policy, A800, schedule="1f1b", micro_batch=1)
    assert shown.folded == 0 and shown.status == "OOM"


def test_orders_with_copies_are_the_whole_orders():
    for mod, pp, vpp, m, step in ((one_f_one_b, 4, 1, 40, 1), (interleaved, 2, 3, 40, 2), (interleaved, 4, 2, 80, 4)):
        plan = plan_window_fold(mod.order, pp, m, vpp, 2, get_policy("memo", 0.5), True)
        assert plan is not None and plan.step == step and plan.copies >= periodic.MIN_COPIES
        for s in range(pp):
            got, _cut = order_with_copies(mod.order(pp, plan.short, vpp, s), plan)
            assert got == mod.order(pp, m, vpp, s)
    # too few micro-batches to save MIN_COPIES windows, or half the run: none
    assert plan_window_fold(one_f_one_b.order, 4, 12, 1, 2, get_policy("store_all"), False) is None
    assert plan_window_fold(one_f_one_b.order, 2, 16, 1, 2, get_policy("store_all"), False) is None
    assert plan_window_fold(one_f_one_b.order, 2, 18, 1, 2, get_policy("store_all"), False) is not None
    assert plan_window_fold(interleaved.order, 2, 4, 2, 2, get_policy("store_all"), False) is None


def test_micro_batch_labels():
    assert split_mb(mb_name("qkv@s3", 12)) == ("qkv@s3", 12) and split_mb("optimizer") == ("optimizer", None)
    lb = MICRO_BATCHES
    assert lb.tensor(mb_tensor(3, "L5.slot"), None, 4) == mb_tensor(7, "L5.slot")
    assert lb.tensor("classifier.working", None, 4) == "classifier.working"
    fold = WindowFold(whole=20, short=12, step=2, cut=4)
    assert fold.copies == 4 and list(fold.anchor_windows()) == [2, 3, 4, 5, 6]


def test_a_run_whose_windows_order_simultaneous_events_differently_runs_whole():
    # a case found on the A800 profile before it priced SM contention and before its NVLink ran at the 80% of the line
    # rate NCCL reaches (its times then: without sm_count, NVLink at 200 GB/s): its windows order simultaneous events
    # differently, so it runs whole
    from memo_sim.profile.schema import Quantity
    no_sms = dataclasses.replace(A800, gpu=dataclasses.replace(A800.gpu, sm_count=None, comm_sms=None),
                                 nvlink=dataclasses.replace(A800.nvlink, bandwidth=Quantity(200e9, "line rate")))
    whole, short = _pair("interleaved_1f1b", Layout(tp=4, pp=2, vpp=2), 36, "full_recompute", None,
                         keep_timeline=False, profile=no_sms)
    assert short.folded == 0
    _same(whole, short)
    # with the SMs the collectives hold priced, the same case's windows repeat: folded, the same run
    whole, short = _pair("interleaved_1f1b", Layout(tp=4, pp=2, vpp=2), 36, "full_recompute", None,
                         keep_timeline=False)
    assert short.folded > 0
    _same(whole, short)


def test_a_run_that_does_not_repeat_is_not_unfolded():
    lay, policy = Layout(tp=4, pp=2), get_policy("store_all")
    _costs, plan, sched, eng, run, anchors = _short_run(one_f_one_b, lay, 18, policy)
    args = dict(gpu_capacity=math.inf, host_capacity=math.inf, devices=sched.graph.devices, routes=eng.routes)
    assert periodic.unfold_window(run, anchors, plan.copies, plan.step, MICRO_BATCHES, **args) is not None
    # windows from the warm-up on: rank 0's first forwards do not repeat
    early = [sched.forwards[(0, w, 0)] for w in range(len(anchors))]
    assert periodic.unfold_window(run, early, plan.copies, plan.step, MICRO_BATCHES, **args) is None
    # the wrong index step: the micro-batches do not line up
    assert periodic.unfold_window(run, anchors, plan.copies, plan.step + 1, MICRO_BATCHES, **args) is None
