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
from memo_exec.moe.capacity import capacity_factor
from memo_sim.model.config import ModelConfig
from memo_sim.registry import Registry

POLICIES: Registry[type] = Registry("policy", error=ExecError, unknown="{what} {name!r}: this executor runs {known}")


def register(name: str):
    """Class decorator: execute the simulator's policy ``name`` with this class."""
    return lambda cls: POLICIES.add(name, cls)


def registered() -> tuple[str, ...]:
    return POLICIES.names()


def sim_policy_name(choice) -> str:
    """The registered name of a `memo_sim.policy` policy object."""
    return getattr(choice, "name", None) or choice.policy


def make_policy(choice, model: ModelConfig, batch: int, seq: int, layers: int, dtype: torch.dtype,
                device: torch.device, engine, timer, compute, shapes=None, balance=None, etp: int = 1):
    """The executor policy for the simulator's policy ``choice`` (sizes only while ``engine`` is None);
    ``shapes``: this rank's `memo_exec.layer.storage_shapes` (default: one device, the whole layer); ``balance``:
    the layout's MoE balance (`memo_sim.layout.moe_balance.Balance`: a capacity factor changes what a MoE block
    keeps; default none); ``etp``: the layout's expert tensor-parallel size (what a kept MoE graph holds)."""
    cls = POLICIES.get(sim_policy_name(choice))
    policy = cls(choice, model, batch, seq, layers, dtype, device, engine, timer, compute, shapes)
    policy.moe_capacity = capacity_factor(balance)
    policy.moe_etp = etp
    return policy


def _class_note(policy_name: str, attr: str) -> str | None:
    """``"<policy>: memo-exec <sentence>"`` from the policy class's ``attr`` sentence, None where it has none."""
    differs = getattr(POLICIES.get(policy_name), attr) if policy_name in POLICIES.names() else None
    return f"{policy_name}: memo-exec {differs}" if differs else None


def allocator_note(policy_name: str) -> str | None:
    """How the executor's ``policy_name`` holds memory otherwise than the simulator's caching-allocator replay frees
    it (the policy class's ``allocator_differs``), else None."""
    return _class_note(policy_name, "allocator_differs")


def moe_block_note(model: ModelConfig, policy_name: str) -> str | None:
    """For a MoE model: how the executor's ``policy_name`` runs the MoE block otherwise than the
    simulator prices it (the policy class's ``moe_block_differs``), else None."""
    return _class_note(policy_name, "moe_block_differs") if model.moe else None
