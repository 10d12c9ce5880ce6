"""Store all: every skeletal tensor of every layer stays on the GPU until its backward."""

from __future__ import annotations

from memo_sim.policy.base import Policy
from memo_sim.policy.registry import register


@register
class StoreAll(Policy):
    name = "store_all"
    summary = "keep every layer's skeletal activations on the GPU"

    def resident_bytes(self, sk, n_layers):
        return n_layers * sk["total"]

    def forward_kept(self, sk):
        return [("skeletal", sk["total"] + sk["lse"])]

    def layer_blocks(self, sk):
        return [("skeletal", sk["total"])]
