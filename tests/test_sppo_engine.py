"""[sppo] The SPPO pipeline in the event engine (`memo_sim.engine.schedules.sppo`): dependencies,
memory against the analytic walk, P2P links, multiplexed pieces, the analytic tier."""

from __future__ import annotations

import dataclasses

import pytest

from memo_sim.cost import sppo as C
from memo_sim.engine.schedules.sppo import build_pipeline_iteration, stage_devices
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout, stage_hop_crosses_nodes
from memo_sim.memplan.footprint import sppo_memory
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile
from memo_sim.search.sppo import estimate_sppo, solve_alphas

K = 1024
A100 = load_profile("a100-sxm4-80gb")
TOY = ModelConfig("toy", layers=4, hidden=1024, heads=8, ffn=4096, vocab=4096)


def _plan(model, lay, seq, n, mux=False, alpha=None):
    pol = Sppo(None, subseqs=n, multiplex=mux).with_bounds(model, lay, 1, seq)
    if alpha is None:
        return solve_alphas(model, lay, 1, seq, pol, A100)[0]
    return dataclasses.replace(pol, alphas=(alpha,) * n)


@pytest.mark.parametrize("pp,n,mux", [(2, 4, False), (4, 6, True), (2, 3, True)])
def test_pipeline_dependencies(pp, n, mux):
    lay, seq = Layout(tp=2, pp=pp), 32 * K
    pol = _plan(TOY, lay, seq, n, mux)
    r = simulate(TOY, lay, 1, seq, pol, A100, record=True, detail="ops")
    assert r.ok
    sched = build_pipeline_iteration(TOY, lay, 1, seq, pol, A100, detail="ops")
    ops = {(o.name, o.device, o.layer, o.phase, o.stream): o for o in r.ops}
    for s in range(pp):
        fwd = [o for o in r.ops if o.device == s and o.phase == "fwd" and o.stream == "compute" and o.layer is not None]
        bwd = [o for o in r.ops if o.device == s and o.phase == "bwd" and o.stream == "compute" and o.layer is not None]
        assert max(o.end for o in fwd) <= min(o.start for o in bwd) + 1e-12  # all forwards, then all backwards
        sends = [o for o in r.ops if o.device == s - 1 and o.phase == "p2p_fwd"] if s else []
        for o in fwd:  # a unit never starts before the send of the upstream piece it needs
            for d in o.deps:
                assert d.end <= o.start + 1e-12
        if s:
            assert sends and all(x.end is not None for x in sends)
    assert len(ops) == len(r.ops)
    # backward: pieces in reverse order on every stage
    for s in range(pp):
        order = [o.name.split("@")[1] for o in r.ops if o.device == s and o.phase == "bwd" and o.stream == "compute"
                 and o.layer == sched.layers[s][0] and "@" in o.name and o.name.startswith("ln1")]
        starts = [p.tag() for p in sched.pieces[s]]
        assert order == list(reversed(starts))


@pytest.mark.parametrize("pp,n,mux,tp", [(2, 4, False, 2), (4, 8, True, 1), (1, 5, False, 4)])
def test_simulated_peak_equals_the_memory_walk(pp, n, mux, tp):
    lay, seq = Layout(tp=tp, pp=pp), 32 * K
    pol = _plan(TOY, lay, seq, n, mux)
    r = simulate(TOY, lay, 1, seq, pol, A100, detail="ops")
    mem = sppo_memory(TOY, lay, 1, seq, pol, A100)
    assert r.ok
    for st in r.pipeline["stages"]:
        assert st["peak_gpu_bytes"] == pytest.approx(mem.stages[st["stage"]].breakdown.peak_gpu_bytes, rel=1e-9)
    assert r.peak_host_bytes_per_node == pytest.approx(mem.host_bytes_per_node, rel=1e-9)


def test_units_detail_keeps_the_time_and_memory():
    lay, seq = Layout(tp=2, pp=2), 32 * K
    pol = _plan(TOY, lay, seq, 8)
    a = simulate(TOY, lay, 1, seq, pol, A100, detail="ops", contention=False)
    b = simulate(TOY, lay, 1, seq, pol, A100, detail="units", contention=False)
    assert b.n_ops < a.n_ops
    assert b.iteration_s == pytest.approx(a.iteration_s, rel=1e-9)
    assert b.peak_gpu_bytes == pytest.approx(a.peak_gpu_bytes, rel=1e-12)


