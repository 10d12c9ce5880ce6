"""Collective and point-to-point communication times (alpha-beta model), written once.

``size`` is the bytes each GPU ends up with (all-gather), starts with (reduce-scatter,
all-reduce) or sends in all (all-to-all). ``g`` GPUs, per-direction bandwidth ``bw`` bytes/s,
per-step latency ``lat`` seconds.

- ring all-gather / reduce-scatter: (g-1)·(lat + size/(g·bw))
- ring all-reduce: 2·(g-1)·(lat + size/(g·bw))
- tree all-reduce (double binary tree): 2·log2(g)·lat + 2·size/bw
- all-to-all: (g-1)·(lat + size/(g·bw))
- send/recv: lat + size/bw
- broadcast / reduce (binomial tree, METP's weight blocks): ceil(log2 g)·(lat + size/bw); the
  root's block passes log2 g hops, so each GPU's port carries log2(g)·size (papers/metp.txt 4.2)

``bw`` and ``lat`` are the link's own (a send/recv's) unless the profile measured the collective
itself on that link (`Link.collectives`, written by ``memo-exec calibrate``): `link_params` picks
them, and `fit_params` turns a measured line t = intercept + slope·size at g ranks into the
parameters that make the collective's formula above give those times. A library's collective is
not a chain of ping-pongs (gloo's reduce-scatter costs several times its all-gather on the same
bytes), so where it was measured its own fit prices it.
"""

from __future__ import annotations

import math

from memo_sim.profile.schema import COLLECTIVES, HardwareProfile, Link
from memo_sim.layout.parallel import (Layout, expert_group_placements, fewest_group_ranks_on_a_node, group_spans_nodes,
                                      layout_group_spans)


def ring_allgather_time(size: float, g: int, bw: float, lat: float) -> float:
    return 0.0 if g <= 1 else (g - 1) * (lat + size / (g * bw))


def ring_reduce_scatter_time(size: float, g: int, bw: float, lat: float) -> float:
    return ring_allgather_time(size, g, bw, lat)


def ring_allreduce_time(size: float, g: int, bw: float, lat: float) -> float:
    return 0.0 if g <= 1 else 2 * (g - 1) * (lat + size / (g * bw))


def tree_allreduce_time(size: float, g: int, bw: float, lat: float) -> float:
    return 0.0 if g <= 1 else 2 * math.log2(g) * lat + 2 * size / bw


def allreduce_time(size: float, g: int, bw: float, lat: float) -> float:
    """NCCL picks the faster of ring and tree; so do we."""
    return min(ring_allreduce_time(size, g, bw, lat), tree_allreduce_time(size, g, bw, lat))


def alltoall_time(size: float, g: int, bw: float, lat: float) -> float:
    return 0.0 if g <= 1 else (g - 1) * (lat + size / (g * bw))


def sendrecv_time(size: float, bw: float, lat: float) -> float:
    return lat + size / bw


def tree_steps(g: int) -> int:
    """Rounds of a binomial-tree broadcast or reduce over ``g`` GPUs: ceil(log2 g)."""
    return 0 if g <= 1 else math.ceil(math.log2(g))


def broadcast_time(size: float, g: int, bw: float, lat: float) -> float:
    return tree_steps(g) * (lat + size / bw)


def reduce_time(size: float, g: int, bw: float, lat: float) -> float:
    return tree_steps(g) * (lat + size / bw)


# each collective's formula above (all-reduce: the ring's two passes; NCCL's tree takes the same time at
# g = 2, where calibrate measures), linear in size: t = A·lat + B·size/bw
RING_FORMULAS = {"all_gather": ring_allgather_time, "reduce_scatter": ring_reduce_scatter_time,
                 "all_to_all": alltoall_time, "all_reduce": ring_allreduce_time}
assert set(RING_FORMULAS) == set(COLLECTIVES)


def link_params(link: Link, collective: str | None = None) -> tuple[float, float]:
    """(bandwidth, latency) that price ``collective`` (one of `COLLECTIVES`; None: a send/recv) on
    ``link``: its measured fit where the profile has one, else the link's own."""
    fit = link.collectives.get(collective) if collective is not None else None
    if fit is None:
        return float(link.bandwidth), float(link.latency)
    return float(fit.bandwidth), float(fit.latency)


