"""Executor activation policies by the simulator's policy name.

Each executor policy lives in its own module and registers itself with ``@register(name)``
under the name of the `memo_sim.policy` policy it executes; `make_policy` is a dict lookup, so
a new policy is one new module here beside its one new module in `memo_sim.policy`. The
executor policy reads what to keep, offload and recompute from the simulator's policy object
(``offload_fraction_other``, ``recompute_fraction``, ...), never from its name.
"""

from __future__ import annotations

import torch

from memo_exec.errors import ExecError
from memo_sim.model.config import ModelConfig

_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: execute the simulator's policy ``name`` with this class."""
    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"executor policy {name!r} registered twice")
        _REGISTRY[name] = cls
        return cls
    return deco


def registered() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def sim_policy_name(choice) -> str:
    """The registered name of a `memo_sim.policy` policy object."""
    return getattr(choice, "name", None) or choice.policy


def make_policy(choice, model: ModelConfig, batch: int, seq: int, layers: int, dtype: torch.dtype,
                device: torch.device, engine, timer, compute, shapes=None):
    """The executor policy for the simulator's policy ``choice`` (sizes only while ``engine`` is None);
    ``shapes``: this rank's `memo_exec.layer.storage_shapes` (default: one device, the whole layer)."""
    name = sim_policy_name(choice)
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ExecError(f"policy {name!r}: this executor runs {', '.join(_REGISTRY)}") from None
    return cls(choice, model, batch, seq, layers, dtype, device, engine, timer, compute, shapes)
