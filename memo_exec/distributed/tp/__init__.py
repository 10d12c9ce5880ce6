"""Tensor-parallel flavours, keyed by `memo_sim.layout.parallel.Layout.tp_mode`.

A flavour is a class registered with ``@register_tp("name")`` (`registry`; see `base.TPFlavour`
for what it receives and must provide) under the name of the simulator's flavour it runs
(`memo_sim.tp`). `flavour_for` imports the modules of ``FLAVOUR_MODULES`` (explicit imports: a
module that does not import is an error, not a missing flavour), so a new flavour is its module
plus its line there. ``megatron`` (Megatron-LM column/row parallelism, with or without its
sequence parallelism) is `megatron.MegatronTP`; ``metp_ffn`` and ``metp`` are
`memo_exec.metp.flavour`. A plan whose ``tp_mode`` has no registered flavour is refused before
anything is allocated.
"""

from __future__ import annotations

import importlib

from memo_exec.distributed.tp.registry import FLAVOURS, register_tp  # noqa: F401  (re-exported)

FLAVOUR_MODULES = ("memo_exec.distributed.tp.megatron", "memo_exec.metp.flavour")


def registered() -> tuple[str, ...]:
    for mod in FLAVOUR_MODULES:
        importlib.import_module(mod)
    return FLAVOURS.names()


def flavour_for(tp_mode: str) -> type:
    """The registered flavour class for ``tp_mode`` (ExecError naming the field otherwise)."""
    registered()
    return FLAVOURS.get(tp_mode)
