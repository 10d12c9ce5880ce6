"""Activation policies by name: each policy module registers its class here."""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.policy.base import Policy

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"policy {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> tuple[str, ...]:
    """Registered names, in registration order (the order the what-if lists them)."""
    return tuple(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise MemoError(f"policy {name!r} unknown; choose one of {', '.join(_REGISTRY)}") from None


def get_policy(name: str, alpha: float | None = None) -> Policy:
    """The policy called ``name`` (with ``alpha`` where it takes one)."""
    return policy_class(name)(alpha)
