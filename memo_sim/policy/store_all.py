"""Store all: every skeletal tensor of every layer stays on the GPU until its backward (with
materialised attention also its score-sized tensors, ``sk["scores"]``)."""

from __future__ import annotations

from memo_sim.policy.base import Policy
from memo_sim.policy.registry import register


def megatron_layer_why_not(layout, what: str) -> str | None:
    """Why a policy that acts on parts of Megatron-LM's tensor-parallel layer (``what``, e.g. "Megatron-LM's
    --recompute-modules re-run parts") cannot run on ``layout`` (METP's layer has none of them, and memo-exec runs
    them in the Megatron layer only), or None."""
    if layout.tp > 1 and layout.tp_mode != "megatron":
        return f"{what} of its own tensor-parallel layer, which tp_mode {layout.tp_mode} does not have: " \
               f"plan with tp_mode megatron"
    return None


@register
class StoreAll(Policy):
    name = "store_all"
    summary = "keep every layer's skeletal activations on the GPU"
    ep_overlap_ok = True  # and the modules it re-runs (Megatron-Core's rule: not the MoE block; `RecomputeMoe`)

    def kept_scores(self, sk) -> float:
        """Score-sized bytes a layer keeps for its backward (materialised attention only)."""
        return sk.get("scores", 0.0)

    def not_kept(self, sk) -> float:
        """Skeletal bytes a layer does not keep on the GPU from its forward to its backward: none here; what a
        subclass rebuilds (Megatron's --recompute-modules, `memo_sim.policy.recompute_modules`) or sends to the host
        (its --offload-modules, `memo_sim.policy.offload_modules`)."""
        return 0.0

    def resident_bytes(self, sk, n_layers):
        return n_layers * (sk["total"] - self.not_kept(sk) + self.kept_scores(sk))

    def forward_kept(self, sk):
        out = [("skeletal", sk["total"] - self.not_kept(sk) + sk["lse"])]
        return out + ([("scores", self.kept_scores(sk))] if self.kept_scores(sk) > 0 else []) + self.kept_extras(sk)

    def layer_blocks(self, sk):
        out = [("skeletal", sk["total"] - self.not_kept(sk))]
        return out + ([("scores", self.kept_scores(sk))] if self.kept_scores(sk) > 0 else [])
