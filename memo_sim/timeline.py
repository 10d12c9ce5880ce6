"""Timeline: what ran where and when, and memory over time. Written by the simulator
(predicted) and by the executor (measured) in the same format, so the two can be compared
op by op and stream by stream.

Streams are named for what they model: ``compute``, ``comm`` (TP/Ulysses collectives),
``cp_comm`` (ring-CP K/V exchange), ``tp_p2p`` (METP's ring send/recv of weight and K/V
blocks), ``tp_bcast`` (METP attention's broadcasts and reduces of weight blocks), ``d2h``
(offload copy engine), ``h2d`` (prefetch copy engine), ``dp_comm`` (gradient collectives).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memo_sim.errors import MemoError, validated
from memo_sim.fileio import atomic_write_json, read_json

STREAMS = ("compute", "comm", "cp_comm", "ep_comm", "tp_p2p", "tp_bcast", "dp_comm", "d2h", "h2d")  # the one list of stream names
TP_RING_STREAMS = ("tp_p2p", "tp_bcast")  # METP's side streams (exposed P2P time is waiting on them)
COPY_STREAMS = ("d2h", "h2d")
TIMELINE_FORMAT = "memo-timeline"
TIMELINE_VERSION = 1


@dataclass(frozen=True)
class TimelineEvent:
    op: str
    layer: int | None  # None for embedding / classifier / optimizer
    phase: str  # fwd | bwd | recompute | offload | prefetch | optimizer | ...
    stream: str
    device: int
    start: float  # seconds from the iteration start
    end: float
    nbytes: float = 0.0
    flops: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class MemorySample:
    time: float
    device: int  # GPU index, or -1 - n for node n's host memory (-1: node 0's); a rank's own host memory
    # drawn apart (`memo_exec.figures.rank_host_samples`): the rank
    kind: str  # "gpu" | "host"
    nbytes: float


_Seconds = Annotated[float, Field(allow_inf_nan=False, ge=-1e9, le=1e9)]
_Amount = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e30)]
_Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")]


class _EventIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    op: Annotated[str, Field(max_length=1000)]
    layer: Annotated[int, Field(ge=0, le=1 << 20)] | None
    phase: Annotated[str, Field(max_length=200)]
    stream: _Name
    device: Annotated[int, Field(ge=0, le=1 << 20)]
    start: _Seconds
    end: _Seconds
    nbytes: _Amount = 0.0
    flops: _Amount = 0.0

    @model_validator(mode="after")
    def _ordered(self):
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start}); swap or fix them")
        return self


class _SampleIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    time: _Seconds
    device: Annotated[int, Field(ge=-1 - (1 << 20), le=1 << 20)]  # a GPU, or -1 - n for node n's host
    kind: Literal["gpu", "host"]
    nbytes: _Amount


class _TimelineIn(BaseModel):
    """A timeline file, validated once (pydantic) before anything is drawn or written."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    format: Literal[TIMELINE_FORMAT]
    version: Annotated[int, Field(ge=TIMELINE_VERSION, le=TIMELINE_VERSION)]  # strict: true is not 1
    meta: dict | None = None
    events: list[_EventIn] = []
    memory: list[_SampleIn] = []


@dataclass
class Timeline:
    events: list[TimelineEvent] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # source (simulated|measured), plan label, device, ...

    @property
    def device_word(self) -> str:
        """What the devices are called in figures and traces: "CPU" for a measured CPU run, else "GPU"."""
        return "CPU" if (self.meta or {}).get("device_kind") == "cpu" else "GPU"

    @property
    def makespan(self) -> float:
        return max((e.end for e in self.events), default=0.0) - min((e.start for e in self.events), default=0.0)

    def streams(self) -> list[str]:
        return sorted({e.stream for e in self.events})

    def of_device(self, device: int) -> "Timeline":
        """The events and memory of one device (a pipeline stage's first GPU: the simulator times one GPU per
        stage, a measured run records each rank's), host samples kept: what one rank's measurements compare with."""
        return Timeline([e for e in self.events if e.device == device],
                        [m for m in self.memory if m.device in (device, -1)], {**self.meta, "device_index": device})

    def busy_time(self, stream: str, device: int | None = None) -> float:
        return sum(e.duration for e in self.events if e.stream == stream and (device is None or e.device == device))

    def peak_memory(self, kind: str = "gpu") -> float:
        return max((m.nbytes for m in self.memory if m.kind == kind), default=0.0)

    def to_json_obj(self) -> dict:
        return {"format": TIMELINE_FORMAT, "version": TIMELINE_VERSION, "meta": self.meta,
                "events": [asdict(e) for e in self.events], "memory": [asdict(m) for m in self.memory]}

    def write_json(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_json_obj(), indent=None)

    @classmethod
    def from_json_obj(cls, obj: dict, source: str = "timeline") -> "Timeline":
        if isinstance(obj, dict) and obj.get("format") != TIMELINE_FORMAT:
            what = (" (this is a plan: `memo-sim simulate PLAN --out DIR` writes DIR/timeline.json to plot)"
                    if str(obj.get("schema", "")).startswith("memo-plan/") else
                    "; give the timeline.json `memo-sim simulate` writes")
            raise MemoError(f"{source}: field 'format' must be {TIMELINE_FORMAT!r}{what}")
        if isinstance(obj, dict) and (obj.get("version") != TIMELINE_VERSION or isinstance(obj.get("version"), bool)):
            raise MemoError(f"{source}: timeline version {obj.get('version')!r} unknown; this memo reads {TIMELINE_VERSION}")
        t = validated(_TimelineIn, obj, source)
        ev = [TimelineEvent(**e.model_dump()) for e in t.events]
        mem = [MemorySample(**m.model_dump()) for m in t.memory]
        return cls(ev, mem, dict(t.meta or {}))

    @classmethod
    def read_json(cls, path: str | Path) -> "Timeline":
        obj = read_json(path, MemoError, "timeline file")
        return cls.from_json_obj(obj, source=str(path))
