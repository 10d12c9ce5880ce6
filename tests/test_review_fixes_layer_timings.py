"""A plan's simulated layer timings are the time the layer's ops ran, not the span from its first op's start to its
last op's end: a full-offload layer whose forward waits for its host copies read 0.178 s forward, its offload's time,
against 0.069 s of ops (a review); `memo-sim explain` counts that wait apart ("waiting on host copies"), and memo-exec's
report compares the layer's ops, stalls excluded. Whole and folded runs alike (`memo_sim.engine.periodic`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.api import estimate_iteration, get_policy, load_profile, simulate
from memo_sim.engine.result import busy_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS

B200 = load_profile("b200-180gb")


def test_busy_time_is_the_union_of_the_intervals():
    assert busy_time([]) == 0.0
    assert busy_time([(0.0, 1.0), (2.0, 3.0)]) == 2.0  # a wait of 1 s between them left out
    assert busy_time([(0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 3.0  # overlapping streams counted once
    assert busy_time([(5.0, 6.0), (0.0, 1.0)]) == 2.0


@pytest.mark.parametrize("fold", [True, False])
def test_a_full_offload_layers_forward_leaves_its_copy_wait_out(fold):
    model = replace(PRESETS["llama-3.1-8b"], layers=8)
    lay, pol, seq = Layout(ulysses=8, zero=3, attention="cudnn"), get_policy("full_offload"), 256 * 1024
    r = simulate(model, lay, 1, seq, pol, B200, fold=fold)
    lt = r.layer_timings
    assert lt["offload"] > 2 * lt["forward"]  # the copies bind the forward: its ops wait for them
    analytic = estimate_iteration(model, lay, 1, seq, pol, B200).layer.forward
    assert lt["forward"] == pytest.approx(analytic, rel=0.1)
