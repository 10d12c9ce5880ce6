"""Host <-> device copy bandwidth vs size, two copies at once, and copies while compute runs.

CUDA: page-locked host buffers (``pin_memory=True``) and ``copy_(non_blocking=True)`` on side
streams, timed with CUDA events, as the executor's offload (d2h) and prefetch (h2d) streams copy.
CPU: the executor's copy streams are worker threads that ``copy_`` between plain tensors, so the
same experiments run as threads copying host memory.

- `copy_sweep`: one direction at a time, on a side stream (a thread on CPU), per size.
- `duplex`: a d2h and an h2d stream copying at once: each direction's rate and the sum.
- `copy_compute`: a GEMM loop on the compute stream while copies run on a side stream, long
  enough to cover the whole GEMM loop: the GEMMs' slowdown (``t_with / t_alone - 1``, the profile's
  ``gpu.copy_compute_slowdown``) and the copies' rate while the GEMMs run vs alone.
"""

from __future__ import annotations

import math
import statistics
import threading
import time

import torch

from memo_exec.calibrate.microbench import Bench, Progress

DIRECTIONS = ("d2h", "h2d")


class _Buffers:
    """A device buffer and a host buffer (pinned on CUDA) of ``nbytes`` for one direction."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.cuda = device.type == "cuda"
        self.dev = torch.ones(nbytes, dtype=torch.uint8, device=device)
        self.host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=self.cuda)

    def copy(self, direction: str, n: int) -> None:
        if direction == "d2h":
            self.host[:n].copy_(self.dev[:n], non_blocking=self.cuda)
        else:
            self.dev[:n].copy_(self.host[:n], non_blocking=self.cuda)


def copy_sweep(bench: Bench, sizes: list[int], progress: Progress) -> dict[str, list[dict]]:
    """Per direction: ``[{bytes, seconds, bytes_per_s}]`` for each size."""
    dev = bench.device
    buf = _Buffers(dev, max(sizes))
    out: dict[str, list[dict]] = {d: [] for d in DIRECTIONS}
    progress.stage("host <-> device copies, one at a time" + (" (pinned)" if bench.cuda else " (CPU memcpy)"),
                   len(sizes))
    side = torch.cuda.Stream(dev) if bench.cuda else None
    for n in sizes:
        msg = []
        for d in DIRECTIONS:
            fn = (lambda d=d, n=n: buf.copy(d, n))
            if side is not None:
                with torch.cuda.stream(side):
                    tm = bench.time(fn)
            else:
                tm = bench.time(fn)
            out[d].append({"bytes": n, "seconds": tm.seconds, "bytes_per_s": tm.rate(n)})
            msg.append(f"{d} {tm.rate(n) / 1e9:.2f} GB/s")
        progress.step(f"{n / 2**20:.3f} MiB: " + ", ".join(msg))
    return out


# ------------------------------------------------------------------------------------------ CUDA
def _duplex_cuda(device: torch.device, nbytes: int, count: int) -> dict:
    bufs = {d: _Buffers(device, nbytes) for d in DIRECTIONS}
    streams = {d: torch.cuda.Stream(device) for d in DIRECTIONS}
    results = []
    for _rep in range(3):
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        ends = {}
        for d in DIRECTIONS:
            s = streams[d]
            s.wait_event(start)
            with torch.cuda.stream(s):
                for _ in range(count):
                    bufs[d].copy(d, nbytes)
                ends[d] = torch.cuda.Event(enable_timing=True)
                ends[d].record()
        torch.cuda.synchronize(device)
        per = {d: count * nbytes / (start.elapsed_time(ends[d]) / 1e3) for d in DIRECTIONS}
        overall = max(start.elapsed_time(e) for e in ends.values()) / 1e3
        per["total"] = 2 * count * nbytes / overall
        results.append(per)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def _copy_compute_cuda(device: torch.device, dtype: torch.dtype, gemm_n: int, compute_s: float,
                       solo_bw: dict[str, float], chunk: int) -> dict:
    a = torch.randn(gemm_n, gemm_n, device=device).to(dtype)
    b = torch.randn(gemm_n, gemm_n, device=device).to(dtype)
    c = torch.empty(gemm_n, gemm_n, device=device, dtype=dtype)

    def gemms(r):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(r):
            torch.mm(a, b, out=c)
        e.record()
        return s, e

    for _ in range(3):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize(device)
    s, e = gemms(5)
    torch.cuda.synchronize(device)
    reps = max(5, math.ceil(compute_s / (s.elapsed_time(e) / 1e3 / 5)))

    def alone():
        s, e = gemms(reps)
        torch.cuda.synchronize(device)
        return s.elapsed_time(e) / 1e3

    t_alone = statistics.median(alone() for _ in range(3))
    bufs = {d: _Buffers(device, chunk) for d in DIRECTIONS}
    streams = {d: torch.cuda.Stream(device) for d in DIRECTIONS}
    out = {"gemm_n": gemm_n, "gemm_repeats": reps, "compute_alone_s": t_alone, "chunk_bytes": chunk}
    for mode in ("d2h", "h2d", "both"):
        dirs = DIRECTIONS if mode == "both" else (mode,)
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        copy_ends: dict[str, list] = {}
        for d in dirs:
            # enough copies to outlast the GEMM loop by half again at the solo rate
            count = max(2, math.ceil(1.5 * t_alone * solo_bw[d] / chunk))
            streams[d].wait_event(start)
            with torch.cuda.stream(streams[d]):
                evs = []
                for _ in range(count):
                    bufs[d].copy(d, chunk)
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record()
                    evs.append(ev)
                copy_ends[d] = evs
        cs, ce = gemms(reps)
        torch.cuda.synchronize(device)
        t_with = cs.elapsed_time(ce) / 1e3
        t_cend = start.elapsed_time(ce) / 1e3
        row = {"compute_with_copies_s": t_with, "compute_slowdown": t_with / t_alone - 1.0,
               "copies_outlasted_compute": True}
        for d, evs in copy_ends.items():
            ends = [start.elapsed_time(ev) / 1e3 for ev in evs]
            inside = [t for t in ends if t <= t_cend]
            row["copies_outlasted_compute"] &= ends[-1] >= t_cend
            if inside:
                bw = len(inside) * chunk / inside[-1]
                row[f"{d}_bytes_per_s_under_compute"] = bw
                row[f"{d}_copy_slowdown"] = solo_bw[d] / bw - 1.0
        out[mode] = row
    return out


# ------------------------------------------------------------------------------------------- CPU
def _duplex_cpu(nbytes: int, count: int) -> dict:
    bufs = {d: _Buffers(torch.device("cpu"), nbytes) for d in DIRECTIONS}
    results = []
    for _rep in range(3):
        barrier = threading.Barrier(len(DIRECTIONS) + 1)
        spans: dict[str, tuple[float, float]] = {}

        def worker(d):
            barrier.wait()
            t0 = time.perf_counter()
            for _ in range(count):
                bufs[d].copy(d, nbytes)
            spans[d] = (t0, time.perf_counter())

        ths = [threading.Thread(target=worker, args=(d,), daemon=True) for d in DIRECTIONS]
        for th in ths:
            th.start()
        barrier.wait()
        for th in ths:
            th.join()
        per = {d: count * nbytes / (spans[d][1] - spans[d][0]) for d in DIRECTIONS}
        overall = max(s[1] for s in spans.values()) - min(s[0] for s in spans.values())
        per["total"] = 2 * count * nbytes / overall
        results.append(per)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}  # as `microbench.TIMING_STATISTIC`


def _copy_compute_cpu(dtype: torch.dtype, gemm_n: int, compute_s: float, solo_bw: dict[str, float],
                      chunk: int, trials: int = 3) -> dict:
    """Best of ``trials`` for every mode (the CPU is shared: see `microbench`)."""
    a = torch.randn(gemm_n, gemm_n).to(dtype)
    b = torch.randn(gemm_n, gemm_n).to(dtype)
    c = torch.empty(gemm_n, gemm_n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b, out=c)
    t0 = time.perf_counter()
    for _ in range(3):
        torch.mm(a, b, out=c)
    reps = max(3, math.ceil(compute_s / ((time.perf_counter() - t0) / 3)))

    def run() -> tuple[float, float]:
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=c)
        end = time.perf_counter()
        return t, end

    bufs = {d: _Buffers(torch.device("cpu"), chunk) for d in DIRECTIONS}
    modes = ("d2h", "h2d", "both")
    t_alone = float("inf")
    t_with = {m: float("inf") for m in modes}
    bws: dict[str, dict[str, float]] = {m: {} for m in modes}
    # trials outermost, so that a change in the machine's background load hits every mode alike
    for _trial in range(trials):
        s0, e0 = run()
        t_alone = min(t_alone, e0 - s0)
        for mode in modes:
            dirs = DIRECTIONS if mode == "both" else (mode,)
            stop = threading.Event()
            started = threading.Barrier(len(dirs) + 1)
            ends: dict[str, list[float]] = {d: [] for d in dirs}

            def worker(d, stop=stop, started=started, ends=ends):
                started.wait()
                while not stop.is_set():
                    bufs[d].copy(d, chunk)
                    ends[d].append(time.perf_counter())

            ths = [threading.Thread(target=worker, args=(d,), daemon=True) for d in dirs]
            for th in ths:
                th.start()
            started.wait()
            time.sleep(0.002)  # let the copies get going before the GEMMs start
            cstart, cend = run()
            stop.set()
            for th in ths:
                th.join()
            t_with[mode] = min(t_with[mode], cend - cstart)
            for d in dirs:
                inside = [t for t in ends[d] if cstart <= t <= cend]
                if len(inside) >= 2:
                    bws[mode][d] = max(bws[mode].get(d, 0.0), (len(inside) - 1) * chunk / (inside[-1] - inside[0]))
    out = {"gemm_n": gemm_n, "gemm_repeats": reps, "compute_alone_s": t_alone, "chunk_bytes": chunk,
           "trials": trials}
    for mode in modes:
        row = {"compute_with_copies_s": t_with[mode], "compute_slowdown": t_with[mode] / t_alone - 1.0,
               "copies_outlasted_compute": True}
        for d, bw in bws[mode].items():
            row[f"{d}_bytes_per_s_under_compute"] = bw
            row[f"{d}_copy_slowdown"] = solo_bw[d] / bw - 1.0
        out[mode] = row
    return out


# ------------------------------------------------------------------------------------------ both
def duplex(bench: Bench, nbytes: int, count: int, progress: Progress) -> dict:
    progress.stage("two copies at once (d2h + h2d)", 1)
    r = _duplex_cuda(bench.device, nbytes, count) if bench.cuda else _duplex_cpu(nbytes, count)
    r["bytes"], r["count"] = nbytes, count
    progress.step(f"{count} x {nbytes / 2**20:.0f} MiB each way: d2h {r['d2h'] / 1e9:.2f} GB/s, "
                  f"h2d {r['h2d'] / 1e9:.2f} GB/s, sum {r['total'] / 1e9:.2f} GB/s")
    return r


def copy_compute(bench: Bench, dtype: torch.dtype, gemm_n: int, compute_s: float, solo_bw: dict[str, float],
                 chunk: int, progress: Progress) -> dict:
    progress.stage("copies while compute runs (GEMM loop + copy streams)", 3)
    if bench.cuda:
        r = _copy_compute_cuda(bench.device, dtype, gemm_n, compute_s, solo_bw, chunk)
    else:
        r = _copy_compute_cpu(dtype, gemm_n, compute_s, solo_bw, chunk)
    for mode in ("d2h", "h2d", "both"):
        row = r[mode]
        copies = ", ".join(f"{d} {row[f'{d}_bytes_per_s_under_compute'] / 1e9:.2f} GB/s"
                           for d in DIRECTIONS if f"{d}_bytes_per_s_under_compute" in row)
        progress.step(f"{mode}: GEMMs {row['compute_slowdown'] * 100:+.1f}% slower; copies under compute: "
                      f"{copies or 'none finished'}")
        if not row["copies_outlasted_compute"]:
            progress.note(f"warning: the {mode} copies ended before the GEMM loop; its slowdown is underestimated")
    return r
