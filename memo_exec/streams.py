"""Three streams -- compute, offload (d2h), prefetch (h2d) -- and events between them.

Both engines feed the same happens-before race detector (`memo_exec.happens_before`): every
``record`` snapshots the recording stream's vector clock into the event, every ``wait_event``
joins it into the waiting stream's, and the activation policy declares which rounding-buffer
and host rows each compute op and each copy group reads and writes (``access`` / the
``reads``/``writes`` of ``copy_group``). A conflicting pair that no event orders raises
`RaceError` at issue time, deterministically, on CPU and on CUDA alike. Regions are physical
(`Region.of` a tensor view): a copy group's ``reads``/``writes`` are built from the very tensors
of its pairs. Every copy group *holds* its tensors (``_hold``: ``record_stream`` on CUDA, the
queued references on CPU), and a stream that drops a tensor says so (``release``): freeing memory
another stream still uses without holding it is refused. Every record, wait and
copy is also reported, in issue order, to the engine's sink (``issued``): with the compute ops
the recorder logs, that is the op order the tests compare with the simulator's op graph.

CUDA: `torch.cuda.Stream` / `torch.cuda.Event`; copies are ``copy_(non_blocking=True)`` on a side
stream, and every device tensor a side stream touches gets ``record_stream`` so the caching
allocator never hands its memory out while the copy may still read or write it.

CPU: the same semantics with threads, so that synchronisation bugs show on a laptop. The compute
stream is the calling thread (work runs inline, so recording an event on it completes it at
once, and waiting on an event blocks the thread). Each copy stream is a worker thread that runs
its queue in order: ``wait_event`` queues a wait, ``record`` queues the event's completion,
``copy_group`` queues copies. An event may be recorded again; a wait refers to the latest record
at the time ``wait_event`` is called, as with CUDA events. Waiting on a never-recorded event is a
no-op. ``copy_delay`` (tests) makes a worker sleep before a copy group: the copies really run
late, and the results must not change.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from memo_exec.errors import ExecError
from memo_exec.happens_before import HappensBefore, Region
from memo_exec.wait_switch import wait_primitive


@dataclass(frozen=True)
class CopyLabel:
    op: str  # "offload" | "prefetch"
    layer: int
    phase: str
    nbytes: int


@dataclass(frozen=True)
class Issued:
    """One entry of the issue order: a compute op, a copy group, an event record or wait."""

    stream: str
    kind: str  # "op" | "copy" | "record" | "wait"
    op: str = ""  # op name, copy op ("offload"/"prefetch") or event name
    layer: int | None = None
    phase: str = ""
    event: int | None = None  # id of the event recorded or waited on


class CopySink(Protocol):
    """Receives the start/end of every copy group (floats on CPU, CUDA events on GPU) and the
    issue order of copies, records and waits."""

    def add_copy(self, stream: str, label: CopyLabel, start, end) -> None: ...

    def issued(self, entry: Issued) -> None: ...


_EVENT_IDS = itertools.count(1)


class _Ordering:
    """What every stream shares: the race detector's clock and the issue log."""

    name: str
    engine: "HostStreams | CudaStreams"

    def access(self, what: str, reads: Iterable[Region] = (), writes: Iterable[Region] = ()) -> None:
        """Declare that the next op on this stream reads / writes these regions."""
        self.engine.hb.access(self.name, what, tuple(reads), tuple(writes))

    def release(self, what: str, tensors: Iterable[torch.Tensor]) -> None:
        """This stream drops these tensors (their memory may be handed out again): the detector
        checks that no other stream still reads or writes them unless it holds them."""
        self.engine.hb.release(self.name, what, [Region.of(t, f"{what}: a {tuple(t.shape)} tensor") for t in tensors])

    def _issued(self, kind: str, **kw) -> None:
        if self.engine.sink is not None:
            self.engine.sink.issued(Issued(self.name, kind, **kw))

    def _note_record(self, ev) -> None:
        ev.clock = self.engine.hb.snapshot(self.name)
        ev.recorded_on = self.name
        self._issued("record", op=ev.name, event=ev.id)

    def _note_wait(self, ev) -> None:
        self.engine.hb.join(self.name, ev.clock, getattr(ev, "recorded_on", None), ev.name)
        self._issued("wait", op=ev.name, event=ev.id)

    def _hold(self, pairs) -> None:
        """This copy stream keeps the tensors of its queued copies alive until they ran (CPU: the
        queue's references; CUDA: ``record_stream``, `CudaCopyStream._hold`)."""
        self.engine.hb.hold(self.name, {Region.of(t, "").key for pair in pairs for t in pair})

    def _note_copy(self, label: CopyLabel, reads, writes, pairs) -> None:
        self.access(f"{label.op}({label.layer})", reads, writes)
        self._hold(pairs)
        self._issued("copy", op=label.op, layer=label.layer, phase=label.phase)


