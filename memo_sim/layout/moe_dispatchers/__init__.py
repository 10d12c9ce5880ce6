"""MoE token dispatchers (``Layout.moe_dispatcher``), one module each, registered by name (`base`
says what a dispatcher is; `memo_sim.cost.moe` prices its steps):

- ``alltoall`` (`alltoall`): top-k copies by all-to-all over the EP group (Megatron-Core, torchtitan);
- ``allgather`` (`allgather`): every token all-gathered over ETP x EP (Megatron-Core's default);
- ``deepep`` (`deepep`): DeepEP, each token across the inter-node link once per destination node.

A new dispatcher is its module here (imported below), registering a `Dispatcher` built from the
steps `base` knows; a new kind of step also adds its price in `memo_sim.cost.moe`.
"""

from __future__ import annotations

from memo_sim.layout.moe_dispatchers import alltoall  # noqa: F401  (each module registers its dispatcher, in order)
from memo_sim.layout.moe_dispatchers import allgather  # noqa: F401
from memo_sim.layout.moe_dispatchers import deepep  # noqa: F401
from memo_sim.layout.moe_dispatchers.base import Dispatcher, Step  # noqa: F401  (re-exported)
from memo_sim.layout.moe_dispatchers.registry import DISPATCHERS

DISPATCHER_NAMES: tuple[str, ...] = DISPATCHERS.names()


def dispatcher(name: str) -> Dispatcher:
    """The dispatcher called ``name`` (a one-line `MemoError` listing the known ones otherwise)."""
    return DISPATCHERS.get(name)
