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
"""

from __future__ import annotations

import math

from memo_sim.profile.schema import HardwareProfile, Link
from memo_sim.layout.parallel import group_spans_nodes


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


def group_link(profile: HardwareProfile, size: int, stride: int) -> Link:
    """NVLink for a group inside a node, the inter-node link for one that spans nodes."""
    return profile.internode if group_spans_nodes(size, stride, profile.node_gpus) else profile.nvlink


def link_kind(profile: HardwareProfile, link: Link) -> str:
    """The engine's name for a profile link: ``internode`` or ``nvlink``."""
    return "internode" if link is profile.internode else "nvlink"
