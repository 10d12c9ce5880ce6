"""DeepEP (deepseek-ai/DeepEP; Megatron-Core's ``--moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend deepep``, megatron/core/transformer/moe/README.md at d98e8a64:
"removes redundant tokens during cross-node communication, fuses intra/inter-node communication
into single kernel"): a token routed to several experts on one remote node crosses the inter-node
link once and is copied to those experts' GPUs over NVLink there; combine reduces on the node
first and sends one sum back. Priced by `memo_sim.cost.moe.ep_alltoall_dedup_time`."""

from __future__ import annotations

from memo_sim.layout.moe_dispatchers.base import Dispatcher, Step
from memo_sim.layout.moe_dispatchers.registry import DISPATCHERS

DISPATCHERS.add("deepep", Dispatcher(
    "deepep", "DeepEP: each token over the inter-node link once per destination node, NVLink inside it",
    dispatch=(Step("alltoall_dedup", "ep", "routed"),),
    combine=(Step("alltoall_dedup", "ep", "routed"),),
    megatron="flex", megatron_backend="deepep"))
