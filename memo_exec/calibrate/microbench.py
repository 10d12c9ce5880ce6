"""Timing helpers: CUDA events on GPU, ``perf_counter`` on CPU; warm-up, adaptive repeats, medians.

`Bench.time(fn)` runs ``fn`` once to warm up (allocations, kernel selection, lazy init), times
one more call to choose how many repeats fill ``target_s`` (between ``min_repeats`` and
``max_repeats``; on a CPU a repeat's cost counts the cold-cache write before it, untimed but spent:
below), then times each repeat on its own and reports the median and the minimum. On
CUDA each repeat is bracketed by events on the current stream, so a caller that wraps the call
in ``torch.cuda.stream(s)`` times work on ``s``. On a CPU the call timed to choose the count is
timed as every repeat is (caches written over, then one call), so it is the first of the repeats,
not a call timed and thrown away; with the count given (``repeats``) no call is timed to choose it.
The first cold call after the warm-up runs as the later ones do (2026-12-02, the 2-core Xeon VM,
twelve trials each of a small and a large GEMM and of attention's and a ring block's forward and
backward: its median ratio to the median of calls 3-7 was 0.99-1.20, the second call's 0.94-1.22),
and the thrown-away calls were one cold-cache write in seven of a quick calibration (its GEMMs,
attention, ring blocks, memory-bound ops and copies: 1,668 and 1,682 writes of 256 MiB before,
1,418 and 1,443 after).

`Timing.seconds` is the statistic the profile uses: the median, on CUDA (events time the GPU
alone) and on CPU. A run is timed the same way (`memo_exec.measure.steady_value`: the median
over its steady steps), so a prediction and the measurement it is compared with see the same
machine: on a CPU shared with the OS and other processes a descheduled OpenMP thread stalls a
whole kernel now and then, and the fastest repeat (what the machine can do when nothing else
runs) is faster than what a run of many kernels in a row sees; the median is what both see.

On a CPU every repeat starts with cold caches: `Bench` writes a buffer (twice the size of the
last-level cache, or the smaller write measured to do as much, below) before each timed call (not
timed). A training step touches far more than the cache holds between two uses of a tensor (every
layer's weights, gradients, optimizer states and activations, and the other tenants of a shared
L3), so the executor's kernels read their
operands from memory; timed back to back, a small kernel finds them in cache and runs two to three
times faster than it does in a step (measured 2026-11-23 on the 2-core EPYC VM, one thread: a
256x128 @ 128x384 GEMM 0.30 ms hot, 0.77 ms after a 64 MiB write; layer norm of 256x128 44 us and
100 us; a 2 MiB write, the size of L2, changed nothing). A GPU's kernels stream operands far
larger than its L2, so CUDA runs are timed as they are.

How much to write is measured (`measure_cold_write`): the smallest write after which a small GEMM runs
as slow as after twice the last-level cache. What sysfs reports of a virtual machine is its host's
whole L3, most of it held by the other tenants: on the 2-core Xeon VM this project moved to (300 MiB
of L3 reported), 32 to 64 MiB left the probe GEMM as slow as 600 MiB did (2026-12-01: 0.36-0.40 ms
against 0.38 ms, 0.25 ms warm), and the 600 MiB write took 0.1 to 0.4 s a repeat, more than every
kernel of a quick calibration, and of every CPU run's speed probe (`memo_exec.speed_probe`). So a
repeat's write counts toward ``target_s``: a kernel shorter than the write gets ``min_repeats``, where
counting the kernel alone gave it ``max_repeats`` writes (2026-12-02: a quick calibration's 72 GEMMs
of about 0.2 ms took 10 repeats each, 11 writes of 256-600 MiB around each kernel).

`Bench.time_kernel(fn)` is for one kernel's own time (the GEMM suite): on CUDA, where one launch
takes under ``GRAPH_BELOW_S``, it captures ``ceil(GRAPH_BELOW_S / probe)`` calls in a CUDA graph and
times each replay, reporting the time per call. An event pair around one launch from Python times
the host's launch interval when the kernel is shorter than it: on an H200 (2026-11-26) every bf16
GEMM of 5e8-2e9 FLOPs took the same 22 us that way, so the calibrated curve's small end was the
host's, not the kernel's (`benchmarks/gpu/hopper_curves.py` leaves such points out). A function the
graph cannot capture is timed as `time` does, and `Timing.method` says which way each was timed.

`Progress` prints one line per step on stderr with the elapsed time, so that a long calibration
shows where it is.
"""

from __future__ import annotations

import glob
import mmap
import os
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
    method: str = "events"  # "events": one call per event pair; "cuda_graph": graph replays of `calls` calls
    calls: int = 1

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


GRAPH_BELOW_S = 1e-3  # a CUDA kernel shorter than this is timed by graph replay (`Bench.time_kernel`)
CACHE_FLUSH_FACTOR = 2  # the cold-cache write is this many times the last-level cache
DEFAULT_LLC_BYTES = 32 * 2**20  # where sysfs does not say


