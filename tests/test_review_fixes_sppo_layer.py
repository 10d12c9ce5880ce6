"""An SPPO plan's ``layer_timings_s`` are one layer of the sequence, every piece of it (as a micro-batch's layer in
the other schedules, and as memo-exec's report measures a layer: its copies of every subsequence), not the middle
piece's alone, which the executor's report set beside the whole layer's measured copies."""

from __future__ import annotations

from memo_sim.api import load_profile, simulate
from tests.test_sppo_exec_dist import sppo_plan


def test_sppo_layer_timings_sum_every_piece_of_the_layer():
    plan = sppo_plan(2, 4, True)  # PP 2, N = 4 multiplexed (5 pieces), alpha_i from 1/2 down to 1/8
    r = simulate(plan.model, plan.layout, plan.batch, plan.seq_tokens, plan.policy, load_profile("a100-sxm4-80gb"),
                 schedule="sppo", record=True)
    layer = 1  # stage 0 holds layers 0 and 1; the middle one
    for kind, stream in (("offload", "d2h"), ("prefetch", "h2d")):
        copies = [o for o in r.ops if o.stream == stream and o.device == 0 and o.layer == layer]
        assert len(copies) == 4  # one per piece that offloads (the last piece keeps its rows)
        assert r.layer_timings[kind] > 0
        assert abs(r.layer_timings[kind] - sum(o.end - o.start for o in copies)) < 1e-12
    fwd = [o for o in r.ops if o.stream == "compute" and o.device == 0 and o.layer == layer and o.phase == "fwd"]
    pieces = {o.name.split("@", 1)[1] for o in fwd}
    assert len(pieces) == 5
    assert r.layer_timings["forward"] >= sum(o.end - o.start for o in fwd)  # each piece's span, stalls in it kept
