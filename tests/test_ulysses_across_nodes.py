"""Ulysses' all-to-all over a group that spans nodes: a rank sends its off-node peers' shares over the inter-node
link and its on-node peers' over NVLink at the same time (`memo_sim.cost.collectives.group_alltoall_time`, the rule
expert parallelism's all-to-all reads too); a review priced uly16 on two nodes of 8 as if all 15/16 of the buffer
crossed InfiniBand (1.9x too slow)."""

from __future__ import annotations

import pytest

from memo_sim.cost import collectives as coll
from memo_sim.cost.activations import tokens_per_gpu
from memo_sim.cost.layer_time import forward_costs
from memo_sim.cost.moe import ep_alltoall_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.model.layer_graph import DTYPE_BYTES
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")  # nodes of 8
LLAMA = get_model("llama-3.1-8b")
SEQ = 512 * 1024


def _qkv_alltoall(layout: Layout) -> tuple[float, float]:
    op = next(c for c in forward_costs(LLAMA, layout, 1, SEQ, H100) if c.name == "alltoall_qkv")
    return op.seconds, op.nbytes


def test_a_ulysses_group_across_two_nodes_sends_half_its_buffer_over_infiniband():
    t, size = _qkv_alltoall(Layout(ulysses=16))
    # q, and K and V with each of the 8 KV heads repeated twice over 16 ranks, for the rank's 32K tokens
    assert size == tokens_per_gpu(Layout(ulysses=16), 1, SEQ) * (4096 + 2 * 2 * 1024) * DTYPE_BYTES[LLAMA.dtype]
    ib_bw, ib_lat = coll.link_params(H100.internode, "all_to_all")
    nv_bw, nv_lat = coll.link_params(H100.nvlink, "all_to_all")
    ib = 8 * ib_lat + size * 8 / (16 * ib_bw)  # the 8 off-node peers' shares
    nv = 7 * (nv_lat + size / (16 * nv_bw))  # the 7 on-node peers', at the same time
    assert t == pytest.approx(max(ib, nv), rel=1e-12)
    whole_group_on_ib = coll.alltoall_time(size, 16, ib_bw, ib_lat)
    assert whole_group_on_ib > 1.8 * t  # the old price


def test_a_ulysses_group_inside_a_node_is_the_nvlink_all_to_all():
    t, size = _qkv_alltoall(Layout(ulysses=8))
    assert t == pytest.approx(coll.alltoall_time(size, 8, *coll.link_params(H100.nvlink, "all_to_all")), rel=1e-12)


def test_ulysses_and_expert_parallelism_read_one_all_to_all_rule():
    for lay in (Layout(dp=16, ep=16), Layout(dp=12, ep=6), Layout(dp=8, ep=8)):
        assert ep_alltoall_time(1e8, lay, H100) == coll.group_alltoall_time(1e8, lay.ep, lay.etp, lay, H100)
    # a Ulysses group of 6 ranks on nodes of 8 over 24 GPUs: ranks 6-11 cross a boundary, and the step waits for
    # the rank with the fewest peers on its node (2 of 6)
    lay = Layout(ulysses=6, dp=4)
    size = 1e8
    assert coll.group_alltoall_time(size, 6, 1, lay, H100) == pytest.approx(coll.alltoall_rank_time(size, 6, 2, H100))
