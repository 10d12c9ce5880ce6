"""The data-parallel flavours by name (`memo_sim.registry.Registry`); each flavour module registers
itself here and `memo_sim.dp` imports them."""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.registry import Registry

DP_FLAVOURS: Registry = Registry("dp_mode", error=MemoError, unknown="{what} must be one of {known}, got {name!r}")
