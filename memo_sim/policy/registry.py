"""Activation policies by name: each policy module registers its class here (`memo_sim.registry`)."""

from __future__ import annotations

from memo_sim.policy.base import Policy
from memo_sim.registry import Registry

POLICIES: Registry[type[Policy]] = Registry("policy")


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    return POLICIES.add(cls.name, cls)


def policy_names() -> tuple[str, ...]:
    """Registered names, in registration order (the order the what-if lists them)."""
    return POLICIES.names()


def policy_class(name: str) -> type[Policy]:
    return POLICIES.get(name)


def get_policy(name: str, alpha: float | None = None) -> Policy:
    """The policy called ``name`` (with ``alpha`` where it takes one)."""
    return policy_class(name)(alpha)


def prices_model(name: str, model) -> bool:
    """Whether policy ``name`` applies to ``model``: one that rebuilds or moves MoE tensors only to a MoE model, and none
    whose ``model_why_not`` names a reason (the what-if and sweep-seq leave the others out of their defaults)."""
    cls = policy_class(name)
    return (model.moe or not cls.needs_experts) and cls.model_why_not(model) is None
