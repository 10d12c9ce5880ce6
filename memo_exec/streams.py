"""Three streams -- compute, offload (d2h), prefetch (h2d) -- and events between them.

CUDA: `torch.cuda.Stream` / `torch.cuda.Event`; copies are ``copy_(non_blocking=True)`` on a side
stream, and every device tensor a side stream touches gets ``record_stream`` so the caching
allocator never hands its memory out while the copy may still read or write it.

CPU: the same semantics with threads, so that synchronisation bugs show on a laptop. The compute
stream is the calling thread (work runs inline, so recording an event on it completes it at
once, and waiting on an event blocks the thread). Each copy stream is a worker thread that runs
its queue in order: ``wait_event`` queues a wait, ``record`` queues the event's completion,
``copy_group`` queues copies. An event may be recorded again; a wait refers to the latest record
at the time ``wait_event`` is called, as with CUDA events. Waiting on a never-recorded event is a
no-op. ``copy_delay`` (tests) makes a worker sleep before a copy group, which turns a missing wait
into a wrong gradient.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from memo_exec.errors import ExecError


@dataclass(frozen=True)
class CopyLabel:
    op: str  # "offload" | "prefetch"
    layer: int
    phase: str
    nbytes: int


class CopySink(Protocol):
    """Receives the start/end of every copy group (floats on CPU, CUDA events on GPU)."""

    def add_copy(self, stream: str, label: CopyLabel, start, end) -> None: ...


# --------------------------------------------------------------------------------------------------
# CPU: threads
# --------------------------------------------------------------------------------------------------
class HostEvent:
    def __init__(self) -> None:
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

    def _wait(self, gen: int, engine: "HostCopyEngine") -> None:
        with self._cond:
            while self._done < gen:
                self._cond.wait(timeout=0.5)
                engine.raise_if_failed()

    def query(self) -> bool:
        with self._cond:
            return self._done >= self._recorded


class HostComputeStream:
    name = "compute"

    def __init__(self, engine: "HostCopyEngine") -> None:
        self.engine = engine

    def record(self, ev: HostEvent) -> None:
        ev._complete(ev._new_record())

    def wait_event(self, ev: HostEvent) -> None:
        if self.engine.unsafe_skip_compute_waits:
            return
        gen = ev._recorded
        if gen:
            ev._wait(gen, self.engine)


class HostCopyStream:
    def __init__(self, name: str, engine: "HostCopyEngine") -> None:
        self.name = name
        self.engine = engine
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"memo-{name}", daemon=True)
        self._thread.start()

    def record(self, ev: HostEvent) -> None:
        self._q.put(("mark", ev, ev._new_record()))

    def wait_event(self, ev: HostEvent) -> None:
        gen = ev._recorded
        if gen:
            self._q.put(("wait", ev, gen))

    def copy_group(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], label: CopyLabel) -> None:
        self._q.put(("copy", pairs, label))

    def synchronize(self) -> None:
        ev = HostEvent()
        self.record(ev)
        ev._wait(ev._recorded, self.engine)

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
                    a._wait(b, self.engine)
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


class HostCopyEngine:
    """CPU copy engine: compute = calling thread, d2h and h2d = one worker thread each."""

    kind = "cpu"

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.copy_delay: Callable[[str, CopyLabel], float] | None = None
        self.unsafe_skip_compute_waits = False  # test-only: proves the delay tests have teeth
        self.sink: CopySink | None = None
        self.compute = HostComputeStream(self)
        self.d2h = HostCopyStream("d2h", self)
        self.h2d = HostCopyStream("h2d", self)

    def event(self) -> HostEvent:
        return HostEvent()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            raise ExecError(f"copy stream failed: {type(e).__name__}: {e}") from e

    def synchronize(self) -> None:
        self.d2h.synchronize()
        self.h2d.synchronize()
        self.raise_if_failed()

    def close(self) -> None:
        self.d2h.close()
        self.h2d.close()


# --------------------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------------------
class CudaEvent:
    def __init__(self) -> None:
        self.ev = torch.cuda.Event()

    def query(self) -> bool:
        return self.ev.query()


class CudaComputeStream:
    """The stream the training loop runs on (the current stream; autograd's backward uses the
    forward's stream)."""

    name = "compute"

    def __init__(self, engine: "CudaCopyEngine") -> None:
        self.engine = engine

    def record(self, ev: CudaEvent) -> None:
        ev.ev.record(torch.cuda.current_stream(self.engine.device))

    def wait_event(self, ev: CudaEvent) -> None:
        if self.engine.unsafe_skip_compute_waits:
            return
        torch.cuda.current_stream(self.engine.device).wait_event(ev.ev)


class CudaCopyStream:
    def __init__(self, name: str, engine: "CudaCopyEngine") -> None:
        self.name = name
        self.engine = engine
        self.stream = torch.cuda.Stream(device=engine.device)

    def record(self, ev: CudaEvent) -> None:
        ev.ev.record(self.stream)

    def wait_event(self, ev: CudaEvent) -> None:
        self.stream.wait_event(ev.ev)

    def copy_group(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], label: CopyLabel) -> None:
        timed = self.engine.sink is not None
        with torch.cuda.stream(self.stream):
            if timed:
                t0 = torch.cuda.Event(enable_timing=True)
                t0.record(self.stream)
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                for t in (dst, src):
                    if t.is_cuda:
                        t.record_stream(self.stream)
            if timed:
                t1 = torch.cuda.Event(enable_timing=True)
                t1.record(self.stream)
                self.engine.sink.add_copy(self.name, label, t0, t1)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self.stream.synchronize()


class CudaCopyEngine:
    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.copy_delay = None  # CUDA copies cannot be delayed from Python; the CPU engine tests races
        self.unsafe_skip_compute_waits = False
        self.sink: CopySink | None = None
        self.compute = CudaComputeStream(self)
        self.d2h = CudaCopyStream("d2h", self)
        self.h2d = CudaCopyStream("h2d", self)

    def event(self) -> CudaEvent:
        return CudaEvent()

    def raise_if_failed(self) -> None:
        return None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.synchronize()


def make_engine(device: torch.device):
    return CudaCopyEngine(device) if device.type == "cuda" else HostCopyEngine()
