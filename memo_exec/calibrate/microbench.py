"""Timing helpers: CUDA events on GPU, ``perf_counter`` on CPU; warm-up, adaptive repeats, medians.

`Bench.time(fn)` runs ``fn`` once to warm up (allocations, kernel selection, lazy init), times
one more call to choose how many repeats fill ``target_s`` (between ``min_repeats`` and
``max_repeats``), then times each repeat on its own and reports the median and the minimum. On
CUDA each repeat is bracketed by events on the current stream, so a caller that wraps the call
in ``torch.cuda.stream(s)`` times work on ``s``.

`Timing.seconds` is the statistic the profile uses: the median, on CUDA (events time the GPU
alone) and on CPU. A run is timed the same way (`memo_exec.measure.steady_value`: the median
over its steady steps), so a prediction and the measurement it is compared with see the same
machine: on a CPU shared with the OS and other processes a descheduled OpenMP thread stalls a
whole kernel now and then, and the fastest repeat (what the machine can do when nothing else
runs) is faster than what a run of many kernels in a row sees; the median is what both see.

`Progress` prints one line per step on stderr with the elapsed time, so that a long calibration
shows where it is.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import torch


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    repeats: int
    stat: str = "median"  # which of the two `seconds` reports

    @property
    def seconds(self) -> float:
        return self.min_s if self.stat == "min" else self.median_s

    def rate(self, amount: float) -> float:
        """``amount`` per second at `seconds` (FLOP/s, bytes/s)."""
        return amount / self.seconds if self.seconds > 0 else float("inf")


TIMING_STATISTIC = "median"  # of the repeats; `memo_exec.measure.steady_value` is the run's side


def statistic_for(device: torch.device) -> str:
    """The statistic `Timing.seconds` reports on ``device``: `TIMING_STATISTIC` on every device."""
    return TIMING_STATISTIC


class Bench:
    def __init__(self, device: torch.device, target_s: float = 0.05, min_repeats: int = 3,
                 max_repeats: int = 50, warmup: int = 1) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.target_s = target_s
        self.min_repeats = min_repeats
        self.max_repeats = max_repeats
        self.warmup = warmup
        self.stat = statistic_for(self.device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _once(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def time(self, fn: Callable[[], object], repeats: int | None = None) -> Timing:
        self.sync()
        for _ in range(self.warmup):
            fn()
        self.sync()
        probe = self._once(fn)
        if repeats is None:
            repeats = int(self.target_s / probe) if probe > 0 else self.max_repeats
            repeats = max(self.min_repeats, min(self.max_repeats, repeats))
        if self.cuda:
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(repeats)]
            for s, e in evs:
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize(self.device)
            samples = [s.elapsed_time(e) / 1e3 for s, e in evs]
        else:
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return Timing(statistics.median(samples), min(samples), repeats, self.stat)


class Progress:
    """``[calibrate  12.3s] stage (i/n): message`` lines on stderr."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream
        self.t0 = time.perf_counter()
        self.stage_name = ""
        self.total = 0
        self.count = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def _emit(self, text: str) -> None:
        if self.enabled:
            out = self.stream or sys.stderr
            out.write(f"[calibrate {self.elapsed():6.1f}s] {text}\n")
            out.flush()

    def stage(self, name: str, total: int = 0) -> None:
        self.stage_name, self.total, self.count = name, total, 0
        self._emit(f"{name}" + (f" ({total} measurements)" if total else ""))

    def step(self, message: str) -> None:
        self.count += 1
        of = f"{self.count}/{self.total}" if self.total else f"{self.count}"
        self._emit(f"  {self.stage_name} {of}: {message}")

    def note(self, message: str) -> None:
        self._emit(message)


def randn(*size: int, device: torch.device, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Normal random values made on the device itself (no host round trip for large operands)."""
    t = torch.randn(*size, device=device, dtype=dtype if torch.device(device).type == "cuda" else torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)
