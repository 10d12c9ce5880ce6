"""Parameters one GPU holds, dense and routed-expert parts apart, written once.

Dense parameters (attention, norms, shared experts, embedding) are split by TP (but latent
attention's down projections and the router, which every TP rank holds whole) and
replicated over the DP x CP x Ulysses group (``layout.state_shards``); a MoE layer's routed experts
are split by EP x ETP and replicated over the expert data-parallel group (``layout.expert_dp``;
`memo_sim.layout.parallel`). ZeRO shards each part over its own replicas, and since etp x ep x
expert_dp = tp x state_shards (the same GPUs of a pipeline stage), a ZeRO shard holds
(dense + expert) / (tp x state_shards) either way. For a dense model ``local`` is params / tp and
``sharded`` local / state_shards, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig


@dataclass(frozen=True)
class GpuParams:
    local: float  # held by one GPU before ZeRO (dense / tp + expert / (ep x etp))
    sharded: float  # one GPU's ZeRO shard of them
    expert_local: float = 0.0  # the routed-expert part of ``local``
    expert_sharded: float = 0.0  # the routed-expert part of ``sharded``

    @property
    def shards(self) -> float:
        """The divisor that takes ``local`` to ``sharded`` (the state_shards for a dense model)."""
        return self.local / self.sharded if self.sharded else 1.0


@lru_cache(maxsize=1 << 15)
def gpu_params(model: ModelConfig, layout: Layout, total: float, expert: float, replicated: float = 0.0) -> GpuParams:
    """``total`` parameters of which ``expert`` are routed experts and ``replicated`` are whole on every
    TP rank (`ModelConfig.replicated_layer_params`), as one GPU of ``layout`` holds them."""
    dense = total - expert - replicated
    expert_local = expert / (layout.ep * layout.etp)
    local = dense / layout.tp + replicated + expert_local
    # ZeRO shards over the whole group; FSDP over its shard group (HSDP: replicated across the rest; `memo_sim.dp`)
    n = layout.dp_flavour.shard_group(layout)
    return GpuParams(local, (dense + expert) / (layout.tp * n) + replicated / n, expert_local, expert / (layout.tp * n))


def model_gpu_params(model: ModelConfig, layout: Layout) -> GpuParams:
    """The whole model's parameters on one GPU (pp = 1), its multi-token-prediction modules included
    (`ModelConfig.trained_params`)."""
    return gpu_params(model, layout, model.trained_params(), model.trained_routed_params(),
                      model.trained_replicated_params())


def layer_gpu_params(model: ModelConfig, layout: Layout) -> GpuParams:
    """One (repeated) layer's parameters on one GPU."""
    return gpu_params(model, layout, model.layer_params(), model.expert_layer_params() if model.moe else 0,
                      model.replicated_layer_params())
