"""A ring collective across nodes runs its node hop on the NIC shares of all the group's ranks on that node
(`memo_sim.cost.collectives.ring_params`, `group_node_ranks`): NCCL's ring crosses each node boundary once, carrying
one rank's bytes, on channels spread over the node's NICs. nccl-tests' all_reduce_perf over 3 nodes of 8 A100s with
4 HDR NICs each measured 85-96 GB/s of bus bandwidth (NVIDIA/nccl-tests issue 119), the node's 100 GB/s of NICs,
where one GPU's share is 12.5 GB/s. All-to-alls and sends keep each rank's own share."""

from __future__ import annotations

import dataclasses

import pytest

from memo_sim.cost import collectives as coll
from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.param_split import layer_gpu_params
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.profile.loader import load_profile
from memo_sim.profile.schema import CollectiveFit

A100 = load_profile("a100-sxm4-80gb")
H100 = load_profile("h100-sxm5-80gb")
M = PRESETS["llama-3.1-8b"]
GB = 1e9


@pytest.mark.parametrize("layout, ranks", [
    (Layout(tp=1, dp=32), 8),  # a whole node of each data group
    (Layout(tp=2, dp=16), 4),
    (Layout(tp=4, dp=8), 2),
    (Layout(tp=8, dp=4), 1),  # TP fills the node: one rank of each data group a node
    (Layout(tp=1, dp=12), 4),  # 12 ranks over nodes of 8: 8 on the first, 4 on the second
])
def test_group_node_ranks_counts_the_fewest_ranks_on_a_node(layout, ranks):
    assert coll.group_node_ranks(layout, layout.state_shards, layout.tp, A100) == ranks


def test_ring_params_scale_the_inter_node_share_and_stop_at_nvlink():
    ib = float(A100.internode.bandwidth)
    assert ib == pytest.approx(12.5 * GB)
    for collective in ("all_gather", "reduce_scatter", "all_reduce"):
        assert coll.ring_params(A100, A100.internode, collective, 1) == coll.link_params(A100.internode, collective)
        assert coll.ring_params(A100, A100.internode, collective, 8)[0] == pytest.approx(100 * GB)
        assert coll.ring_params(A100, A100.internode, collective, 8)[1] == float(A100.internode.latency)
        # inside a node the link is NVLink, as before, whatever the count
        assert coll.ring_params(A100, A100.nvlink, collective, 8) == coll.link_params(A100.nvlink, collective)
        # never faster than the ring's NVLink hops
        nv = coll.link_params(H100.nvlink, collective)[0]
        assert coll.ring_params(H100, H100.internode, collective, 64)[0] == pytest.approx(nv)


def test_a_rings_latency_crosses_the_node_boundary_once_a_node():
    """The ring's chunks pass its g - 1 hops in a pipeline; of those, nodes - 1 leave a node (NCCL's tuning model,
    src/graph/tuning.cc: (nsteps - nInterSteps) x intraLat + nInterSteps x interLat, nInterSteps = nNodes - 1 for an
    all-gather or reduce-scatter, 2 (nNodes - 1) for an all-reduce's 2 (nRanks - 1) steps): the per-step latency
    ring_params gives is their mean, so the formulas' (g - 1) x lat is the sum. One rank a node: every hop leaves it."""
    nv_lat, ib_lat = float(A100.nvlink.latency), float(A100.internode.latency)
    for collective in ("all_gather", "reduce_scatter", "all_reduce"):
        for g, nodes in ((16, 2), (32, 4), (128, 16)):
            lat = coll.ring_params(A100, A100.internode, collective, 8, g)[1]
            assert (g - 1) * lat == pytest.approx((g - nodes) * nv_lat + (nodes - 1) * ib_lat)
            assert coll.ring_allgather_time(0.0, g, 1.0, lat) == pytest.approx((g - nodes) * nv_lat
                                                                              + (nodes - 1) * ib_lat)
        assert coll.ring_params(A100, A100.internode, collective, 1, 16)[1] == ib_lat
        assert coll.ring_params(A100, A100.internode, collective, 8)[1] == ib_lat  # the group's size not given
    # the TP-32 ring's 31 steps: 3 x 15 us + 28 x 8 us = 269 us where every step at 15 us gave 465 us
    prof = load_profile("a100-sxm4-40gb")
    lat = coll.tp_params(prof, Layout(tp=32, sp=True), "all_gather")[1]
    assert 31 * lat == pytest.approx(269e-6)


def test_inter_node_fit_is_kept_as_measured():
    """A collective the profile measured on the inter-node link (`Link.collectives`) keeps its fit as measured;
    the others ride the node ranks' shares."""
    link = dataclasses.replace(A100.internode, collectives={"all_gather": CollectiveFit(30 * GB, 20e-6)})
    prof = dataclasses.replace(A100, internode=link)
    assert coll.ring_params(prof, prof.internode, "all_gather", 8) == coll.link_params(link, "all_gather")
    assert coll.ring_params(prof, prof.internode, "reduce_scatter", 8)[0] == pytest.approx(100 * GB)