def last_level_cache_bytes() -> int:
    """Size of the CPU's last-level cache (sysfs: the highest-level cache of cpu0), or the default."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    best = (0, 0)
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "level")) as fl, open(os.path.join(d, "size")) as fs:
                level, size = int(fl.read()), fs.read().strip().upper()
            n = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)
        except (OSError, ValueError, KeyError):
            continue
        best = max(best, (level, n))
    return best[1] or DEFAULT_LLC_BYTES


COLD_PROBE = (256, 128, 384)  # tokens, input, output: the fp32 GEMM whose cold time decides the write
COLD_TOLERANCE = 0.10  # a write is enough when the probe's fastest time after it is within this of the full write's
COLD_ROUNDS = 7  # probe timings per write size, the sizes interleaved round by round
COLD_SMALLEST = 4 * 2**20  # the first write size tried (L2 is 1-2 MiB a core)


def full_cold_write_bytes() -> int:
    """The write that surely leaves nothing of the operands in cache: `CACHE_FLUSH_FACTOR` x the last-level cache."""
    return CACHE_FLUSH_FACTOR * last_level_cache_bytes()


def measure_cold_write(rounds: int = COLD_ROUNDS) -> dict:
    """The smallest write (powers of two from `COLD_SMALLEST`, and the full write) after which the `COLD_PROBE`
    GEMM, and after every larger write too, runs within `COLD_TOLERANCE` of its time after the full write
    (`full_cold_write_bytes`): ``{"bytes", "full_bytes", "llc_bytes", "probe_ms": {MiB: fastest ms}, "warm_ms"}``.
    Each size's fastest of ``rounds`` timings: load only adds time, and a busy machine's medians had put a slow
    outlier at 64 MiB and a fast one at 256 MiB (2026-12-01, load 7.7, 7 rounds: the answer moved to 512 MiB),
    while the fastest cold time is what the write leaves of the cache (warm 0.20 ms, after 16-32 MiB 0.30 ms,
    from 64 MiB 0.35 ms on the Xeon VM). The sizes are interleaved round by round; one thread (the caller's).
    Where no smaller write is as slow, or the full write is no larger than the smallest tried, the full write is
    the answer."""
    full = full_cold_write_bytes()
    sizes = []
    n = COLD_SMALLEST
    while n < full:
        sizes.append(n)
        n *= 2
    sizes.append(full)
    gen = torch.Generator().manual_seed(0)
    t, i, o = COLD_PROBE
    a, b = torch.randn(t, i, generator=gen), torch.randn(i, o, generator=gen)
    out = torch.empty(t, o)
    buf = torch.empty(full // 4, dtype=torch.float32)
    buf.fill_(1.0)  # the pages exist before the first timed write
    times: dict[int, list[float]] = {n: [] for n in sizes}
    warm = []
    torch.mm(a, b, out=out)
    for _ in range(rounds):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        warm.append(time.perf_counter() - t0)
        for n in sizes:
            buf[: n // 4].fill_(1.0)
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            times[n].append(time.perf_counter() - t0)
    fastest = {n: min(v) for n, v in times.items()}
    return {"bytes": smallest_cold_write(fastest), "full_bytes": full, "llc_bytes": last_level_cache_bytes(),
            "probe": f"fp32 GEMM {t}x{i} @ {i}x{o}, fastest of {rounds}",
            "probe_ms": {str(n // 2**20): round(fastest[n] * 1e3, 4) for n in sizes},
            "warm_ms": round(min(warm) * 1e3, 4)}


def smallest_cold_write(times: dict[int, float]) -> int:
    """The smallest write size from which every larger one (the largest is the full write) left the probe within
    `COLD_TOLERANCE` of its time after the full write: ``times`` maps write bytes to the probe's time."""
    sizes = sorted(times)
    floor = (1.0 - COLD_TOLERANCE) * times[sizes[-1]]
    chosen = sizes[-1]
    for n in reversed(sizes):
        if times[n] < floor:
            break
        chosen = n
    return chosen


def cold_write_text(cold: dict) -> str:
    """One line for the progress and the report: the write chosen and why."""
    mib = cold["bytes"] / 2**20
    full = cold["full_bytes"] / 2**20
    if cold["bytes"] >= cold["full_bytes"]:
        return f"cold caches: {mib:.0f} MiB written before each timed repeat (twice the last-level cache)"
    return (f"cold caches: {mib:.0f} MiB written before each timed repeat (the probe GEMM ran as slow after it as "
            f"after {full:.0f} MiB, twice the {cold['llc_bytes'] / 2**20:.0f} MiB last-level cache sysfs reports: "
            + ", ".join(f"{k} MiB {v} ms" for k, v in cold["probe_ms"].items()) + f"; warm {cold['warm_ms']} ms)")


class Bench:
    def __init__(self, device: torch.device, target_s: float = 0.05, min_repeats: int = 3,
                 max_repeats: int = 50, warmup: int = 1, cold: bool | None = None,
                 flush_bytes: int | None = None) -> None:
        """``flush_bytes``: the cold-cache write on a CPU (`measure_cold_write`'s); default the full one
        (`full_cold_write_bytes`)."""
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.target_s = target_s
        self.min_repeats = min_repeats
        self.max_repeats = max_repeats
        self.warmup = warmup
        self.stat = statistic_for(self.device)
        self.cold = (not self.cuda) if cold is None else cold  # CPU: every repeat with cold caches
        self.flush_bytes = (flush_bytes or full_cold_write_bytes()) if self.cold and not self.cuda else 0
        self._map: mmap.mmap | None = None  # the cold-cache write's pages: a mapping of their own (`release`)
        self._flush: torch.Tensor | None = None
        self._map_flush()

    def _map_flush(self) -> None:
        """Map the cold-cache buffer: an anonymous private mapping, not the C library's heap, so `release` can give
        its pages back to the kernel whatever the malloc policy (`memo_exec.host_malloc.keep_freed_memory` keeps
        freed heap memory in the process, and glibc serves a request under its 32 MiB mmap threshold from the
        heap). The pages are faulted in by the first write, as ``torch.empty``'s were. The mapping lives as long as
        the bench: ``torch.frombuffer`` holds no export of it, so a closed mapping under a live tensor would be
        read after it is unmapped."""
        if not self.flush_bytes or self._flush is not None:
            return
        n = self.flush_bytes // 4 * 4
        flags = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
        self._map = mmap.mmap(-1, n, flags=flags[0] | flags[1]) if None not in flags else mmap.mmap(-1, n)
        self._flush = torch.frombuffer(self._map, dtype=torch.float32)

    def release(self) -> bool:
        """Give the cold-cache buffer's pages back to the kernel (``madvise(MADV_DONTNEED)`` on its private anonymous
        mapping: the process's resident set no longer holds them, the mapping and the tensor stay valid, and the
        next `evict`'s write faults in zero pages, untimed as the write is). A CPU run's speed probe
        (`memo_exec.speed_probe.SpeedProbe.sample`) releases its buffer after each sample: kept, its pages stayed in
        the run's RSS and so in every later step's measured peak (a review: 0.301 GiB at step 0, 0.557 GiB at step
        1, the 256 MiB write more). False where nothing is mapped or the platform has no ``madvise`` (the pages are
        then kept and reused)."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED") or not hasattr(self._map, "madvise"):
            return False
        try:
            self._map.madvise(mmap.MADV_DONTNEED)
        except OSError:
            return False
        return True

    def evict(self) -> None:
        """Push the operands out of the CPU caches (untimed; a no-op on CUDA or with cold=False)."""
        if self._flush is not None:
            self._flush.fill_(1.0)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _once(self, fn: Callable[[], object]) -> tuple[float, float]:
        """One timed call and the untimed cold-cache write before it (0 on CUDA), in seconds."""
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3, 0.0
        t0 = time.perf_counter()
        self.evict()
        t1 = time.perf_counter()
        fn()
        return time.perf_counter() - t1, t1 - t0

    def time(self, fn: Callable[[], object], repeats: int | None = None, warmup: int | None = None) -> Timing:
        """``fn``'s `Timing` (module docs); ``warmup``: untimed calls first (default the bench's), 0 where the
        caller has just run ``fn`` itself."""
        self.sync()
        for _ in range(self.warmup if warmup is None else warmup):
            fn()
        self.sync()
        samples: list[float] = []
        if repeats is None or self.cuda:
            probe, flush_s = self._once(fn)  # flush_s: the CPU repeat's write, untimed but spent all the same
            if not self.cuda:  # evict, then one call: timed as a repeat is, so it is the first repeat
                samples.append(probe)
        if repeats is None:
            # as many repeats as fill target_s, each one call and the write before it (module docs)
            per = probe + flush_s
            repeats = int(self.target_s / per) if per > 0 else self.max_repeats
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
            while len(samples) < repeats:
                samples.append(self._once(fn)[0])
        return Timing(statistics.median(samples), min(samples), repeats, self.stat)

    def time_kernel(self, fn: Callable[[], object]) -> Timing:
        """``fn``'s kernel time (module docs): `time` on a CPU or where one call takes GRAPH_BELOW_S or
        more; else CUDA-graph replays of enough calls to take about GRAPH_BELOW_S, per call."""
        plain = self.time(fn)
        if not self.cuda or plain.seconds >= GRAPH_BELOW_S:
            return plain
        calls = max(1, -(-int(GRAPH_BELOW_S * 1e9) // max(1, int(plain.seconds * 1e9))))
        try:
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn()  # the capture's warm-up, on a side stream as torch.cuda.graphs asks
            torch.cuda.current_stream(self.device).wait_stream(side)
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            graph.replay()
            self.sync()
        except RuntimeError:
            return plain
        t = self.time(graph.replay, repeats=max(self.min_repeats, min(self.max_repeats, plain.repeats)))
        return Timing(t.median_s / calls, t.min_s / calls, t.repeats, self.stat, "cuda_graph", calls)


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
