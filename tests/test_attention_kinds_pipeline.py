"""A pipeline stage's layers priced at their own attention kind (a review: the micro-batch pipelines priced every
layer at the model's mean window fraction, so a stage holding more full-attention layers than the mean ran faster
than its own compute allows). `memo_sim.model.layer_kinds`."""

from __future__ import annotations

import pytest

from dataclasses import replace

from memo_sim.cost.layer_time import critical_time
from memo_sim.engine.schedules.single_stage import layer_plan
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.model.layer_kinds import kind_model, kinds_of, layer_kinds
from memo_sim.model.config import ModelConfig
from memo_sim.profile.loader import load_profile
from memo_sim.search.bound import lower_bound
from memo_sim.search.pipeline import pipeline_candidate

H100 = load_profile("h100-sxm5-80gb")
# 6 layers alternating sliding (4K window) and full, as GPT-OSS's: over 2 stages of 3, stage 0 holds layers 0-2
# (sliding, full, sliding), stage 1 layers 3-5 (full, sliding, full)
SW = ModelConfig("sw6", 6, 1024, 8, 4096, vocab=32000, kv_heads=2, ffn_type="swiglu", norm="rmsnorm",
                 sliding_window=4096, sliding_layers=3, sliding_period=2)
SEQ = 32768


def test_layer_kinds_follow_the_stated_placement():
    assert layer_kinds(SW) == ((4096, 0, False), (0, 0, False)) * 3
    assert kinds_of(SW, range(3)) == {(4096, 0, False): 2, (0, 0, False): 1}
    assert kind_model(SW, (0, 0, False)).attention_flop_fraction(SEQ) == 1.0
    assert kind_model(SW, (4096, 0, False)).attention_flop_fraction(SEQ) < 0.25
    unplaced = ModelConfig("sw6u", 6, 1024, 8, 4096, vocab=32000, sliding_window=4096, sliding_layers=3)
    assert layer_kinds(unplaced) == () and "have no period placing them" in unplaced.unplaced_attention_words()
    assert unplaced.unplaced_attention_words() in unplaced.model_notes()
    assert layer_kinds(ModelConfig("d", 6, 1024, 8, 4096, vocab=32000)) == () and SW.unplaced_attention_words() == ""


@pytest.mark.parametrize("policy", ["store_all", "full_recompute"])
def test_the_stage_with_more_full_layers_sets_the_pace(policy):
    """Stage 1 (two full layers) runs m micro-batches of its own layers' forward, recompute and backward one after
    another: the simulated iteration is at least that, which the mean-priced pipeline undercut; the proved bound
    stays below the simulation and the analytic estimate near it."""
    lay = Layout(pp=2, dp=1)
    m = 16
    c = pipeline_candidate(SW, lay, policy, m, 1, SEQ, H100, "1f1b")
    res = simulate(SW, lay, m, SEQ, c.policy, H100, keep_timeline=False, schedule="1f1b", micro_batch=1)
    assert res.status == "OK"
    shard = Layout()  # a stage's shard (pp 1, dp 1)
    mem = memory_breakdown(SW, shard, 1, SEQ, c.policy, H100)

    def unit(w: int) -> float:  # one layer of window w (0: full): forward, recompute and backward, on its own
        one = replace(SW, sliding_window=w, sliding_layers=SW.layers if w else 0, sliding_period=0)
        lp = layer_plan(one, shard, 1, SEQ, c.policy, H100, mem)
        return sum(critical_time(ops) for ops in (lp.forward, lp.backward, lp.recompute) if ops)

    def stage_compute(layers) -> float:
        return m * sum(unit(SW.window_at(i)) for i in layers)

    full_heavy, sliding_heavy = stage_compute(range(3, 6)), stage_compute(range(3))
    assert full_heavy > 1.2 * sliding_heavy  # the kinds' attention differs by about 2.5x at 32K
    assert res.iteration_s >= full_heavy
    # the same layers with their places not stated are priced at the mean: the stated placement's slowest stage
    # (two full layers where the mean is one and a half) makes the step longer by about m x half a layer's difference
    unplaced = replace(SW, name="sw6u", sliding_period=0)
    mean = simulate(unplaced, lay, m, SEQ, c.policy, H100, keep_timeline=False, schedule="1f1b", micro_batch=1)
    assert res.iteration_s - mean.iteration_s == pytest.approx((full_heavy - sliding_heavy) / 2, rel=0.35)
    assert lower_bound(c) <= res.iteration_s * (1 + 1e-9)
    assert c.estimate.iteration_s == pytest.approx(res.iteration_s, rel=0.15)