@pytest.mark.parametrize("lay,n", [(Layout(tp=8, pp=4), 16), (Layout(tp=4, pp=2, dp=4), 8)])
def test_analytic_tier_tracks_the_simulation(lay, n):
    m, seq = get_model("gpt-7b"), 256 * K
    pol = _plan(m, lay, seq, n)
    est, grid = estimate_sppo(m, lay, 1, seq, pol, A100)
    r = simulate(m, lay, 1, seq, pol, A100, contention=False)
    assert r.ok
    assert r.iteration_s == pytest.approx(est.iteration_s, rel=0.02)


def test_stage_hops_and_devices():
    lay = Layout(tp=8, pp=4)  # one stage per node: every hop crosses a node
    assert all(stage_hop_crosses_nodes(lay, s, 8) for s in range(3))
    # data parallelism outermost (Megatron-LM's --use-tp-pp-dp-mapping): a replica's pipeline inside a node
    lay2 = Layout(tp=2, pp=4, dp=4, rank_order="tp-cp-pp-dp")
    assert not any(stage_hop_crosses_nodes(lay2, s, 8) for s in range(3))
    assert C.p2p_link(lay, A100, 0) == "internode" and C.p2p_link(lay2, A100, 0) == "nvlink"
    devs = stage_devices(lay2, A100)
    assert [d.node for d in devs] == [0, 0, 0, 0] and [d.group for d in devs] == [2, 2, 2, 2]
    devs = stage_devices(Layout(tp=4, pp=4, dp=2, rank_order="tp-cp-pp-dp"), A100)  # stages 0,1 on node 0, 2,3 on 1
    assert [d.node for d in devs] == [0, 0, 1, 1] and all(d.group == 8 // 2 for d in devs)
    # stages outermost (the default, every framework's): each stage's 8 GPUs fill a node, every hop leaves it
    for pipe in (Layout(tp=2, pp=4, dp=4), Layout(tp=4, pp=4, dp=2)):
        assert all(stage_hop_crosses_nodes(pipe, s, 8) for s in range(3)) and C.p2p_link(pipe, A100, 0) == "internode"
        devs = stage_devices(pipe, A100)
        assert [d.node for d in devs] == [0, 1, 2, 3] and [d.group for d in devs] == [8] * 4


def test_layout_rules_for_pipelines():
    m = get_model("gpt-7b")
    assert check_layout(Layout(tp=8, pp=3), m, 24, 8, 1 << 20) is not None  # 32 layers into 3 stages
    # CP and TP without SP combine with a micro-batch pipeline; SPPO refuses them itself
    assert check_layout(Layout(tp=2, cp=2, pp=2), m, 8, 8, 1 << 20) is None
    assert check_layout(Layout(tp=2, sp=False, pp=2), m, 4, 8, 1 << 20) is None
    assert "TP+SP" in Sppo(None).check(m, Layout(tp=2, cp=2, pp=2), 1, 1 << 20)
    assert "sp on" in Sppo(None).check(m, Layout(tp=2, sp=False, pp=2), 1, 1 << 20)
    assert "ZeRO" in check_layout(Layout(tp=2, pp=2, dp=2, zero=2), m, 8, 8, 1 << 20)
    assert check_layout(Layout(tp=8, pp=4), m, 32, 8, 1 << 20) is None
    assert Layout(tp=8, pp=4).label() == "tp8+sp-pp4" and "pp" not in Layout(tp=8).to_dict()


def test_multiplexed_pieces_partition_each_subsequence():
    b = C.partition_bounds(TOY, 1, 64 * K, 8, "flops", 2)
    pieces = C.stage_pieces(TOY, 1, b, 4, True, 2)
    phases = C.multiplex_phases(4, 8)
    for s, ps in enumerate(pieces):
        for i in range(8):
            mine = [p for p in ps if p.sub == i]
            assert mine[0].start == b[i] and mine[-1].end == b[i + 1]
            assert all(x.end == y.start for x, y in zip(mine, mine[1:]))
            assert len(mine) == phases[s].parts(i)


def test_plain_policies_pipeline_by_1f1b_not_sppo():
    from memo_sim.policy import get_policy

    r = simulate(TOY, Layout(tp=2, pp=2), 1, 8 * K, get_policy("memo", 0.5), A100, keep_timeline=False)
    assert r.schedule == "1f1b" and r.pipeline["pp"] == 2  # the default schedule of a plain policy with stages
    with pytest.raises(MemoError, match="sppo"):
        simulate(TOY, Layout(tp=2, pp=2), 1, 8 * K, get_policy("memo", 0.5), A100, schedule="sppo")
    with pytest.raises(MemoError):  # an unsolved SPPO plan
        simulate(TOY, Layout(tp=2, pp=2), 1, 8 * K, Sppo(None, subseqs=2), A100)
