"""Full recompute (activation checkpointing): keep each layer's input, re-run the whole layer
forward before its backward into one shared buffer."""

from __future__ import annotations

from memo_sim.cost.layer_time import full_recompute_costs
from memo_sim.policy.base import Policy
from memo_sim.policy.registry import register


@register
class FullRecompute(Policy):
    name = "full_recompute"
    recomputes_attention = True
    summary = "keep layer inputs; re-run each layer's forward before its backward"

    @property
    def recompute_fraction(self) -> float:
        return 1.0

    def recomputes_layer(self, layer, n_layers):
        return True

    def recompute_costs(self, model, layout, batch, seq, profile):
        return full_recompute_costs(model, layout, batch, seq, profile)

    def resident_bytes(self, sk, n_layers):
        return n_layers * sk["input"]

    def buffer_bytes(self, sk):
        # one layer's other skeletal tensors rebuilt at a time (its input is already resident)
        return sk["total"] - sk["input"]

    def forward_kept(self, sk):
        return [("input", sk["input"]), ("lse", sk["lse"])]

    def recompute_allocated(self, sk):
        return [("recomputed", sk["total"] - sk["input"])]

    def layer_blocks(self, sk):
        return [("input", sk["input"])]

    def shared_blocks(self, sk, steps, n_layers):
        return [("recompute_buffer", sk["total"], steps.bwd(n_layers - 1), steps.end_of_backward)]
