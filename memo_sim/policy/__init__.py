"""Activation policies (store all, full recompute, full offload, MEMO) and MEMO's alpha solver."""

from memo_sim.policy.policies import POLICIES, PolicyChoice

__all__ = ["POLICIES", "PolicyChoice"]
