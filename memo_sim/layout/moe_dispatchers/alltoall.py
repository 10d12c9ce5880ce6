"""The all-to-all dispatcher (Megatron-Core's ``MoEAlltoAllTokenDispatcher``,
megatron/core/transformer/moe/token_dispatcher.py at d98e8a64; torchtitan's and DeepSpeed's
expert-parallel dispatch): the router's top-k copies of each token, permuted by expert, go to the
expert's EP rank in one all-to-all over the EP group; with expert tensor parallelism the received
tokens are then all-gathered over the ETP group (each ETP rank holds a slice of every local
expert). Combine: reduce-scatter over ETP, then the all-to-all back."""

from __future__ import annotations

from memo_sim.layout.moe_dispatchers.base import Dispatcher, Step
from memo_sim.layout.moe_dispatchers.registry import DISPATCHERS

DISPATCHERS.add("alltoall", Dispatcher(
    "alltoall", "top-k token copies by all-to-all over EP (then all-gather over ETP)",
    dispatch=(Step("alltoall", "ep", "routed"), Step("allgather", "etp", "routed")),
    combine=(Step("reducescatter", "etp", "routed"), Step("alltoall", "ep", "routed")),
    megatron="alltoall"))
