"""The all-gather dispatcher (Megatron-Core's ``MoEAllGatherTokenDispatcher``, its default,
megatron/core/transformer/moe/token_dispatcher.py at d98e8a64): every token of the ETP x EP group
(with its routing map and probabilities) is all-gathered to every rank of the group, each rank
keeps the tokens routed to its local experts; combine reduce-scatters the expert outputs back.
It moves every token once per rank of the group rather than top-k copies once, so it pays where
the group is small and top-k large. Its buffers (`base.Dispatcher.buffer_step`): the gather's output holds
the group's every token, etp x ep x the rank's shard x hidden (``gather_from_sequence_parallel_region`` over
``tp_ep_group``, [S*B*EP, H]), and the combine unpermutes the expert outputs into a buffer of that size before
its reduce-scatter (``reduce_scatter_to_sequence_parallel_region``)."""

from __future__ import annotations

from memo_sim.layout.moe_dispatchers.base import Dispatcher, Step
from memo_sim.layout.moe_dispatchers.registry import DISPATCHERS

DISPATCHERS.add("allgather", Dispatcher(
    "allgather", "all tokens all-gathered over ETP x EP, outputs reduce-scattered back",
    dispatch=(Step("allgather", "etp_ep", "tokens"),),
    combine=(Step("reducescatter", "etp_ep", "tokens"),),
    megatron="allgather"))
