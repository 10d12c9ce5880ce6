"""The executor's tensor-parallel flavours by name (`memo_sim.registry.Registry`): a flavour module
registers its class with ``@register_tp(name)`` under the name of the simulator's flavour it
runs (`memo_sim.tp`); `memo_exec.distributed.tp.flavour_for` imports the flavour modules."""

from __future__ import annotations

from memo_exec.errors import ExecError
from memo_sim.registry import Registry

FLAVOURS: Registry[type] = Registry("layout.tp_mode", error=ExecError, sort=True,
                                    unknown="{what} {name!r}: the executor runs {known}; plan with tp_mode megatron")


def register_tp(name: str):
    """Class decorator: run plans whose ``layout.tp_mode`` is ``name`` with this flavour."""
    return FLAVOURS.register(name)
