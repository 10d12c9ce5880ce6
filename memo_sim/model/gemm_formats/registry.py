"""The GEMM formats by name (`memo_sim.registry.Registry`); each format module registers itself
here and `memo_sim.model.gemm_formats` imports them."""

from __future__ import annotations

from memo_sim.errors import MemoError
from memo_sim.registry import Registry

FORMATS: Registry = Registry("GEMM format", error=MemoError, unknown="{what} must be one of {known}, got {name!r}")
