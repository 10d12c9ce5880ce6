"""Data-parallel flavours (``Layout.dp_mode``), one module each, registered by name (`base` says what
a flavour is; `memo_sim.cost.memory` and `memo_sim.cost.grad_sync` ask it):

- ``zero`` (`zero`): ZeRO stages 0-3 over the whole data group (Megatron-LM's distributed optimizer,
  DeepSpeed);
- ``fsdp`` (`fsdp`): PyTorch FSDP2 / torchtitan: sharded over a shard group (HSDP: replicated
  across the rest), with or without resharding after the forward.

A new flavour is its module here (imported below), registering a `DPFlavour`.
"""

from __future__ import annotations

from memo_sim.dp import zero  # noqa: F401  (each module registers its flavour, in this order)
from memo_sim.dp import fsdp  # noqa: F401
from memo_sim.dp.base import DPFlavour  # noqa: F401  (re-exported)
from memo_sim.dp.registry import DP_FLAVOURS

DP_MODES: tuple[str, ...] = DP_FLAVOURS.names()


def dp_flavour(name: str) -> DPFlavour:
    """The flavour called ``name`` (a one-line `MemoError` listing the known ones otherwise)."""
    return DP_FLAVOURS.get(name)