# --------------------------------------------------------------------------------------------------
# CPU: threads
# --------------------------------------------------------------------------------------------------
class HostEvent:
    def __init__(self, name: str = "") -> None:
        self.name = name
        self.id = next(_EVENT_IDS)
        self.clock: dict[str, int] | None = None  # happens-before snapshot of the latest record
        self.recorded_on: str | None = None  # the stream of the latest record
        self._cond = threading.Condition()
        self._recorded = 0
        self._done = 0

    def _new_record(self) -> int:
        with self._cond:
            self._recorded += 1
            return self._recorded

    def _complete(self, gen: int) -> None:
        with self._cond:
            if gen > self._done:
                self._done = gen
            self._cond.notify_all()

    def _block(self, gen: int, engine: "HostStreams") -> None:
        with self._cond:
            while self._done < gen:
                self._cond.wait(timeout=0.5)
                engine.raise_if_failed()

    def query(self) -> bool:
        with self._cond:
            return self._done >= self._recorded


class HostComputeStream(_Ordering):
    name = "compute"

    def __init__(self, engine: "HostStreams") -> None:
        self.engine = engine

    def record(self, ev: HostEvent) -> None:
        self._note_record(ev)
        ev._complete(ev._new_record())

    @wait_primitive
    def wait_event(self, ev: HostEvent) -> None:
        self._note_wait(ev)
        gen = ev._recorded
        if gen:
            ev._block(gen, self.engine)


class HostCopyStream(_Ordering):
    def __init__(self, name: str, engine: "HostStreams") -> None:
        self.name = name
        self.engine = engine
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"memo-{name}", daemon=True)
        self._thread.start()

    def record(self, ev: HostEvent) -> None:
        self._note_record(ev)
        self._q.put(("mark", ev, ev._new_record()))

    @wait_primitive
    def wait_event(self, ev: HostEvent) -> None:
        self._note_wait(ev)
        gen = ev._recorded
        if gen:
            self._q.put(("wait", ev, gen))

    def copy_group(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], label: CopyLabel,
                   reads: Iterable[Region] = (), writes: Iterable[Region] = ()) -> None:
        """Copy each ``(dst, src)`` pair in order; ``reads``/``writes`` name the regions for the race detector."""
        self._note_copy(label, reads, writes, pairs)
        self._q.put(("copy", pairs, label))

    def synchronize(self) -> None:
        ev = HostEvent("synchronize")
        gen = ev._new_record()
        self._q.put(("mark", ev, gen))
        ev._block(gen, self.engine)

    def close(self) -> None:
        self._q.put(("stop", None, None))
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            kind, a, b = self._q.get()
            if kind == "stop":
                return
            try:
                if kind == "mark":
                    a._complete(b)
                elif kind == "wait":
                    a._block(b, self.engine)
                elif kind == "copy":
                    delay = self.engine.copy_delay(self.name, b) if self.engine.copy_delay else 0.0
                    if delay:
                        time.sleep(delay)
                    t0 = time.perf_counter()
                    for dst, src in a:
                        dst.copy_(src)
                    t1 = time.perf_counter()
                    if self.engine.sink is not None:
                        self.engine.sink.add_copy(self.name, b, t0, t1)
            except BaseException as e:  # noqa: BLE001 - surfaced on the compute thread
                self.engine.error = e
                if kind == "mark":
                    a._complete(b)


