"""Store all: every skeletal tensor of every layer stays on the GPU until its backward (with
materialised attention also its score-sized tensors, ``sk["scores"]``)."""

from __future__ import annotations

from memo_sim.policy.base import Policy
from memo_sim.policy.registry import register


@register
class StoreAll(Policy):
    name = "store_all"
    summary = "keep every layer's skeletal activations on the GPU"

    def kept_scores(self, sk) -> float:
        """Score-sized bytes a layer keeps for its backward (materialised attention only)."""
        return sk.get("scores", 0.0)

    def resident_bytes(self, sk, n_layers):
        return n_layers * (sk["total"] + self.kept_scores(sk))

    def forward_kept(self, sk):
        out = [("skeletal", sk["total"] + sk["lse"])]
        return out + ([("scores", self.kept_scores(sk))] if self.kept_scores(sk) > 0 else []) + self.kept_weights(sk)

    def layer_blocks(self, sk):
        out = [("skeletal", sk["total"])]
        return out + ([("scores", self.kept_scores(sk))] if self.kept_scores(sk) > 0 else [])
