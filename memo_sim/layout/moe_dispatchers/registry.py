"""The MoE token dispatchers by name (`memo_sim.registry.Registry`); each dispatcher module registers
itself here and `memo_sim.layout.moe_dispatchers` imports them."""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.registry import Registry

DISPATCHERS: Registry = Registry("MoE token dispatcher", error=MemoError,
                                 unknown="{what} must be one of {known}, got {name!r}")
