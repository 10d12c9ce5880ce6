"""Typed parts of plan.json that the executor reads: the prediction and the memory plan.

Both are parsed (and checked) once, here; the executor reads attributes, never raw JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memo_sim.errors import PlanError

STATUSES = ("OK", "OOM", "OOHM")
PREDICTION_NUMBERS = ("iteration_s", "mfu", "tgs_tokens_per_gpu_s", "peak_gpu_bytes", "peak_host_bytes_per_node",
                      "exposed_copy_s", "analytic_iteration_s")


def _number(value: Any, where: str, *, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PlanError(f"{where}: must be a finite non-negative number, got {value!r}")
    return float(value)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"{where}: must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicted for the plan (simulated, or analytic when not simulated)."""

    status: str
    source: str = "analytic"
    iteration_s: float | None = None
    mfu: float | None = None
    tgs_tokens_per_gpu_s: float | None = None
    peak_gpu_bytes: float | None = None
    peak_host_bytes_per_node: float | None = None
    exposed_copy_s: float | None = None
    analytic_iteration_s: float | None = None
    memory_breakdown_bytes: dict = field(default_factory=dict)
    allocator: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, where: str = "predicted") -> "Prediction":
        if not isinstance(d, dict):
            raise PlanError(f"{where}: must be an object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise PlanError(f"{where}.{sorted(unknown)[0]}: unknown field")
        if d.get("status") not in STATUSES:
            raise PlanError(f"{where}.status: must be one of {', '.join(STATUSES)}, got {d.get('status')!r}")
        nums = {k: _number(d.get(k), f"{where}.{k}") for k in PREDICTION_NUMBERS}
        for k in ("memory_breakdown_bytes", "allocator"):
            if not isinstance(d.get(k, {}), dict):
                raise PlanError(f"{where}.{k}: must be an object")
        return cls(status=d["status"], source=str(d.get("source", "analytic")), **nums,
                   memory_breakdown_bytes=dict(d.get("memory_breakdown_bytes", {})),
                   allocator=dict(d.get("allocator", {})))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class PhasePlan:
    """Level 1 of MEMO's plan for one phase of a layer (``fwd`` or ``bwd``): a byte offset in the
    layer's arena for every transient tensor, by the executor's tensor names."""

    peak_bytes: int
    offsets: dict[str, int]
    lower_bound_bytes: int | None = None
    method: str = ""
    solve_time_s: float | None = None
    unplaced: dict[str, str] = field(default_factory=dict)  # tensor -> why no offset is needed

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class MemoryPlan:
    """MEMO's bi-level static memory plan as plan.json carries it.

    ``phases``: level 1 (one layer's forward and backward, shared by every layer); the executor's
    transient arena is the largest phase peak (`transient_arena_bytes`). ``arena_bytes`` is the
    level-2 whole-model peak (pseudo blocks of the layers plus the blocks that cross layers);
    ``layer_block_offsets`` / ``model_offsets`` place those. ``element_bytes``: the element width
    the sizes were recorded at, when it differs from the model dtype's."""

    arena_bytes: int
    phases: dict[str, PhasePlan]
    element_bytes: int | None = None
    lower_bound_bytes: int | None = None
    layer_block_offsets: dict[str, int] = field(default_factory=dict)
    model_offsets: dict[str, int] = field(default_factory=dict)
    source: str = ""

    @property
    def transient_arena_bytes(self) -> int:
        return max((p.peak_bytes for p in self.phases.values()), default=0)

    @classmethod
    def from_dict(cls, d: Any, where: str = "memory_plan") -> "MemoryPlan":
        if not isinstance(d, dict):
            raise PlanError(f"{where}: must be an object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise PlanError(f"{where}.{sorted(unknown)[0]}: unknown field")
        phases_raw = d.get("phases", {})
        if not isinstance(phases_raw, dict):
            raise PlanError(f"{where}.phases: must be an object")
        phases = {}
        for ph, body in phases_raw.items():
            w = f"{where}.phases.{ph}"
            if not isinstance(body, dict):
                raise PlanError(f"{w}: must be an object")
            bad = set(body) - set(PhasePlan.__dataclass_fields__)
            if bad:
                raise PlanError(f"{w}.{sorted(bad)[0]}: unknown field")
            offs = body.get("offsets")
            if not isinstance(offs, dict):
                raise PlanError(f"{w}.offsets: must map tensor names to non-negative integers")
            unplaced = body.get("unplaced", {})
            if not isinstance(unplaced, dict) or not all(isinstance(v, str) for v in unplaced.values()):
                raise PlanError(f"{w}.unplaced: must map tensor names to reasons")
            phases[str(ph)] = PhasePlan(
                peak_bytes=_count(body.get("peak_bytes"), f"{w}.peak_bytes"),
                offsets={str(k): _count(v, f"{w}.offsets.{k}") for k, v in offs.items()},
                lower_bound_bytes=None if body.get("lower_bound_bytes") is None
                else _count(body["lower_bound_bytes"], f"{w}.lower_bound_bytes"),
                method=str(body.get("method", "")), solve_time_s=_number(body.get("solve_time_s"), f"{w}.solve_time_s"),
                unplaced={str(k): v for k, v in unplaced.items()})
        eb = d.get("element_bytes")
        if eb is not None and (isinstance(eb, bool) or eb not in (2, 4, 8)):
            raise PlanError(f"{where}.element_bytes: must be 2, 4 or 8, got {eb!r}")
        for k in ("layer_block_offsets", "model_offsets"):
            v = d.get(k, {})
            if not isinstance(v, dict):
                raise PlanError(f"{where}.{k}: must be an object")
        return cls(arena_bytes=_count(d.get("arena_bytes"), f"{where}.arena_bytes"), phases=phases,
                   element_bytes=eb,
                   lower_bound_bytes=None if d.get("lower_bound_bytes") is None
                   else _count(d["lower_bound_bytes"], f"{where}.lower_bound_bytes"),
                   layer_block_offsets={str(k): _count(v, f"{where}.layer_block_offsets.{k}")
                                        for k, v in d.get("layer_block_offsets", {}).items()},
                   model_offsets={str(k): _count(v, f"{where}.model_offsets.{k}")
                                  for k, v in d.get("model_offsets", {}).items()},
                   source=str(d.get("source", "")))

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "phases"}
        d["phases"] = {ph: p.to_dict() for ph, p in self.phases.items()}
        return d
