"""A mixture of experts' dense layers run a dense FFN in every schedule (`memo_sim.model.layer_kinds`): a review
(2026-12-06) found Llama 4 Maverick's 24 dense layers of 48 priced as MoE layers, their expert all-to-all included.
The single stage lays each layer out as its kind (folded where the layers the fold checks are alike), its analytic
estimate and proved bound add the kinds' times layer by layer, and the micro-batch pipelines price each stage's
layers as theirs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.layer_time import backward_costs, critical_time, forward_costs
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.model.layer_kinds import ffn_kinds, kind_model, layer_kinds
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.bound import lower_bound
from memo_sim.search.estimate import estimate_iteration
from memo_sim.search.whatif import candidates_for, simulate_candidates

H100 = load_profile("h100-sxm5-80gb")
BASE = replace(get_model("qwen3-30b-a3b"), ffn=6144)  # 48 layers of 128 experts (top-8, width 768)
FIRST3 = replace(BASE, dense_layers=3, name="q30-first3")  # DeepSeek's first_k_dense_replace
ALTERNATE = replace(BASE, dense_layers=24, dense_period=2, name="q30-alt")  # Maverick's / decoder_sparse_step 2
ALL_MOE = replace(BASE, name="q30-moe")
LAY = Layout(tp=2, sp=True, ep=8, dp=8, zero=1, moe=True)
SEQ = 8192


def test_a_dense_layer_kind_is_the_model_without_experts():
    kinds = ffn_kinds(ALTERNATE)
    assert len(kinds) == 48 and kinds[0] == (None, None, True) and kinds[1] == (None, None, False)
    assert ffn_kinds(ALL_MOE) == () and layer_kinds(ALL_MOE) == ()
    assert layer_kinds(FIRST3)[:4] == ((0, 0, True),) * 3 + ((0, 0, False),)
    dense = kind_model(ALTERNATE, (None, None, True))
    assert not dense.moe and dense.ffn == 6144 and dense.layers == 48
    names = [c.name for c in forward_costs(dense, LAY, 1, SEQ, H100)]
    assert not any(n.startswith("moe_") for n in names)
    assert kind_model(ALTERNATE, (None, None, False)) is ALTERNATE  # the repeated layer is the MoE layer


@pytest.mark.parametrize("policy", ["store_all", "full_recompute", "recompute_moe", "memo", "full_offload"])
def test_a_mixed_models_repeated_layer_is_its_moe_layer(policy):
    """What `kind_model` relies on for a MoE kind: a model mixing dense layers prices its repeated layer as the MoE
    layer of the all-MoE model, op for op, recompute and copies alike."""
    pol = get_policy(policy, 0.5 if policy == "memo" else None)
    for m in (FIRST3, ALTERNATE):
        for lay in (LAY, Layout(tp=1, ep=8, cp=2, dp=4, moe=True)):
            assert forward_costs(m, lay, 1, SEQ, H100) == forward_costs(ALL_MOE, lay, 1, SEQ, H100)
            assert backward_costs(m, lay, 1, SEQ, H100) == backward_costs(ALL_MOE, lay, 1, SEQ, H100)
            assert pol.recompute_costs(m, lay, 1, SEQ, H100) == pol.recompute_costs(ALL_MOE, lay, 1, SEQ, H100)
            assert pol.offload_bytes(m, lay, 1, SEQ) == pol.offload_bytes(ALL_MOE, lay, 1, SEQ)


@pytest.mark.parametrize("policy", ["store_all", "full_recompute", "recompute_moe"])
def test_the_single_stage_prices_each_layer_as_its_kind(policy):
    pol = get_policy(policy)
    t = {m.name: simulate(m, LAY, 1, SEQ, pol, H100, keep_timeline=False) for m in (ALL_MOE, FIRST3, ALTERNATE)}
    assert all(r.status == "OK" for r in t.values())
    moe_layer = critical_time(forward_costs(ALL_MOE, LAY, 1, SEQ, H100))
    dense_layer = critical_time(forward_costs(ALL_MOE.dense_view(), LAY, 1, SEQ, H100))
    assert dense_layer < moe_layer
    # the dense layers are cheaper: the more of them, the shorter the step
    assert t["q30-alt"].iteration_s < t["q30-first3"].iteration_s < t["q30-moe"].iteration_s
    # the whole run and the folded one agree: the first-3 model folds with its cut a layer later (the dense layers
    # reach into the shortest run's checked windows), the alternating one runs whole
    assert t["q30-first3"].folded > 0 and t["q30-alt"].folded == 0
    for m in (FIRST3, ALTERNATE):
        whole = simulate(m, LAY, 1, SEQ, pol, H100, keep_timeline=False, fold=False)
        assert t[m.name].iteration_s == pytest.approx(whole.iteration_s, rel=1e-9)
        assert t[m.name].peak_gpu_bytes == pytest.approx(whole.peak_gpu_bytes, rel=1e-9)


def test_a_fold_stands_each_short_layer_for_its_model_layers_kind():
    """A model whose dense layers all lie before the checked windows folds, each short layer priced as the model
    layer it stands for."""
    late = replace(BASE, layers=24, dense_layers=1, name="q30-first1")
    pol = get_policy("full_recompute")
    folded = simulate(late, LAY, 1, SEQ, pol, H100, keep_timeline=False)
    whole = simulate(late, LAY, 1, SEQ, pol, H100, keep_timeline=False, fold=False)
    assert folded.folded > 0
    assert folded.iteration_s == pytest.approx(whole.iteration_s, rel=1e-9)


def test_the_estimate_and_the_bound_follow_the_kinds():
    pol = get_policy("full_recompute")
    for m in (FIRST3, ALTERNATE):
        est = estimate_iteration(m, LAY, 1, SEQ, pol, H100).iteration_s
        all_moe = estimate_iteration(ALL_MOE, LAY, 1, SEQ, pol, H100).iteration_s
        assert est < all_moe
        sim = simulate(m, LAY, 1, SEQ, pol, H100, keep_timeline=False).iteration_s
        assert est == pytest.approx(sim, rel=0.25)


@pytest.mark.parametrize("model", [FIRST3, ALTERNATE], ids=["first3", "alternate"])
def test_bounds_stay_below_the_simulation_for_every_schedule(model):
    cands = candidates_for(model, SEQ, 32, H100, ep=8, batch=4, pp=None)
    ok = [c for c in cands.candidates if c.memory.status == "OK"]
    picked = []
    for schedule in ("single_stage", "1f1b", "interleaved_1f1b"):
        picked += [c for c in ok if c.schedule == schedule][:4]
    assert {c.schedule for c in picked} >= {"single_stage", "1f1b"}
    simulate_candidates(picked, jobs=1)
    for c in picked:
        s = c.simulated
        if s["status"] == "OK":
            assert lower_bound(c) <= s["iteration_s"] * (1 + 1e-9), (c.schedule, c.layout.label(), c.policy.label())


def test_plan_fold_moves_its_cut_past_leading_layers_of_another_kind():
    from memo_sim.engine import periodic

    def sig(i, n):
        return ()

    fold = periodic.plan_fold(48, sig, None, ("dense",) * 3 + ("moe",) * 45)
    assert (fold.cut, fold.simulated) == (periodic.CUT + 1, periodic.FOLD_LAYERS + 1)
    assert periodic.plan_fold(48, sig, None, ("dense", "moe") * 24) is None  # no run of one kind to copy
    assert periodic.plan_fold(48, sig, None, ("dense",) * 20 + ("moe",) * 28) is None  # past MAX_SHIFT
    assert (periodic.plan_fold(48, sig).cut, periodic.plan_fold(48, sig).simulated) == (periodic.CUT,
                                                                                         periodic.FOLD_LAYERS)


def test_a_kinds_layer_times_copy_the_repeated_layers_activations():
    """The schedules offload and prefetch the repeated (MoE) layer's bytes for every layer, as its memory terms are
    the repeated layer's: a dense kind's estimate takes those copies and its own compute."""
    from memo_sim.memplan.trace_gen import per_gpu_shard
    from memo_sim.search.estimate import kind_layer_times, layer_times

    pol = get_policy("full_offload")
    rep = layer_times(ALTERNATE, LAY, 1, SEQ, pol, H100)
    dense = kind_layer_times(ALTERNATE, (None, None, True), per_gpu_shard(LAY), 1, SEQ, pol, H100, 8)
    own = layer_times(kind_model(ALTERNATE, (None, None, True)), LAY, 1, SEQ, pol, H100)
    assert rep.offload > 0 and (dense.offload, dense.prefetch) == (rep.offload, rep.prefetch)
    assert (dense.forward, dense.backward) == (own.forward, own.backward) and dense.forward < rep.forward
