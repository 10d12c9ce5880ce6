"""DeepEP priced on both sides of an uneven split (a review): EP 64 as 56 + 8 ranks across two GB200 racks, each
of the 56 ranks reaching the 8-rank side with chance 1 - (1 - 8/64)^8 = 0.656 per token, 17.3 GB arrive through the
small side's 8 ports (43 ms at 50 GB/s), where memo priced the 9.5 ms those 8 ranks send."""

from __future__ import annotations

import pytest

from memo_sim.cost.moe import _dedup_rank_time, nodes_hit
from memo_sim.profile.loader import load_profile

NVL72 = load_profile("gb200-nvl72")
TOKENS, TOKEN_BYTES = 32768, 7168 * 2


def test_the_small_side_of_an_uneven_split_receives_from_the_many():
    small = _dedup_rank_time(TOKENS, TOKENS * 8, 8, TOKEN_BYTES, 64, (56, 8), 1, NVL72, 0, 0)
    arrive = 56 * TOKENS * TOKEN_BYTES * (1 - (1 - 8 / 64) ** 8) / 8  # per port of the small side
    assert small == pytest.approx(float(NVL72.internode.latency) + arrive / float(NVL72.internode.bandwidth),
                                  rel=1e-9)
    assert small > 4 * _dedup_rank_time(TOKENS, TOKENS * 8, 8, TOKEN_BYTES, 64, (56, 8), 0, NVL72, 0, 0)


def test_an_even_split_prices_as_before():
    """Every node holding as many of the group's ranks: what a rank receives is what it sends."""
    t = _dedup_rank_time(TOKENS, TOKENS * 8, 8, TOKEN_BYTES, 32, (8, 8, 8, 8), 0, NVL72, 0, 0)
    send = 3 * nodes_hit(4, 8, 0, 0) * TOKENS * TOKEN_BYTES / float(NVL72.internode.bandwidth)
    nv = 7 * float(NVL72.nvlink.latency) + TOKENS * 8 * TOKEN_BYTES * 7 / 8 / float(NVL72.nvlink.bandwidth)
    assert t == pytest.approx(max(nv, 3 * float(NVL72.internode.latency) + send), rel=1e-9)
