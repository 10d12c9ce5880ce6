"""The simulator's tensor-parallel flavours by name (`memo_sim.registry.Registry`); the flavour
modules register themselves here and `memo_sim.tp` imports them."""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.registry import Registry

FLAVOURS: Registry = Registry("tp_mode", error=MemoError, unknown="{what} must be one of {known}, got {name!r}")
