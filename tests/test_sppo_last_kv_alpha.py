"""[sppo] alpha_i·A_i = M_threshold (papers/sppo.txt sec. 5.2) holds for the bytes each unit really copies,
the last subsequence's included: its K and V, which no later piece reads, go to host with its other rows
(`memo_sim.policy.sppo`, the executor's `memo_exec.sppo.kvcache`), so its A_i counts them. Before, the solver's
A_i left every subsequence's K/V out, and the last one's units copied M·(1 + K/V share) bytes: more than the
threshold the overlap was sized for."""

from __future__ import annotations

import pytest

from memo_sim.cost.sppo import kv_cache_bytes, stage_gpu_shard
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy.sppo import Sppo
from memo_sim.profile.loader import load_profile
from memo_sim.search.sppo.alphas import solve_alphas

K = 1024


@pytest.mark.parametrize("pp,multiplex", [(1, False), (2, False), (2, True)])
def test_every_units_copy_is_the_threshold_the_last_ones_kv_included(pp, multiplex):
    model, prof = get_model("gpt-7b"), load_profile("a100-sxm4-80gb")
    lay = Layout(tp=4, pp=pp, sp=True)
    pol = Sppo(None, subseqs=4, multiplex=multiplex).with_bounds(model, lay, 1, 64 * K)
    a_small = pol.offloadable_bytes(model, lay, 1, pol.bounds[-1] - pol.bounds[-2])
    m = 0.5 * a_small  # every alpha below 1
    solved, choice, _mem = solve_alphas(model, lay, 1, 64 * K, pol, prof, threshold=m)
    assert choice.threshold_bytes == pytest.approx(m) and all(0 < a < 1 for a in solved.alphas)
    shard = stage_gpu_shard(lay)
    for pieces in solved.stage_pieces(model, lay, 1):
        copied = [0.0] * solved.subseqs  # a subsequence's units (its parts, where multiplexed) per layer
        for p in pieces:
            copied[p.sub] += solved.offload_bytes_of(model, shard, 1, p, cached_kv=p is not pieces[-1])
        for i, c in enumerate(copied):
            # rows are whole (floor of alpha x rows): within 1% of M; a stage whose last part is shorter than another
            # stage's copies less K/V of the last subsequence, never more than M
            assert c <= m * 1.0001, (i, c, m)
            if not multiplex or i < solved.subseqs - 1:
                assert c == pytest.approx(m, rel=0.01), (i, c, m)
    # the last subsequence's A counts its K/V; the others' leave theirs cached on the GPU
    a = solved.subsequence_offloadable(model, lay, 1)
    kv_last = kv_cache_bytes(model, shard, 1, max(ps[-1].tokens for ps in solved.stage_pieces(model, lay, 1)))
    assert a[-1] == pytest.approx(a_small + kv_last)
    assert a[0] == pytest.approx(pol.offloadable_bytes(model, lay, 1, pol.bounds[1] - pol.bounds[0]))
