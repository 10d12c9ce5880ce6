"""Each pipeline stage's collectives ride the links its own groups ride (`memo_sim.layout.parallel.stage_shards`).

A review (2026-12-03): on GB200 NVL72 (72-GPU NVLink domains), qwen3-30b-a3b over 80 GPUs in 5 stages of 16 with EP
16 priced stages 0-3 (ranks 0-63, inside rack 0) as if their dispatch crossed racks, because stage 4 (ranks 64-79)
straddles rank 72: every stage was priced on one shard whose groups were every stage's. Likewise CP 16 over 80 GPUs
in 5 stages: stage 0 waited 40.6 ms on a CP ring priced on the inter-node link (2.48 ms on NVLink). Each stage now
prices its layers on its own shard (the stages grouped by where their groups sit), the analytic tier and the proved
bound read the same per-stage times, and a layout whose stages all sit alike prices exactly as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import memo_sim.engine.schedules.microbatch as mbp
from memo_sim.engine.schedules.microbatch import pipeline_costs
from memo_sim.engine.schedules.single_stage import collective_link
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout, expert_group_placements, stage_shard, stage_shards
from memo_sim.model.config import PRESETS
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.report.moe_split import moe_split
from memo_sim.search.bound import pipeline_iteration_bound
from memo_sim.search.estimate import estimate_pipeline

K = 1024
NVL72 = load_profile("gb200-nvl72")
QWEN3 = replace(PRESETS["qwen3-30b-a3b"], layers=10)  # 2 layers a stage over 5 stages
QWEN3_A = replace(PRESETS["qwen3-30b-a3b"], layers=8)  # 2 a stage over 4
LLAMA = replace(PRESETS["llama-3.1-8b"], layers=5)
POLICY = get_policy("full_recompute")
A = Layout(dp=16, pp=4, zero=1, ep=16)  # 64 GPUs: every stage inside rack 0
B = Layout(dp=16, pp=5, zero=1, ep=16)  # 80 GPUs: stage 4 (ranks 64-79) straddles rank 72
CP = Layout(cp=16, pp=5)  # 80 GPUs: stage 4's CP group straddles rank 72


@pytest.fixture(scope="module")
def nvl80(tmp_path_factory) -> object:
    """gb200-nvl72 with 80-GPU NVLink domains: no group of B or CP crosses one."""
    body = (Path(__file__).resolve().parent.parent / "hardware_profiles" / "gb200-nvl72.yaml").read_text()
    assert "gpus_per_node: {value: 72," in body
    path = tmp_path_factory.mktemp("nvl80") / "nvl80.yaml"
    path.write_text(body.replace("gpus_per_node: {value: 72,", "gpus_per_node: {value: 80,"))
    prof = load_profile(path)
    assert prof.node_gpus == 80
    return prof


def _moe(ops) -> list:
    return [c for c in ops if c.name.startswith("moe_")]


def _today(monkeypatch):
    """Price every stage on the one shard of every stage's groups (as before stages had their own)."""
    monkeypatch.setattr(mbp, "stage_shards", lambda layout, node: (stage_shard(layout),) * layout.pp)


def test_stage_shards_group_stages_by_where_their_groups_sit():
    sh = stage_shards(B, 72)
    assert sh[0] is sh[1] is sh[2] is sh[3] and sh[4] is not sh[0]
    assert expert_group_placements(sh[0], 16, 1, 72) == ((16,),)
    assert expert_group_placements(sh[4], 16, 1, 72) == ((8, 8),)
    assert expert_group_placements(stage_shard(B), 16, 1, 72) == ((8, 8), (16,))  # every stage's, as before
    assert all(s is stage_shard(A) for s in stage_shards(A, 72))  # alike: the one shard of today
    assert all(s is stage_shard(B) for s in stage_shards(B, 80))
    # a 64-stage job looks at one period of the stages' placements, and its shards are few
    big = Layout(dp=16, pp=64, zero=1, ep=16)
    assert len({id(s) for s in stage_shards(big, 72)}) <= 4


