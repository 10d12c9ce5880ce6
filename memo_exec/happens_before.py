"""Happens-before race detector for the compute, offload (d2h) and prefetch (h2d) streams.

Stream semantics (CUDA's, which the CPU engine reproduces with threads): the ops of one stream
run in issue order; an op of another stream is ordered after them only through an event that
was recorded on their stream and waited on by its own. Whether two conflicting accesses are
ordered is therefore a property of the *issue sequence*, not of timing, and this module checks
it on the host thread at issue time -- deterministically, however loaded the machine is.

Vector clocks: every stream keeps one counter per stream. An access on stream S advances S's
own counter (its epoch). ``snapshot`` (at ``record``) copies S's clock into the event; ``join``
(at ``wait_event``) takes the component-wise maximum into the waiting stream's clock; a
``barrier`` (a host synchronize of every stream) joins all clocks. Access a (stream S, epoch e)
happens before a later-issued access on stream T when S == T or e <= clock(T)[S].

Accesses name a `Region`: rows of one skeletal tensor of a rounding buffer (``buffer``, index =
buffer number) or of one offloaded layer's host slot (``host``, index = layer). Two accesses
conflict when they touch overlapping rows of the same tensor and at least one writes; a
conflicting pair on different streams that is not ordered raises `RaceError` naming both.
"""

from __future__ import annotations

from dataclasses import dataclass

from memo_exec.errors import ExecError

STREAMS = ("compute", "d2h", "h2d")


class RaceError(ExecError):
    """Two conflicting accesses on different streams are not ordered by any event wait."""


@dataclass(frozen=True)
class Region:
    space: str  # "buffer" (a rounding buffer on the device) | "host" (an offloaded layer's host slot)
    index: int  # buffer number, or layer
    tensor: str  # skeletal tensor name (x, ln1, q, ...)
    rows: tuple[int, int]  # token rows [lo, hi)

    @property
    def key(self) -> tuple[str, int, str]:
        return self.space, self.index, self.tensor

    def overlaps(self, other: "Region") -> bool:
        return self.key == other.key and self.rows[0] < other.rows[1] and other.rows[0] < self.rows[1]

    def covers(self, other: "Region") -> bool:
        return self.key == other.key and self.rows[0] <= other.rows[0] and other.rows[1] <= self.rows[1]

    def __str__(self) -> str:
        where = f"rounding buffer {self.index}" if self.space == "buffer" else f"host slot of layer {self.index}"
        return f"{where} {self.tensor}[{self.rows[0]}:{self.rows[1]}]"


@dataclass(frozen=True)
class Access:
    stream: str
    epoch: int
    write: bool
    region: Region
    what: str  # the op that made it, e.g. "forward(3)", "offload(1)"

    def describe(self) -> str:
        return f"{self.what} {'writes' if self.write else 'reads'} it on {self.stream}"


class HappensBefore:
    """Vector clocks of the streams and the live access history of every region."""

    def __init__(self, streams: tuple[str, ...] = STREAMS) -> None:
        self.streams = streams
        self.clock: dict[str, dict[str, int]] = {s: dict.fromkeys(streams, 0) for s in streams}
        self.history: dict[tuple[str, int, str], list[Access]] = {}
        self.checked = 0  # accesses checked (tests assert the detector saw the run)

    # -- events ------------------------------------------------------------------------------------
    def snapshot(self, stream: str) -> dict[str, int]:
        return dict(self.clock[stream])

    def join(self, stream: str, snapshot: dict[str, int] | None) -> None:
        if snapshot is None:  # the event was never recorded: the wait orders nothing
            return
        mine = self.clock[stream]
        for s, c in snapshot.items():
            if c > mine[s]:
                mine[s] = c

    def barrier(self) -> None:
        """Every stream synchronised with the host: all earlier accesses precede all later ones."""
        top = {s: max(self.clock[t][s] for t in self.streams) for s in self.streams}
        for s in self.streams:
            self.clock[s] = dict(top)
        self.history.clear()

    # -- accesses ----------------------------------------------------------------------------------
    def ordered(self, earlier: Access, stream: str) -> bool:
        return earlier.stream == stream or earlier.epoch <= self.clock[stream][earlier.stream]

    def access(self, stream: str, what: str, reads=(), writes=()) -> None:
        """One op on ``stream`` that reads and writes these regions; raise `RaceError` on a race."""
        self.clock[stream][stream] += 1
        epoch = self.clock[stream][stream]
        for region, write in [(r, False) for r in reads] + [(w, True) for w in writes]:
            self._check(Access(stream, epoch, write, region, what))

    def _check(self, a: Access) -> None:
        self.checked += 1
        hist = self.history.setdefault(a.region.key, [])
        for b in hist:
            if (a.write or b.write) and b.region.overlaps(a.region) and not self.ordered(b, a.stream):
                raise RaceError(f"race on {a.region}: {b.describe()} and {a.describe()}, and no event wait "
                                f"orders the two")
        # forget what ``a`` supersedes: an earlier access it covers and follows, unless a write
        # would be forgotten behind a read (a later read elsewhere may still race with that write)
        hist[:] = [b for b in hist if not (a.region.covers(b.region) and self.ordered(b, a.stream)
                                           and (a.write or not b.write))]
        hist.append(a)
