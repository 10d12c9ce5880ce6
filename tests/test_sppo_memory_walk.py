"""[search-speed] SPPO's memory walk as array sums, prepared once per partition.

`memo_sim.memplan.footprint.sppo_stage_walk` runs a stage's schedule (forward units, then backward units in
reverse) as running sums over numpy arrays; `SppoMemoryWalk` finds what does not depend on the offload ratios
once, and SPPO's alpha search (`memo_sim.search.sppo.alphas.solve_alphas`) asks it at each threshold. Checked here:
the walk equals the unit-by-unit loop it replaced (`_loop_walk`, kept here as the specification, the same float
operations in the same order) to the last bit, on random stages; a prepared walk at several alphas equals
`sppo_memory` made from scratch; a policy of another partition is refused."""

from __future__ import annotations

import dataclasses
import random

import pytest

from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import SppoMemoryWalk, StageUnits, sppo_memory, sppo_stage_walk
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile

A100 = load_profile("a100-sxm4-80gb")
TOY = ModelConfig("toy", layers=8, hidden=1024, heads=8, ffn=4096, vocab=4096)


def _loop_walk(u: StageUnits, states: float, work: float, classifier: float, last_stage: bool):
    """The walk one unit at a time (the specification; `sppo_stage_walk`'s docs)."""
    n_l, n_off = u.n_l, u.n_off
    n_k = len(u.kv)
    n_u = n_k * n_l

    def val(pair, i):
        return (pair[0] if i < n_off else pair[1])[i // n_l]

    sk = [val(u.skeletal, i) for i in range(n_u)]
    ls = [val(u.lse, i) for i in range(n_u)]
    off = [val(u.offload, i) for i in range(n_u)]
    skel = lse = dkv = dgrad = 0.0
    peak, where, snap = -1.0, None, None
    for i in range(n_u):
        skel += sk[i]
        lse += ls[i]
        tot = states + skel + lse + dgrad + work
        if tot > peak:
            peak, where, snap = tot, ("fwd", i), (skel, lse, 0.0, dgrad, work, 0.0)
        if i > 0:
            skel -= off[i - 1]
        if last_stage and i % n_l == n_l - 1:
            tot = states + skel + lse + dgrad + classifier
            if tot > peak:
                peak, where, snap = tot, ("classifier", i), (skel, lse, 0.0, dgrad, 0.0, classifier)
            dgrad += u.dgrad[i // n_l]
    skel -= off[n_u - 1]
    skel_end = skel
    dkv_peak = 0.0
    for v in range(n_u - 1, -1, -1):
        k, j = divmod(v, n_l)
        if 0 < v <= n_off:
            skel += off[v - 1]
        if last_stage and j == n_l - 1:
            dgrad -= u.dgrad[k]
        if k == n_k - 1:
            dkv += u.dkv_last
            dkv_peak = max(dkv_peak, dkv)
        tot = states + skel + lse + dkv + dgrad + work
        if tot > peak:
            peak, where, snap = tot, ("bwd", v), (skel, lse, dkv, dgrad, work, 0.0)
        skel -= sk[v]
        lse -= ls[v]
        if k < n_k - 1:
            dkv -= u.kv[k]
    return peak, where, snap, skel_end, dkv_peak


def _random_units(rng: random.Random, n_k: int, n_l: int) -> StageUnits:
    def vals(scale):
        return [rng.uniform(0.1, 1.0) * scale for _ in range(n_k)]

    keep = vals(1e9)
    off = [k * rng.uniform(0.0, 1.0) for k in keep]
    n_u = n_k * n_l
    return StageUnits(n_l=n_l, n_off=max(0, n_u - 2), skeletal=(keep, keep), lse=(vals(1e6),) * 2,
                      offload=(off, [0.0] * n_k), kv=vals(3e8), dgrad=vals(2e8),
                      dkv_last=rng.uniform(1e8, 1e9) if n_k > 1 else 0.0)


@pytest.mark.parametrize("seed", range(12))
def test_array_walk_is_the_loop_to_the_bit(seed):
    rng = random.Random(seed)
    n_k, n_l = rng.choice([1, 2, 3, 17, 64]), rng.choice([1, 2, 4, 8])
    u = _random_units(rng, n_k, n_l)
    if seed % 3 == 0:  # no unit offloaded (a stage of two units, or of one)
        u = dataclasses.replace(u, n_off=0)
    states, work = rng.uniform(1e9, 5e10), rng.uniform(1e8, 1e9)
    classifier = rng.uniform(1e8, 2e10)  # sometimes above the working block: a classifier peak
    for last in (False, True):
        assert sppo_stage_walk(u, states, work, classifier, last) == _loop_walk(u, states, work, classifier, last)


def test_the_last_stage_peaks_at_its_classifier_where_the_loop_does():
    u = _random_units(random.Random(7), 4, 2)
    got = sppo_stage_walk(u, 1e9, 1e6, 1e12, True)
    assert got[1][0] == "classifier" and got == _loop_walk(u, 1e9, 1e6, 1e12, True)


@pytest.mark.parametrize("pp,n,mux", [(2, 4, False), (4, 6, True), (1, 5, False)])
def test_a_prepared_walk_is_sppo_memory_at_every_ratio(pp, n, mux):
    lay, seq = Layout(tp=2, pp=pp), 64 * 1024
    pol = Sppo(None, subseqs=n, multiplex=mux).with_bounds(TOY, lay, 1, seq)
    walk = SppoMemoryWalk(TOY, lay, 1, pol, A100)
    for a in (0.0, 0.25, 0.6, 1.0):
        p = dataclasses.replace(pol, alphas=tuple(min(1.0, a * (1 + i / n)) for i in range(n)))
        assert walk.memory(p).to_dict() == sppo_memory(TOY, lay, 1, seq, p, A100).to_dict()
    other = Sppo(None, subseqs=n + 1, multiplex=mux).with_bounds(TOY, lay, 1, seq)
    with pytest.raises(ValueError, match="partition"):
        walk.memory(dataclasses.replace(other, alphas=(0.5,) * (n + 1)))


def test_the_search_goes_past_its_grid_edge_while_the_best_sits_on_it():
    """`exhaustive_search` and `resolve_for_layout` try N up to 1K tokens per device, and the next N while the best
    fitting point has its layout's largest N (a review: llama-3.1-70b on 64 H100s at 128K, tp4+sp pp4: N=32 at the
    edge was called the best, N=64 faster on both tiers)."""
    from memo_sim.model.config import get_model
    from memo_sim.search.sppo import exhaustive_search, resolve_for_layout, solve_point

    model, h100, seq = get_model("llama-3.1-70b"), load_profile("h100-sxm5-80gb"), 128 * 1024
    pts, size, _n, _rej = exhaustive_search(model, seq, 64, h100, tp=4, pp=4)
    best = next(p for p in pts if p.status == "OK")
    assert best.policy.subseqs == 64 and size == 56  # 48 grid points (N 1..32) and N=64's 8
    edge = solve_point(model, best.layout, 1, seq, h100, 32)
    assert best.estimate.iteration_s < edge.estimate.iteration_s
    assert resolve_for_layout(model, best.layout, 1, seq, h100).policy.subseqs == 64
