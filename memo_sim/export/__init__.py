"""Plans exported to the frameworks teams train with: one module per framework, registered by name.

Each module provides ``export(plan, price=True) -> Export`` (`memo_sim.export.base`): the files
the framework reads, the parts of the plan it cannot express with the nearest setting written
instead, and memo's predicted cost of that nearest plan.
"""

from __future__ import annotations

from types import ModuleType

from memo_sim.errors import MemoError
from memo_sim.export import deepspeed, megatron, torchtitan
from memo_sim.export.base import Export, Gap
from memo_sim.plan.schema import Plan

EXPORTERS: dict[str, ModuleType] = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed}


def export_plan(plan: Plan, to: str, price: bool = True) -> Export:
    try:
        module = EXPORTERS[to]
    except KeyError:
        raise MemoError(f"--to {to!r}: no exporter; choose one of {', '.join(EXPORTERS)}") from None
    return module.export(plan, price=price)


__all__ = ["EXPORTERS", "Export", "Gap", "export_plan"]