def ring_params(profile: HardwareProfile, link: Link, collective: str, node_ranks: int = 1,
                g: int = 0) -> tuple[float, float]:
    """(bandwidth, latency) that price ring ``collective`` (all-gather, reduce-scatter, all-reduce: the ring's or
    the tree's formula) over a group with at least ``node_ranks`` of its ranks on every node it touches
    (`group_node_ranks`). Across nodes NCCL's ring passes through the group's ranks on a node over NVLink and enters
    and leaves the node once, so the node's inter-node traffic is one rank's bytes, not each of its ranks', and its
    channels take turns at exiting through every NIC those GPUs reach: the hop runs on ``node_ranks`` GPUs' shares of
    the node's NICs (the node's other GPUs, in other groups, run the same collective at the same time and hold their
    own shares), no faster than the ring's NVLink hops inside the node. nccl-tests' all_reduce_perf over 3 nodes of
    8 A100s with 4 HDR NICs each measured 85-96 GB/s bus bandwidth (NVIDIA/nccl-tests issue 119), about the node's
    100 GB/s of NICs where one GPU's share is 12.5. ``link`` as `link_params` takes it; a collective the profile
    measured on the inter-node link (`Link.collectives`) keeps its fit as measured.

    The latency: the ring's data follows itself around the ring in chunks, so its g - 1 steps (all-reduce: twice that)
    cost one hop's latency each, and of those hops only the ones that leave a node cross the inter-node link: with
    ``node_ranks`` of the group's ``g`` ranks on each of its nodes, nodes - 1 of the g - 1, the rest NVLink's
    (NCCL's own tuning model, src/graph/tuning.cc ncclTopoTuneModel: a ring's latency (nsteps - nInterSteps) x
    intraLat + nInterSteps x interLat, nInterSteps = nNodes - 1 for all-gather and reduce-scatter, 2 (nNodes - 1) for
    all-reduce). The per-step latency returned is their mean over the steps, so that the collective's formula gives
    that sum; without ``g`` (or one rank a node) every step is the inter-node link's."""
    bw, lat = link_params(link, collective)
    if link is profile.internode and node_ranks > 1 and collective not in link.collectives:
        nv_bw, nv_lat = link_params(profile.nvlink, collective)
        bw = min(bw * node_ranks, nv_bw)
        if g > node_ranks:
            nodes = -(-g // node_ranks)
            lat = ((g - nodes) * nv_lat + (nodes - 1) * lat) / (g - 1)
    return bw, lat


def group_node_ranks(layout: Layout, size: int, stride: int, profile: HardwareProfile) -> int:
    """The fewest of a group's ranks on one node it touches, over every group of ``size`` ranks ``stride`` apart in
    a stage's GPU order (`memo_sim.layout.parallel.expert_group_placements`: the data group is the state_shards
    ranks TP apart, every replica's and every stage's looked at); ``size`` itself for groups inside a node."""
    return fewest_group_ranks_on_a_node(layout, size, stride, profile.node_gpus)


def link_node_ranks(profile: HardwareProfile, layout: Layout, link: Link, size: int, stride: int) -> int:
    """`ring_params`' ``node_ranks`` of a group of ``size`` ranks ``stride`` apart on ``link``: `group_node_ranks`
    where the group crosses nodes (the inter-node link), 1 on NVLink (nothing of the node's NICs to share)."""
    return group_node_ranks(layout, size, stride, profile) if link is profile.internode else 1


def group_ring_params(profile: HardwareProfile, layout: Layout, link: Link, collective: str, size: int,
                      stride: int) -> tuple[float, float]:
    """`ring_params` of ring ``collective`` over a group of ``size`` ranks ``stride`` apart on ``link``."""
    return ring_params(profile, link, collective, link_node_ranks(profile, layout, link, size, stride), size)


def fit_params(collective: str, g: int, intercept: float, slope: float) -> tuple[float, float]:
    """(bandwidth, latency) with which ``collective``'s formula over ``g`` ranks is the measured line
    ``t = intercept + slope·size`` (seconds, seconds per byte of the formula's ``size``)."""
    if g < 2 or slope <= 0:
        raise ValueError(f"a collective fit needs g >= 2 ranks and a positive slope (g={g}, slope={slope})")
    formula = RING_FORMULAS[collective]
    a = formula(0.0, g, 1.0, 1.0)  # the formula's latency coefficient A
    b = formula(1.0, g, 1.0, 0.0)  # and its bytes coefficient B
    return b / slope, max(0.0, intercept) / a


def group_link(profile: HardwareProfile, size: int, stride: int, gpus: int = 0) -> Link:
    """NVLink for groups inside a node, the inter-node link where one spans nodes (``gpus``: the job's, so that
    every group is looked at, `memo_sim.layout.parallel.group_spans_nodes`; 0: the first group)."""
    return profile.internode if group_spans_nodes(size, stride, profile.node_gpus, gpus) else profile.nvlink


def layout_group_link(profile: HardwareProfile, layout: Layout, size: int, stride: int) -> Link:
    """`group_link` of a group inside the layout's tp x ulysses x cp block (TP, Ulysses, CP), every group of the
    job looked at (`memo_sim.layout.parallel.placed_gpus`: a stage shard's whole layout's), or one named stage's
    groups alone on that stage's shard (`memo_sim.layout.parallel.layout_group_spans`)."""
    return profile.internode if layout_group_spans(layout, size, stride, profile.node_gpus) else profile.nvlink


def tp_params(profile: HardwareProfile, layout: Layout, collective: str) -> tuple[float, float]:
    """(bandwidth, latency) that price the layout's tensor-parallel ``collective`` (``tp`` consecutive ranks): NVLink's
    inside a node; for a TP group over whole nodes (Megatron-LM runs one wherever --tensor-model-parallel-size
    exceeds a node, as 'TP size=32' over 4 nodes), NCCL's ring over the group (`ring_params`): through the group's
    ranks on a node over NVLink, across nodes on their share of the node's NICs."""
    link = layout_group_link(profile, layout, layout.tp, 1)
    return group_ring_params(profile, layout, link, collective, layout.tp, 1)


def alltoall_rank_time(size: float, g: int, local: int, profile: HardwareProfile) -> float:
    """One rank's all-to-all of ``size`` bytes over a group of ``g`` ranks, ``local`` of them (itself included) on
    its node: the ``local - 1`` peers' shares over NVLink and the ``g - local`` others' over the inter-node link, at
    the same time (NCCL's all-to-all posts every peer's send and receive at once), so the longer of the two. A
    group inside a node is the plain all-to-all on NVLink."""
    if local >= g:
        return alltoall_time(size, g, *link_params(profile.nvlink, "all_to_all"))
    nv_bw, nv_lat = link_params(profile.nvlink, "all_to_all")
    ib_bw, ib_lat = link_params(profile.internode, "all_to_all")
    t_nv = (local - 1) * (nv_lat + size / (g * nv_bw))
    t_ib = (g - local) * ib_lat + size * (g - local) / (g * ib_bw)
    return max(t_nv, t_ib)


def group_alltoall_time(size: float, g: int, stride: int, layout: Layout, profile: HardwareProfile) -> float:
    """An all-to-all of ``size`` bytes per rank over groups of ``g`` ranks ``stride`` apart in a stage's GPU
    order (Ulysses: ``ulysses`` ranks ``tp`` apart; expert parallelism: ``ep`` ranks ``etp`` apart): the slowest
    rank of every group of the layout (`memo_sim.layout.parallel.expert_group_placements`: a group across a node
    boundary has ranks with few peers on their node; on one named stage's shard, that stage's groups alone), each
    `alltoall_rank_time`."""
    if g <= 1:
        return 0.0
    locals_ = {c for p in expert_group_placements(layout, g, stride, profile.node_gpus) for c in p}
    return max(alltoall_rank_time(size, g, c, profile) for c in locals_)


def link_kind(profile: HardwareProfile, link: Link) -> str:
    """The engine's name for a profile link: ``internode`` or ``nvlink``."""
    return "internode" if link is profile.internode else "nvlink"
