"""Happens-before race detector for the compute, offload (d2h) and prefetch (h2d) streams, and the
in-flight checker of point-to-point transfers.

Stream semantics (CUDA's, which the CPU engine reproduces with threads): the ops of one stream
run in issue order; an op of another stream is ordered after them only through an event that
was recorded on their stream and waited on by its own. Whether two conflicting accesses are
ordered is therefore a property of the *issue sequence*, not of timing, and this module checks
it on the host thread at issue time -- deterministically, however loaded the machine is.

Vector clocks: every stream keeps one counter per stream. An access on stream S advances S's
own counter (its epoch). ``snapshot`` (at ``record``) copies S's clock into the event; ``join``
(at ``wait_event``) takes the component-wise maximum into the waiting stream's clock; a
``barrier`` (a host synchronize of every stream) joins all clocks. Access a (stream S, epoch e)
happens before a later-issued access on stream T when S == T or e <= clock(T)[S]. A stream that
waits for an event it recorded itself (``wait_stream`` issued inside the side stream's own
context) orders nothing, and is refused as such.

Regions are *physical*: `Region.of` names the bytes a tensor view covers in its storage (the
storage's address and the byte spans of the view), so two views of one buffer conflict exactly
when they share bytes -- a host slot two layers alias, or a prefetch into another layer's rounding
buffer, is a conflict although the layer indices differ. A region may also name its *content*
(what it holds, e.g. ``layer 3 x``): a write sets the content of its bytes, a read checks that
every byte it covers that a declared write touched holds that content, so a copy from the wrong
host slot, ordered as it may be, is a `SlotMismatch` at issue time. Conflicting unordered accesses
raise `RaceError` naming both.

Memory ends its life with ``release`` (the compute stream drops the tensor): an unordered access of
another stream is then allowed only if that stream holds the memory (``hold``: ``record_stream``
on CUDA, the queued reference on CPU); otherwise the side stream would read freed memory. The
released bytes' history and content are forgotten, so a later tensor at the same address starts
clean.

`TransferGuard`: point-to-point transfers between ranks (`memo_exec.distributed.p2p`). A posted
transfer reads its send buffers and writes its receive buffers until its ``wait``; an access of
the compute side to either before then (reading a receive buffer, overwriting a send buffer), or a
second transfer on the same bytes, raises `RaceError` naming the transfer -- at once, on the rank
that skipped the wait, instead of a hang or a stale block. An in-place collective (a broadcast, a
reduce) is posted with its buffer as a receive on every rank, the root's too: the buffer is the
collective's until its wait, so a skipped wait is refused on every rank alike (no rank goes on
alone into the next transfer, which would hang).

The P2P guard is on unless ``MEMO_EXEC_RACE_CHECK=0`` is set (`transfer_guard` returns None then,
and every declaration is skipped: the rings and pipelines pay one ``is None`` test per transfer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from memo_exec.errors import ExecError

STREAMS = ("compute", "d2h", "h2d")
MAX_SPANS = 4096  # a view with more separate byte runs is covered by its hull (conservative)


class RaceError(ExecError):
    """Two conflicting accesses on different streams are not ordered by any event wait."""


class SlotMismatch(RaceError):
    """An access reads memory that holds something else than it expects (a wrong slot, an alias)."""


def _spans(t) -> tuple[tuple[int, int], ...]:
    """Sorted byte spans ``[lo, hi)`` of a tensor view within its storage."""
    if t.numel() == 0:
        return ()
    es = t.element_size()
    dims = sorted(((st, n) for n, st in zip(t.shape, t.stride()) if n != 1), reverse=True)
    run = 1  # elements in one contiguous run
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    offsets = [t.storage_offset()]
    count = 1
    for _, n in dims:
        count *= n
    if count > MAX_SPANS:
        lo = t.storage_offset() + sum(min(0, st * (n - 1)) for st, n in dims)
        hi = t.storage_offset() + sum(max(0, st * (n - 1)) for st, n in dims) + run
        return ((lo * es, hi * es),)
    for st, n in dims:
        offsets = [o + st * k for o in offsets for k in range(n)]
    return tuple(sorted((o * es, (o + run) * es) for o in offsets))


def _intersect(a, b) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
            return True
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return False


def _inside(inner, outer) -> bool:
    return all(any(lo <= a and b <= hi for lo, hi in outer) for a, b in inner)


@dataclass(frozen=True)
class Region:
    key: tuple  # which memory: ("mem", device, storage address), or a logical name (unit tests)
    spans: tuple[tuple[int, int], ...]  # sorted [lo, hi) within it (bytes, or rows)
    name: str  # for messages, e.g. "host slot of layer 3 x[0:512]"
    content: str | None = None  # what a write puts there / what a read expects there

    @classmethod
    def of(cls, t, name: str, content: str | None = None) -> Region:
        """The bytes tensor view ``t`` covers (physical: its storage's address and byte spans)."""
        return cls(("mem", t.device.type, t.untyped_storage().data_ptr()), _spans(t), name, content)

    @classmethod
    def logical(cls, space: str, index: int, tensor: str, rows: tuple[int, int]) -> Region:
        where = f"rounding buffer {index}" if space == "buffer" else f"host slot of layer {index}"
        return cls((space, index, tensor), (tuple(rows),), f"{where} {tensor}[{rows[0]}:{rows[1]}]")

    def overlaps(self, other: Region) -> bool:
        return self.key == other.key and _intersect(self.spans, other.spans)

    def covers(self, other: Region) -> bool:
        return self.key == other.key and _inside(other.spans, self.spans)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Access:
    stream: str
    epoch: int
    write: bool
    region: Region
    what: str  # the op that made it, e.g. "forward(3)", "offload(1)"

    def describe(self) -> str:
        return f"{self.what} {'writes' if self.write else 'reads'} it on {self.stream}"


class Contents:
    """What each declared write left in memory: per storage, byte spans with a content label."""

    def __init__(self) -> None:
        self.spans: dict[tuple, list[tuple[int, int, str, str]]] = {}  # key -> (lo, hi, content, writer)

    def write(self, r: Region, what: str) -> None:
        if r.content is None:
            return
        self.forget(r)
        self.spans.setdefault(r.key, []).extend((lo, hi, r.content, what) for lo, hi in r.spans)

    def forget(self, r: Region) -> None:
        old = self.spans.get(r.key)
        if not old:
            return
        keep = []
        for lo, hi, c, w in old:
            cut = [(a, b) for a, b in r.spans if a < hi and lo < b]
            if not cut:
                keep.append((lo, hi, c, w))
                continue
            pos = lo
            for a, b in cut:
                if a > pos:
                    keep.append((pos, a, c, w))
                pos = max(pos, b)
            if pos < hi:
                keep.append((pos, hi, c, w))
        self.spans[r.key] = keep

    def check(self, r: Region, what: str) -> None:
        """Every byte ``r`` covers must hold ``r.content`` (written by a declared op)."""
        if r.content is None:
            return
        left = list(r.spans)
        for lo, hi, c, w in self.spans.get(r.key, ()):
            if not _intersect(((lo, hi),), r.spans):
                continue
            if c != r.content:
                raise SlotMismatch(f"{what} reads {r} expecting {r.content}, but that memory holds {c} "
                                   f"(written by {w}): a wrong slot or two slots aliased")
            left = [piece for a, b in left for piece in ((a, min(b, lo)), (max(a, hi), b)) if piece[0] < piece[1]]
        if left:
            raise SlotMismatch(f"{what} reads {r} expecting {r.content}, but no declared write put it there "
                               f"(a wrong slot, or a read before the data arrived)")


class HappensBefore:
    """Vector clocks of the streams and the live access history of every region."""

    def __init__(self, streams: tuple[str, ...] = STREAMS) -> None:
        self.streams = streams
        self.clock: dict[str, dict[str, int]] = {s: dict.fromkeys(streams, 0) for s in streams}
        self.history: dict[tuple, list[Access]] = {}
        self.held: dict[tuple, set[str]] = {}  # storage key -> streams that hold it (record_stream)
        self.contents = Contents()
        self.checked = 0  # accesses checked (tests assert the detector saw the run)

    # -- events ------------------------------------------------------------------------------------
    def snapshot(self, stream: str) -> dict[str, int]:
        return dict(self.clock[stream])

    def join(self, stream: str, snapshot: dict[str, int] | None, recorded_on: str | None = None,
             event: str = "") -> None:
        if snapshot is None:  # the event was never recorded: the wait orders nothing
            return
        if recorded_on == stream:
            raise RaceError(f"{stream} waits for event {event!r} recorded on {stream} itself: the wait orders "
                            f"nothing (a wait issued inside the side stream's own context?)")
        mine = self.clock[stream]
        for s, c in snapshot.items():
            mine[s] = max(mine[s], c)

    def barrier(self) -> None:
        """Every stream synchronised with the host: all earlier accesses precede all later ones."""
        top = {s: max(self.clock[t][s] for t in self.streams) for s in self.streams}
        for s in self.streams:
            self.clock[s] = dict(top)
        self.history.clear()
        self.held.clear()

    # -- accesses ----------------------------------------------------------------------------------
    def ordered(self, earlier: Access, stream: str) -> bool:
        return earlier.stream == stream or earlier.epoch <= self.clock[stream][earlier.stream]

    def access(self, stream: str, what: str, reads=(), writes=()) -> None:
        """One op on ``stream`` that reads and writes these regions; raise `RaceError` on a race and
        `SlotMismatch` when a read finds other content than it expects."""
        self.clock[stream][stream] += 1
        epoch = self.clock[stream][stream]
        for region, write in [(r, False) for r in reads] + [(w, True) for w in writes]:
            self._check(Access(stream, epoch, write, region, what))
        for r in reads:
            self.contents.check(r, what)
        for w in writes:
            self.contents.write(w, what)

    def hold(self, stream: str, keys) -> None:
        """``stream`` keeps these storages alive until its queued work ran (``record_stream``)."""
        for k in keys:
            self.held.setdefault(k, set()).add(stream)

    def release(self, stream: str, what: str, regions) -> None:
        """``stream`` frees these tensors: every unordered access of another stream must hold them."""
        for r in regions:
            for b in self.history.get(r.key, ()):
                if b.region.overlaps(r) and not self.ordered(b, stream) and \
                        b.stream not in self.held.get(r.key, ()):
                    raise RaceError(f"{what} frees {r} on {stream} while {b.describe()}, unordered and not "
                                    f"held by {b.stream} (record_stream): the copy may read freed memory")
        for r in regions:
            self.history.pop(r.key, None)
            self.held.pop(r.key, None)
            self.contents.spans.pop(r.key, None)

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


@dataclass
class _InFlight:
    name: str
    sends: tuple[Region, ...]
    recvs: tuple[Region, ...]


class TransferGuard:
    """Point-to-point transfers in flight on one rank, and the accesses that must wait for them
    (module docs). ``posted`` returns a token for ``waited``."""

    def __init__(self) -> None:
        self.flight: dict[int, _InFlight] = {}
        self.contents = Contents()
        self._next = 0
        self.checked = 0

    def _clash(self, r: Region, write: bool, who: str) -> None:
        self.checked += 1
        for t in self.flight.values():
            for mine, busy in ((t.recvs, "receives into"), (t.sends if write else (), "sends from")):
                if any(x.overlaps(r) for x in mine):
                    raise RaceError(f"{who} {'writes' if write else 'reads'} {r} while transfer {t.name!r} "
                                    f"{busy} it and was not waited on (a missing P2P wait)")

    def posted(self, name: str, sends=(), recvs=()) -> int:
        sends, recvs = tuple(sends), tuple(recvs)
        for s in sends:
            self.contents.check(s, f"transfer {name!r}")
            if any(s.overlaps(r) for r in recvs):
                raise RaceError(f"transfer {name!r} receives into {s}, the buffer it sends (aliased double buffer)")
        for r in sends:
            self._clash(r, False, f"transfer {name!r}")
        for r in recvs:
            self._clash(r, True, f"transfer {name!r}")
        self._next += 1
        self.flight[self._next] = _InFlight(name, sends, recvs)
        return self._next

    def waited(self, token: int) -> None:
        t = self.flight.pop(token, None)
        if t is not None:
            for r in t.recvs:
                self.contents.write(r, f"transfer {t.name!r}")

    def access(self, what: str, reads=(), writes=()) -> None:
        """The compute side reads / writes these buffers now."""
        for r in reads:
            self._clash(r, False, what)
            self.contents.check(r, what)
        for w in writes:
            self._clash(w, True, what)
            self.contents.write(w, what)

    def pending(self, since: int = 0) -> list[str]:
        return [t.name for k, t in self.flight.items() if k > since]

    def mark(self) -> int:
        """The token of the last transfer posted so far (for ``finish(since=...)``)."""
        return self._next

    def finish(self, what: str, since: int = 0) -> None:
        """The end of a ring: its buffers are let go, so no transfer posted after ``since`` (`mark`)
        may still be in flight (a ring nested in an outer loop leaves the outer loop's alone)."""
        names = self.pending(since)
        if names:
            names = ", ".join(repr(n) for n in names)
            self.flight = {k: t for k, t in self.flight.items() if k <= since}
            raise RaceError(f"{what} ends with transfer {names} not waited on (a missing P2P wait: it may still "
                            f"use a buffer that is let go)")


def checking() -> bool:
    """Whether the P2P transfer guard runs (``MEMO_EXEC_RACE_CHECK=0`` turns it off)."""
    return os.environ.get("MEMO_EXEC_RACE_CHECK", "1") != "0"


def transfer_guard() -> TransferGuard | None:
    """A new guard, or None when the check is off (module docs)."""
    return TransferGuard() if checking() else None
