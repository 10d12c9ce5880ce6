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
