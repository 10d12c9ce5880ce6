"""TEMPORARY compatibility names while the executor moves to `memo_sim.policy` (removed before commit)."""

from memo_sim.policy.registry import get_policy as PolicyChoice  # noqa: N812
from memo_sim.policy.registry import policy_names
from memo_sim.policy.rounding_buffers import KEPT_LAYERS as NO_OFFLOAD_LAST_LAYERS

POLICIES = policy_names()

__all__ = ["NO_OFFLOAD_LAST_LAYERS", "POLICIES", "PolicyChoice"]
