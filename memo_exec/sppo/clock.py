"""The step clock of an SPPO stage: marks taken while the step runs, read once at its end.

CUDA: a mark is a timing event recorded on the current stream (the compute stream; autograd's
backward runs on the forward's stream), so a span between two marks is what that stream did
between them: a piece's kernels, or the time it sat blocked in a ``wait_event`` on a prefetch or
a receive (which the host does not see: the wait only enqueues). Nothing synchronises per piece;
the marks are read after the step's one device synchronisation (`synchronize`).
CPU: a mark is ``time.perf_counter()`` on the calling thread, where the work and the waits run
inline, so the same bookkeeping measures the same spans.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.t0: float | None = None  # host time of the step's start
        self.ref = None  # CUDA: the event at the step's start

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.ref = self.mark() if self.cuda else None

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def seconds(self, m) -> float:
        """Seconds from the step's start to mark ``m`` (CUDA: after `synchronize`)."""
        if self.cuda:
            return self.ref.elapsed_time(m) / 1e3
        return m - self.t0

    def between(self, a, b) -> float:
        """Seconds from mark ``a`` to mark ``b`` (CUDA: after `synchronize`)."""
        if self.cuda:
            return a.elapsed_time(b) / 1e3
        return b - a

    def synchronize(self) -> None:
        """The step's one device synchronisation (the compute stream), before the marks are read."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
