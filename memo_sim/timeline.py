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

from memo_sim.errors import MemoError
from memo_sim.fileio import atomic_write_json, read_json

STREAMS = ("compute", "comm", "cp_comm", "tp_p2p", "tp_bcast", "dp_comm", "d2h", "h2d")  # the one list of stream names
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
    device: int  # GPU index, or -1 for the node's host memory
    kind: str  # "gpu" | "host"
    nbytes: float


@dataclass
class Timeline:
    events: list[TimelineEvent] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # source (simulated|measured), plan label, device, ...

    @property
    def makespan(self) -> float:
        return max((e.end for e in self.events), default=0.0) - min((e.start for e in self.events), default=0.0)

    def streams(self) -> list[str]:
        return sorted({e.stream for e in self.events})

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
        if not isinstance(obj, dict) or obj.get("format") != TIMELINE_FORMAT:
            raise MemoError(f"{source}: field 'format' must be {TIMELINE_FORMAT!r}")
        if obj.get("version") != TIMELINE_VERSION:
            raise MemoError(f"{source}: timeline version {obj.get('version')!r} unknown; this memo reads {TIMELINE_VERSION}")
        try:
            ev = [TimelineEvent(**e) for e in obj.get("events", [])]
            mem = [MemorySample(**m) for m in obj.get("memory", [])]
        except TypeError as e:
            raise MemoError(f"{source}: malformed event or memory sample ({e})") from None
        return cls(ev, mem, dict(obj.get("meta") or {}))

    @classmethod
    def read_json(cls, path: str | Path) -> "Timeline":
        obj = read_json(path, MemoError, "timeline file")
        return cls.from_json_obj(obj, source=str(path))
