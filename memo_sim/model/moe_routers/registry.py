"""The MoE routers by name (`memo_sim.registry.Registry`); each router module registers itself here
and `memo_sim.model.moe_routers` imports them."""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.registry import Registry

ROUTERS: Registry = Registry("MoE router", error=MemoError, unknown="{what} must be one of {known}, got {name!r}")
