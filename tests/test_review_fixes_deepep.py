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


def test_deepep_is_refused_where_its_kernels_cannot_run():
    """DeepEP's normal (training) kernels run at most NUM_MAX_NVL_PEERS 8 GPUs of a node over NVLink and
    NUM_MAX_RDMA_PEERS 20 nodes (160 ranks), and not on GB200 NVL72 (deepseek-ai/DeepEP issues 392 and 579): the
    what-if priced EP 256 and a 72-GPU NVLink domain, and the export wrote them as fully expressed (a review)."""
    from click.testing import CliRunner

    from memo_sim.cli import cli
    from memo_sim.layout.parallel import Layout, check_layout
    from memo_sim.model.config import PRESETS

    m = PRESETS["qwen3-30b-a3b"]
    assert check_layout(Layout(dp=128, ep=128, zero=1, moe_dispatcher="deepep"), m, 128, 8, 8192) is None
    assert "nodes of at most 8 GPUs" in check_layout(Layout(dp=64, ep=8, zero=1, moe_dispatcher="deepep"),
                                                     m, 64, 72, 8192)
    assert check_layout(Layout(dp=64, ep=8, zero=1), m, 64, 72, 8192) is None  # all-to-all runs there
    r = CliRunner().invoke(cli, ["whatif", "--model", "deepseek-v3", "--layers", "4", "--gpus", "256", "--profile",
                                 "b200-180gb", "--seq", "8K", "--framework", "megatron", "--tp", "1", "--ep", "256",
                                 "--pp", "1", "--zero", "1", "--policy", "store_all", "--moe-dispatcher", "deepep",
                                 "--no-plan", "--jobs", "1"])
    assert r.exit_code == 2 and "at most 160 ranks" in r.output and len(r.output.strip().splitlines()) == 1
