"""What the cluster-scale MoE what-if's speed-ups rely on (2026-12-02): the costs memoised under a cheaper key give the
values the uncached calls give, and a candidate's proved bound, kept on it, is the one proved afresh.

- `memo_sim.cost.boundary.mtp_seconds` is memoised on the layout at ZeRO 0 (`zero_free`): the layer op lists it prices
  read no ZeRO stage, so every stage of a layout gives what its own uncached call gives;
- `memo_sim.cost.grad_sync.grad_sync` and `memo_sim.search.bound._phase_times` are memoised: the same values as
  unmemoised;
- `memo_sim.search.prune.tgs_upper_bound` keeps the bound on the candidate: the kept value is the fresh one;
- a model and a layout keep their hash (`memo_sim.model.config.cache_hash`): the dataclass's, never pickled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.boundary import _mtp_seconds, boundary_times, mtp_seconds, zero_free
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.cost.memo import unmemoised
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.profile import load_profile
from memo_sim.policy.full_recompute import FullRecompute
from memo_sim.search import prune
from memo_sim.search.bound import _phase_times
from memo_sim.search.whatif import make_candidate

H100 = load_profile("h100-sxm5-80gb")
DSV3 = replace(get_model("deepseek-v3"), gemm_format="fp8-blockwise")  # a MoE with a multi-token-prediction module
SEQ = 4096
LAYOUTS = [Layout(tp=2, dp=512, ep=8, zero=z) for z in (0, 1, 2, 3)] + [
    Layout(tp=4, sp=True, dp=256, ep=4, etp=2, zero=3), Layout(tp=8, cp=2, dp=64, ep=16, zero=1),
    Layout(tp=2, ulysses=2, dp=256, ep=8, zero=2)]


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: lay.label())
def test_mtp_seconds_keyed_at_zero_0_is_the_uncached_value_of_every_stage(lay):
    assert DSV3.mtp_layers
    assert forward_costs(DSV3, lay, 1, SEQ, H100) == forward_costs(DSV3, zero_free(lay), 1, SEQ, H100)
    assert backward_costs(DSV3, lay, 1, SEQ, H100) == backward_costs(DSV3, zero_free(lay), 1, SEQ, H100)
    cached = [mtp_seconds(DSV3, lay, 1, SEQ, H100, 0.25, rec) for rec in (False, True)]
    bt = boundary_times(DSV3, lay, 1, SEQ, H100)
    sync = grad_sync(DSV3, lay, H100)
    phases = _phase_times(DSV3, lay, 1, SEQ, FullRecompute(), H100)
    with unmemoised():
        # the layout at its own ZeRO stage, priced afresh (the memo's key is the stage-free layout)
        assert cached == [_mtp_seconds.__wrapped__(DSV3, lay, 1, SEQ, H100, 0.25, rec) for rec in (False, True)]
        assert bt == boundary_times(DSV3, lay, 1, SEQ, H100)
        assert sync == grad_sync(DSV3, lay, H100)
        assert phases == _phase_times(DSV3, lay, 1, SEQ, FullRecompute(), H100)


def test_a_kept_bound_is_the_bound_proved_afresh():
    lay = Layout(tp=2, dp=512, ep=8, zero=3)
    c = make_candidate(DSV3, lay, "memo", 2, SEQ, H100, None, micro_batch=1)
    kept = prune.tgs_upper_bound(c)
    assert prune.tgs_upper_bound(c) is kept  # the second ask reads it
    with unmemoised():
        fresh = make_candidate(DSV3, lay, "memo", 2, SEQ, H100, None, micro_batch=1)
        assert prune.tgs_upper_bound(fresh) == kept


def test_a_kept_hash_is_the_dataclass_hash_and_is_not_pickled():
    import copy
    import pickle

    lay = Layout(tp=2, dp=512, ep=8, zero=3)
    for obj in (lay, DSV3):
        h = hash(obj)
        assert hash(obj) == h == hash(replace(obj)) and obj.__dict__["_hash"] == h
        for twin in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
            assert "_hash" not in twin.__dict__ and twin == obj and hash(twin) == h
    assert hash(replace(lay, zero=2)) != hash(lay) and replace(lay, zero=2) != lay