def test_nccl_tests_bus_bandwidth_over_three_a100_nodes():
    """all_reduce_perf over 24 GPUs of 3 nodes (8 A100s, 4 HDR NICs each): bus bandwidth = 2 (g-1)/g x bytes / time.
    memo's ring over the node's NIC shares gives the node's 100 GB/s, the measurement's ceiling (85-96 GB/s
    measured); one GPU's share would give 12.5 GB/s, an eighth of what NCCL reached."""
    g, size = 24, 4 * 2**30
    lay = Layout(tp=1, dp=g)
    nr = coll.group_node_ranks(lay, g, 1, A100)
    t = coll.allreduce_time(size, g, *coll.ring_params(A100, A100.internode, "all_reduce", nr))
    busbw = 2 * (g - 1) / g * size / t
    assert 90 * GB < busbw <= 100 * GB
    t_share = coll.allreduce_time(size, g, *coll.link_params(A100.internode, "all_reduce"))
    assert 2 * (g - 1) / g * size / t_share < 12.5 * GB


def test_data_group_gathers_ride_the_node_ranks_shares():
    """ZeRO-3's layer gather over a data group of 16 (2 nodes of 8) against the same group with TP 8 beside it
    (one rank a node): the first's node hop has 8 GPUs' NIC shares, the second's one."""
    whole = Layout(tp=1, dp=16, zero=3)
    s = grad_sync(M, whole, A100)
    p = layer_gpu_params(M, whole)
    nbytes = M.recipe.weight_bytes * (p.local - p.expert_local)
    assert s.link == "internode"
    # its latency: 14 NVLink hops and the one that leaves the first node (`test_a_rings_latency_...`)
    lat = (14 * float(A100.nvlink.latency) + float(A100.internode.latency)) / 15
    assert s.layer_gather == pytest.approx(coll.ring_allgather_time(nbytes, 16, 100 * GB, lat))
    sparse = Layout(tp=8, dp=16, zero=3)
    s8 = grad_sync(M, sparse, A100)
    p8 = layer_gpu_params(M, sparse)
    n8 = M.recipe.weight_bytes * (p8.local - p8.expert_local)
    assert s8.layer_gather == pytest.approx(coll.ring_allgather_time(n8, 16, 12.5 * GB,
                                                                     float(A100.internode.latency)))
    # the same bytes a GPU: the whole-node group's gather is about 8 times faster
    assert s.layer_gather / nbytes < s8.layer_gather / n8 / 6


def _placements_fewest(layout, size, stride, node):
    from memo_sim.layout.parallel import expert_group_placements
    return min(min(p) for p in expert_group_placements(layout, size, stride, node))


def test_fewest_ranks_on_a_node_equals_the_listed_placements():
    """The arithmetic of evenly spaced groups (`fewest_group_ranks_on_a_node`) against listing every group's ranks
    (`expert_group_placements`), over degrees, pipelines, rank orders, stage shards and node sizes."""
    import itertools

    from memo_sim.layout.parallel import fewest_group_ranks_on_a_node, stage_shard
    from memo_sim.layout.rank_order import RANK_ORDER_NAMES

    checked = 0
    for tp, cp, ul, dp, pp, order, node in itertools.product((1, 2, 3, 4), (1, 2), (1, 3), (1, 3, 4, 12, 40),
                                                              (1, 2, 3), RANK_ORDER_NAMES, (4, 8, 72)):
        lay = Layout(tp=tp, cp=cp, ulysses=ul, dp=dp, pp=pp, rank_order=order)
        shards = [lay] + ([stage_shard(lay), stage_shard(lay, pp - 1)] if pp > 1 or dp > 1 else [])
        for shard in shards:
            for size, stride in ((lay.state_shards, tp), (cp * ul, tp), (dp, tp * cp * ul)):
                if size > 1:
                    assert fewest_group_ranks_on_a_node(shard, size, stride, node) == _placements_fewest(
                        shard, size, stride, node), (lay.label(), order, node, size, stride)
                    checked += 1
    assert checked > 500


def test_a_million_gpu_data_group_is_counted_at_once():
    """A data group of 125,000 ranks: the count comes from the arithmetic, not from listing its ranks."""
    import time

    from memo_sim.layout.parallel import fewest_group_ranks_on_a_node
    t = time.perf_counter()
    assert fewest_group_ranks_on_a_node(Layout(tp=8, dp=125_000), 125_000, 8, 8) == 1
    assert fewest_group_ranks_on_a_node(Layout(tp=1, dp=1_000_000), 1_000_000, 1, 8) == 8
    assert fewest_group_ranks_on_a_node(Layout(tp=2, dp=500_000, pp=1), 500_000, 2, 8) == 4
    assert time.perf_counter() - t < 1.0


def test_the_arithmetic_count_equals_counting_every_rank():
    """`_fewest_evenly_spaced` against counting each rank of each group, on nodes its strides do not divide too
    (interior nodes of floor or ceil of node / stride ranks)."""
    import random

    from memo_sim.layout.parallel import _fewest_evenly_spaced

    def counted(size, stride, stage_gpus, step, pp, node):
        best = size
        for s in range(pp):
            for first in range(0, stage_gpus, size * stride):
                for o in range(stride):
                    on: dict[int, int] = {}
                    for k in range(size):
                        n = (s * step + first + o + k * stride) // node
                        on[n] = on.get(n, 0) + 1
                    best = min(best, min(on.values()))
        return best

    rng = random.Random(1)
    for _ in range(500):
        node = rng.choice([4, 6, 8, 16, 72])
        stride, size, reps, pp = rng.randint(1, node - 1), rng.randint(2, 40), rng.randint(1, 6), rng.randint(1, 4)
        stage_gpus = size * stride * reps
        args = (size, stride, stage_gpus, stage_gpus, pp, node)
        assert _fewest_evenly_spaced(*args) == counted(*args), args