class HostStreams:
    """The three streams on a CPU: compute = the calling thread, d2h and h2d = one worker thread each."""

    kind = "cpu"

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.copy_delay: Callable[[str, CopyLabel], float] | None = None
        self.sink: CopySink | None = None
        self.hb = HappensBefore()
        self.compute = HostComputeStream(self)
        self.d2h = HostCopyStream("d2h", self)
        self.h2d = HostCopyStream("h2d", self)

    def event(self, name: str = "") -> HostEvent:
        return HostEvent(name)

    def raise_if_failed(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            raise ExecError(f"copy stream failed: {type(e).__name__}: {e}") from e

    def synchronize(self) -> None:
        self.d2h.synchronize()
        self.h2d.synchronize()
        self.hb.barrier()
        self.raise_if_failed()

    def close(self) -> None:
        self.d2h.close()
        self.h2d.close()


# --------------------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------------------
class CudaEvent:
    def __init__(self, name: str = "") -> None:
        self.name = name
        self.id = next(_EVENT_IDS)
        self.clock: dict[str, int] | None = None
        self.recorded_on: str | None = None
        self.ev = torch.cuda.Event()

    def query(self) -> bool:
        return self.ev.query()


class CudaComputeStream(_Ordering):
    """The stream the training loop runs on (the current stream; autograd's backward uses the
    forward's stream)."""

    name = "compute"

    def __init__(self, engine: "CudaStreams") -> None:
        self.engine = engine

    def record(self, ev: CudaEvent) -> None:
        self._note_record(ev)
        ev.ev.record(torch.cuda.current_stream(self.engine.device))

    @wait_primitive
    def wait_event(self, ev: CudaEvent) -> None:
        self._note_wait(ev)
        torch.cuda.current_stream(self.engine.device).wait_event(ev.ev)


class CudaCopyStream(_Ordering):
    def __init__(self, name: str, engine: "CudaStreams") -> None:
        self.name = name
        self.engine = engine
        self.stream = torch.cuda.Stream(device=engine.device)

    def record(self, ev: CudaEvent) -> None:
        self._note_record(ev)
        ev.ev.record(self.stream)

    @wait_primitive
    def wait_event(self, ev: CudaEvent) -> None:
        self._note_wait(ev)
        self.stream.wait_event(ev.ev)

    def copy_group(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], label: CopyLabel,
                   reads: Iterable[Region] = (), writes: Iterable[Region] = ()) -> None:
        self._note_copy(label, reads, writes, pairs)
        timed = self.engine.sink is not None
        with torch.cuda.stream(self.stream):
            delay = self.engine.copy_delay(self.name, label) if self.engine.copy_delay else 0.0
            if delay:
                torch.cuda._sleep(int(delay * self.engine.sleep_cycles_per_s))
            if timed:
                t0 = torch.cuda.Event(enable_timing=True)
                t0.record(self.stream)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            if timed:
                t1 = torch.cuda.Event(enable_timing=True)
                t1.record(self.stream)
                self.engine.sink.add_copy(self.name, label, t0, t1)

    def _hold(self, pairs) -> None:
        for pair in pairs:
            for t in pair:
                if t.is_cuda:
                    t.record_stream(self.stream)
        super()._hold(pairs)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self.stream.synchronize()


class CudaStreams:
    """The three streams on a GPU: the current stream for compute, one side stream each for d2h and h2d."""

    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # tests: seconds to keep a copy stream busy (torch.cuda._sleep) before a copy group
        self.copy_delay: Callable[[str, CopyLabel], float] | None = None
        self.sleep_cycles_per_s = 1.5e9  # GPU clock cycles per second for torch.cuda._sleep (about)
        self.sink: CopySink | None = None
        self.hb = HappensBefore()
        self.compute = CudaComputeStream(self)
        self.d2h = CudaCopyStream("d2h", self)
        self.h2d = CudaCopyStream("h2d", self)

    def event(self, name: str = "") -> CudaEvent:
        return CudaEvent(name)

    def raise_if_failed(self) -> None:
        return None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)
        self.hb.barrier()

    def close(self) -> None:
        self.synchronize()


def make_engine(device: torch.device):
    return CudaStreams(device) if device.type == "cuda" else HostStreams()
