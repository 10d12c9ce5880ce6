"""Typed parts of plan.json that the executor reads: the prediction and the memory plan.

Both are parsed (and checked) once, here; the executor reads attributes, never raw JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memo_sim.errors import PlanError, validated

STATUSES = ("OK", "OOM", "OOHM")
PREDICTION_NUMBERS = ("iteration_s", "mfu", "tgs_tokens_per_gpu_s", "peak_gpu_bytes", "peak_host_bytes_per_node",
                      "exposed_copy_s", "analytic_iteration_s")


MAX_BYTES = 1 << 60  # 1 EiB: a larger size or offset is a typo
MAX_SECONDS = 1e9  # about 30 years of one iteration

_Bytes = Annotated[int, Field(strict=True, ge=0, le=MAX_BYTES)]
_Seconds = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=MAX_SECONDS)]
_ByteAmount = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=MAX_BYTES)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _PredictionIn(_In):
    status: Literal[STATUSES]
    source: str = Field("analytic", strict=True, max_length=200)
    iteration_s: _Seconds | None = None
    # MISSION's model FLOPs count 6·s·P over every parameter, the input embedding's lookup too: a model whose
    # vocabulary dominates its parameters (a toy of a large-vocabulary model) reads above 1; above 10 is no plan
    mfu: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=10)] | None = None
    tgs_tokens_per_gpu_s: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1e12)] | None = None
    peak_gpu_bytes: _ByteAmount | None = None
    peak_host_bytes_per_node: _ByteAmount | None = None
    exposed_copy_s: _Seconds | None = None
    analytic_iteration_s: _Seconds | None = None
    memory_breakdown_bytes: dict = {}
    allocator: dict = {}


class _PhaseIn(_In):
    peak_bytes: _Bytes
    offsets: dict[str, _Bytes]
    lower_bound_bytes: _Bytes | None = None
    method: str = Field("", strict=True)
    solve_time_s: _Seconds | None = None
    unplaced: dict[str, Annotated[str, Field(strict=True)]] = {}


class _StageIn(_In):
    stage: Annotated[int, Field(strict=True, ge=0, le=1 << 20)]
    arena_bytes: _Bytes
    lower_bound_bytes: _Bytes | None = None
    method: str = Field("", strict=True)
    solve_time_s: _Seconds | None = None
    offsets: dict[str, _Bytes] = {}


class _MemoryPlanIn(_In):
    arena_bytes: _Bytes
    phases: dict[str, _PhaseIn] = {}
    stages: list[_StageIn] = []
    element_bytes: Literal[2, 4, 8] | None = None
    lower_bound_bytes: _Bytes | None = None
    layer_block_offsets: dict[str, _Bytes] = {}
    model_offsets: dict[str, _Bytes] = {}
    source: str = Field("", strict=True)

    @field_validator("element_bytes", mode="before")
    @classmethod
    def _no_bool(cls, v):
        if isinstance(v, bool):
            raise ValueError(f"must be 2, 4 or 8, got {v!r}; write the element width in bytes")
        return v


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
        m = validated(_PredictionIn, d, where, PlanError)
        return cls(**{k: getattr(m, k) for k in cls.__dataclass_fields__})

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
class StagePlan:
    """Level 2 of MEMO's plan for one pipeline rank (`memo_sim.memplan.stage_plan`): a byte offset for
    every block of the micro-batches it holds in flight, in an arena of ``arena_bytes``."""

    stage: int
    arena_bytes: int
    offsets: dict[str, int]
    lower_bound_bytes: int | None = None
    method: str = ""
    solve_time_s: float | None = None

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
    stages: tuple[StagePlan, ...] = ()  # a micro-batch pipeline: level 2 per rank (``arena_bytes``: the largest)

    @property
    def transient_arena_bytes(self) -> int:
        return max((p.peak_bytes for p in self.phases.values()), default=0)

    @classmethod
    def from_dict(cls, d: Any, where: str = "memory_plan") -> "MemoryPlan":
        m = validated(_MemoryPlanIn, d, where, PlanError)
        phases = {ph: PhasePlan(**{k: getattr(p, k) for k in PhasePlan.__dataclass_fields__})
                  for ph, p in m.phases.items()}
        return cls(arena_bytes=m.arena_bytes, phases=phases, element_bytes=m.element_bytes,
                   lower_bound_bytes=m.lower_bound_bytes, layer_block_offsets=dict(m.layer_block_offsets),
                   model_offsets=dict(m.model_offsets), source=m.source,
                   stages=tuple(StagePlan(**{k: getattr(st, k) for k in StagePlan.__dataclass_fields__})
                                for st in m.stages))

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("phases", "stages")}
        d["phases"] = {ph: p.to_dict() for ph, p in self.phases.items()}
        if self.stages:  # plans of one stage keep their earlier form
            d["stages"] = [st.to_dict() for st in self.stages]
        return d
