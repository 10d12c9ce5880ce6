"""The order in which a layout's parallel dimensions number the GPUs (``Layout.rank_order``).

An order is named as Megatron-Core's ``RankGenerator`` names its own, innermost dimension first; rank r's
coordinate in a dimension is ``(r // stride) % degree``, the stride being the product of the degrees inside it.
Expert parallelism folds over a pipeline stage's GPUs (Megatron-Core's parallel folding; `expert_group_ranks`
in `memo_sim.layout.parallel`) and has no place of its own here. Ulysses sits between TP and CP in both.

- ``tp-cp-dp-pp`` (default): pipeline stages outermost, so a stage is a block of tp x ulysses x cp x dp
  consecutive ranks and its data-parallel replicas are tp x ulysses x cp apart. Every framework memo knows numbers
  its ranks so: Megatron-LM (``megatron/training/initialize.py``: ``order='tp-cp-ep-dp-pp'``, and the 2021
  ``initialize_model_parallel``'s pipeline groups ``range(i, world_size, world_size // pp)``), torchtitan (its
  mesh ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``, outermost first) and DeepSpeed's pipeline topology
  (``PipeModelDataParallelTopology``: axes pipe, data, model). A multi-node pipeline's stage hops cross nodes
  and its data-parallel groups stay in a node where a stage's replicas fit in one.
- ``tp-cp-pp-dp``: Megatron-LM's ``--use-tp-pp-dp-mapping`` (``order='tp-cp-ep-pp-dp'``): data parallelism
  outermost, a replica's stages consecutive, each ``tp x ulysses x cp`` ranks on from the last.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

# innermost first; the first is the default
RANK_ORDERS: dict[str, tuple[str, ...]] = {
    "tp-cp-dp-pp": ("tp", "ulysses", "cp", "dp", "pp"),
    "tp-cp-pp-dp": ("tp", "ulysses", "cp", "pp", "dp"),
}
RANK_ORDER_NAMES = tuple(RANK_ORDERS)
DEFAULT_RANK_ORDER = RANK_ORDER_NAMES[0]
MEGATRON_OPTION = {"tp-cp-pp-dp": "--use-tp-pp-dp-mapping"}  # the Megatron-LM switch of a non-default order


def dims(order: str) -> tuple[str, ...]:
    """The dimensions of ``order``, innermost first."""
    return RANK_ORDERS[order]


def dim_stride(layout, dim: str) -> int:
    """How many ranks apart neighbours in dimension ``dim`` sit (the product of the degrees inside it)."""
    return math.prod([getattr(layout, d) for d in _inner(layout.rank_order, dim)])


@lru_cache(maxsize=64)
def _inner(order: str, dim: str) -> tuple[str, ...]:
    """The dimensions inside ``dim`` in ``order`` (looked up once: every MoE layout's check asks)."""
    inner = dims(order)
    return inner[:inner.index(dim)]


def pp_stride(layout) -> int:
    """Ranks between a GPU of pipeline stage s and its peer of stage s + 1 (the P2P hop)."""
    return dim_stride(layout, "pp")


def replica_stride(layout) -> int:
    """Ranks between a GPU and its peer in the next data-parallel replica."""
    return dim_stride(layout, "dp")


def stage_of_rank(layout, rank: int) -> int:
    """The pipeline stage global rank ``rank`` runs."""
    return (rank // pp_stride(layout)) % layout.pp


def data_group_stride(layout) -> int:
    """The stride `memo_sim.cost.collectives.group_link` takes for a stage's data group (its dp x cp x ulysses
    ranks holding the same weights), whose g ranks it takes to span g x stride: TP where the group is consecutive
    TP groups (no pipeline, or stages outermost), else the replicas' distance over cp x ulysses (the group's
    cp x ulysses consecutive TP groups in each of dp replicas span dp x that distance)."""
    if layout.pp == 1 or layout.dp == 1 or replica_stride(layout) == layout.tp * layout.ulysses * layout.cp:
        return layout.tp
    return replica_stride(layout) // (layout.cp * layout.ulysses)


def places_apart(layout, gpus_per_node: int) -> bool:
    """Whether the orders put ``layout``'s GPUs on different nodes: a pipeline with data parallelism over more than
    one node whose stage (tp x ulysses x cp ranks of a replica) is smaller than a node; else every order's groups
    span the same nodes (a review: a 4-GPU pipeline was said to sit on other nodes in the other order)."""
    return (layout.pp > 1 and layout.dp > 1 and layout.gpus > gpus_per_node
            and layout.tp * layout.ulysses * layout.cp < gpus_per_node)


def order_variants(layout, orders: tuple[str, ...], gpus_per_node: int) -> list:
    """``layout`` in each of ``orders`` where they place its GPUs apart (`places_apart`), else in the first."""
    if not places_apart(layout, gpus_per_node):
        return [layout if layout.rank_order == orders[0] else replace(layout, rank_order=orders[0])]
    return [layout if layout.rank_order == o else replace(layout, rank_order=o) for o in orders]


def mesh_dims(order: str) -> tuple[str, ...]:
    """The dimensions of ``order``, outermost first (a `DeviceMesh`'s row-major shape)."""
    return tuple(reversed(dims(order)))
