"""Request traces: one record per tensor, and the generic static-allocation CSV.

A trace is the input of every memory planner here (offline DSA solvers, the caching-allocator
model). Each record is a buffer with a size in bytes and a lifetime ``[lower, upper)`` in
allocation steps (``lower`` inclusive, ``upper`` exclusive), exactly the convention of the public
``id,lower,upper,size`` CSV files (google/minimalloc). Two buffers conflict when their lifetimes
overlap: ``a.lower < b.upper and b.lower < a.upper``.

JSON form (``memo-trace`` version 1)::

    {"format": "memo-trace", "version": 1, "name": "...",
     "buffers": [{"id": "t0", "size": 1024, "lower": 0, "upper": 3,
                  "phase": "fwd", "layer": 0, "kind": "transient", "name": "qkv"}, ...]}
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from memo_sim.errors import TraceError, validated, validation_message
from memo_sim.fileio import atomic_write_json, atomic_write_text, read_json, read_utf8

TRACE_FORMAT = "memo-trace"
TRACE_VERSION = 1
KINDS = ("transient", "skeletal", "pseudo", "other")
MAX_BUFFER_BYTES = 1 << 60  # 1 EiB: a larger request is a typo
MAX_STEP = 1 << 40  # allocation steps of a lifetime
MAX_BUFFERS = 1 << 22  # records of one trace file


class _BufferIn(BaseModel):
    """One record of a trace file (JSON or CSV), validated once at the boundary."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    id: Annotated[str, Field(min_length=1, max_length=1000)] | Annotated[int, Field(ge=0)]
    size: Annotated[int, Field(ge=1, le=MAX_BUFFER_BYTES)]
    lower: Annotated[int, Field(ge=0, le=MAX_STEP)]
    upper: Annotated[int, Field(ge=1, le=MAX_STEP)]
    phase: str | None = None
    layer: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    kind: Literal[KINDS] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _lifetime(self):
        if self.lower >= self.upper:
            raise ValueError(f"lifetime must satisfy lower < upper (upper exclusive), got lower={self.lower} "
                             f"upper={self.upper}; fix the two steps")
        return self

    def typed(self) -> "Buffer":
        return Buffer(id=str(self.id), size=self.size, lower=self.lower, upper=self.upper, phase=self.phase,
                      layer=self.layer, kind=self.kind, name=self.name)


class _TraceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    format: Literal[TRACE_FORMAT]
    version: Annotated[int, Field(ge=TRACE_VERSION, le=TRACE_VERSION)]  # strict: true is not 1
    name: str = ""
    meta: dict | None = None
    buffers: list[_BufferIn] = Field(max_length=MAX_BUFFERS)


_CSV_ROWS = TypeAdapter(list[_BufferIn])


@dataclass(frozen=True)
class Buffer:
    """One tensor request: ``size`` bytes live during steps ``[lower, upper)``."""

    id: str
    size: int
    lower: int
    upper: int
    phase: str | None = None
    layer: int | None = None
    kind: str | None = None
    name: str | None = None

    def overlaps(self, other: "Buffer") -> bool:
        return self.lower < other.upper and other.lower < self.upper

    def shifted(self, steps: int) -> "Buffer":
        """The same request ``steps`` later (`dataclasses.replace` costs five times as much, and
        the what-if shifts a few hundred thousand)."""
        return Buffer(self.id, self.size, self.lower + steps, self.upper + steps, self.phase, self.layer, self.kind,
                      self.name)