def test_b_stage_0_dispatches_on_nvlink_stage_4_across_racks(nvl80):
    """Stage 0's op times are A's (and C's, no crossing anywhere); stage 4's ride the inter-node link."""
    costs = pipeline_costs(QWEN3, B, 1, 8 * K, POLICY, NVL72)
    a = pipeline_costs(QWEN3_A, A, 1, 8 * K, POLICY, NVL72)
    c = pipeline_costs(QWEN3, B, 1, 8 * K, POLICY, nvl80)
    assert costs.stage_phases and a.stage_phases == () and c.stage_phases == ()
    f0, b0, _r0 = costs.phases_of(0, stage=0)
    f4, _b4, _r4 = costs.phases_of(8, stage=4)
    assert [x.seconds for x in _moe(f0)] == [x.seconds for x in _moe(a.forward)] == [x.seconds for x in _moe(c.forward)]
    assert [x.seconds for x in _moe(b0)] == [x.seconds for x in _moe(a.backward)]
    sh = stage_shards(B, 72)
    assert {collective_link(x, sh[0], NVL72) for x in _moe(f0)} == {"nvlink"}
    assert "internode" in {collective_link(x, sh[4], NVL72) for x in _moe(f4)}
    assert sum(x.seconds for x in _moe(f4)) > 2 * sum(x.seconds for x in _moe(f0))
    # the lists every stage shared before (every stage's groups) stay the worst's
    assert [x.seconds for x in costs.forward] == [x.seconds for x in f4]


def _iteration(model, layout, profile) -> float:
    res = simulate(model, layout, layout.pp, 8 * K if model is QWEN3 else 128 * K, POLICY, profile,
                   schedule="1f1b", micro_batch=1)
    assert res.status == "OK", res.status
    return res.iteration_s


def _between(model, layout, nvl80, monkeypatch) -> None:
    """The iteration with each stage on its own groups' links lies between no stage crossing (80-GPU domains) and
    every stage priced as the crossing one (the rule before, `_today`)."""
    fixed = _iteration(model, layout, NVL72)
    none = _iteration(model, layout, nvl80)
    with monkeypatch.context() as mp:
        _today(mp)
        worst = _iteration(model, layout, NVL72)
    assert none < fixed < worst


def test_b_iteration_lies_between_no_crossing_and_every_stage_crossing(nvl80, monkeypatch):
    _between(QWEN3, B, nvl80, monkeypatch)


def test_cp_stage_0_rides_nvlink_and_the_iteration_lies_between(nvl80, monkeypatch):
    costs = pipeline_costs(LLAMA, CP, 1, 128 * K, POLICY, NVL72)
    sh = stage_shards(CP, 72)
    f0 = [x for x in costs.phases_of(0, stage=0)[0] if x.stream == "cp_comm"]
    f4 = [x for x in costs.phases_of(4, stage=4)[0] if x.stream == "cp_comm"]
    assert f0 and {collective_link(x, sh[0], NVL72) for x in f0} == {"nvlink"}
    assert {collective_link(x, sh[4], NVL72) for x in f4} == {"internode"}
    c = pipeline_costs(LLAMA, CP, 1, 128 * K, POLICY, nvl80)
    assert [x.seconds for x in f0] == [x.seconds for x in c.forward if x.stream == "cp_comm"]
    _between(LLAMA, CP, nvl80, monkeypatch)


def test_stages_alike_price_as_before(monkeypatch):
    """A (every stage inside rack 0) and a dense layout on a node its stages tile: the same to the bit."""
    for model, lay, seq in ((QWEN3_A, A, 8 * K), (LLAMA, Layout(cp=8, pp=5), 32 * K)):
        now = simulate(model, lay, lay.pp, seq, POLICY, NVL72, schedule="1f1b", micro_batch=1).iteration_s
        est = estimate_pipeline(model, lay, lay.pp, 1, seq, POLICY, NVL72).iteration_s
        with monkeypatch.context() as mp:
            _today(mp)
            before = simulate(model, lay, lay.pp, seq, POLICY, NVL72, schedule="1f1b", micro_batch=1).iteration_s
        assert now == before
        assert pipeline_costs(model, lay, 1, seq, POLICY, NVL72).stage_phases == ()
        assert est == estimate_pipeline(model, lay, lay.pp, 1, seq, POLICY, NVL72).iteration_s


@pytest.mark.parametrize("model,lay,seq", [(QWEN3_A, A, 8 * K), (QWEN3, B, 8 * K), (LLAMA, CP, 128 * K)])
def test_the_bound_stays_below_the_simulation(model, lay, seq):
    sim = simulate(model, lay, lay.pp, seq, POLICY, NVL72, schedule="1f1b", micro_batch=1).iteration_s
    lb = pipeline_iteration_bound(model, lay, POLICY, lay.pp, 1, seq, NVL72)
    fam = pipeline_iteration_bound(model, lay, None, lay.pp, 1, seq, NVL72)
    assert 0 < fam <= lb <= sim * (1 + 1e-9)


def test_moe_split_reads_stage_0():
    split = moe_split(QWEN3, B, 1, 8 * K, NVL72)
    a = moe_split(QWEN3_A, A, 1, 8 * K, NVL72)
    assert split.time_s["forward"]["dispatch"] == a.time_s["forward"]["dispatch"]
    assert "a layer of stage 0" in split.label and "a layer of stage 0" not in a.label
    assert split.layer_of == "stage 0" and a.layer_of == ""