@dataclass
class RequestTrace:
    buffers: list[Buffer]
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, b in enumerate(self.buffers):
            where = f"buffer {i} (id {b.id!r})"
            if b.id in seen:
                raise TraceError(f"{where}: duplicate id; give every buffer a unique id")
            seen.add(b.id)
            if not isinstance(b.size, int) or b.size <= 0:
                raise TraceError(f"{where}: size must be a positive integer of bytes, got {b.size!r}")
            if not isinstance(b.lower, int) or not isinstance(b.upper, int) or b.lower >= b.upper:
                raise TraceError(
                    f"{where}: lifetime must satisfy lower < upper (upper exclusive), "
                    f"got lower={b.lower!r} upper={b.upper!r}"
                )
            if b.kind is not None and b.kind not in KINDS:
                raise TraceError(f"{where}: kind must be one of {', '.join(KINDS)}, got {b.kind!r}")

    def __len__(self) -> int:
        return len(self.buffers)

    def max_live_bytes(self) -> int:
        """The max-live lower bound: the largest sum of sizes live at one step."""
        events: list[tuple[int, int]] = []
        for b in self.buffers:
            events.append((b.lower, b.size))
            events.append((b.upper, -b.size))
        events.sort(key=lambda e: (e[0], e[1]))  # frees before allocs at the same step
        live = peak = 0
        for _, d in events:
            live += d
            peak = max(peak, live)
        return peak

    # ---- JSON -------------------------------------------------------------------------
    def to_json_obj(self) -> dict:
        bufs = []
        for b in self.buffers:
            d = {k: v for k, v in asdict(b).items() if v is not None}
            bufs.append(d)
        return {"format": TRACE_FORMAT, "version": TRACE_VERSION, "name": self.name,
                "meta": self.meta, "buffers": bufs}

    def write_json(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_json_obj(), indent=1)

    @classmethod
    def from_json_obj(cls, obj: dict, source: str = "trace") -> "RequestTrace":
        if isinstance(obj, dict) and obj.get("format") != TRACE_FORMAT:
            raise TraceError(f"{source}: field 'format' must be {TRACE_FORMAT!r}")
        if isinstance(obj, dict) and (obj.get("version") != TRACE_VERSION or isinstance(obj.get("version"), bool)):
            raise TraceError(
                f"{source}: field 'version' is {obj.get('version')!r}; this memo reads version {TRACE_VERSION}"
            )
        t = validated(_TraceIn, obj, source, TraceError)
        return cls([b.typed() for b in t.buffers], name=t.name, meta=dict(t.meta or {}))

    @classmethod
    def read_json(cls, path: str | Path) -> "RequestTrace":
        obj = read_json(path, TraceError)
        return cls.from_json_obj(obj, source=str(path))

    # ---- CSV (id,lower,upper,size) ----------------------------------------------------
    def to_csv_text(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["id", "lower", "upper", "size"])
        for b in self.buffers:
            w.writerow([b.id, b.lower, b.upper, b.size])
        return out.getvalue()

    def write_csv(self, path: str | Path) -> Path:
        return atomic_write_text(path, self.to_csv_text())

    @classmethod
    def read_csv(cls, path: str | Path) -> "RequestTrace":
        path = Path(path)
        try:
            text = read_utf8(path, TraceError)
        except FileNotFoundError:
            raise TraceError(f"{path}: no such file") from None
        rows = list(csv.reader(io.StringIO(text)))
        if not rows:
            raise TraceError(f"{path}: empty file; expected a header id,lower,upper,size")
        header = [h.strip() for h in rows[0]]
        need = ["id", "lower", "upper", "size"]
        missing = [h for h in need if h not in header]
        if missing:
            raise TraceError(f"{path}: header lacks column {missing[0]!r}; expected id,lower,upper,size")
        col = {h: header.index(h) for h in need}
        if len(rows) - 1 > MAX_BUFFERS:
            raise TraceError(f"{path}: {len(rows) - 1} rows, more than {MAX_BUFFERS}; split the problem")
        recs, lines = [], []
        for ln, row in enumerate(rows[1:], start=2):
            if not row or all(not c.strip() for c in row):
                continue
            try:
                vals = {h: row[col[h]].strip() for h in need}
                recs.append({"id": vals["id"], **{h: int(vals[h]) for h in ("lower", "upper", "size")}})
            except (IndexError, ValueError):
                raise TraceError(f"{path}: line {ln}: expected integers in lower, upper, size") from None
            lines.append(ln)
        try:
            bufs = [b.typed() for b in _CSV_ROWS.validate_python(recs)]
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            i = first["loc"][0] if first.get("loc") and isinstance(first["loc"][0], int) else 0
            raise TraceError(validation_message(e, f"{path}: line {lines[i]}", drop=1)) from None
        return cls(bufs, name=path.stem)

    @classmethod
    def read(cls, path: str | Path) -> "RequestTrace":
        """Read a trace by extension: ``.csv`` as id,lower,upper,size, anything else as JSON."""
        return cls.read_csv(path) if str(path).lower().endswith(".csv") else cls.read_json(path)
