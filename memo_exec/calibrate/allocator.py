"""What PyTorch's caching allocator pays the device: the profile's ``gpu.allocator`` section.

A reorganisation (PyTorch's cache flush and retry) synchronises the device, cudaFrees every
cached unsplit segment and cudaMallocs again. `memo_sim.memplan.iteration_replay` counts those
calls; this module measures what each costs on the GPU at hand (CUDA only):

- ``sync``: ``torch.cuda.synchronize()`` on an idle device, wall clock (``perf_counter``),
  median of `SYNC_REPEATS` calls. The launch-queue refill after a real reorganisation is not
  in it.
- cudaMalloc: with nothing cached (``torch.cuda.empty_cache()`` first), the wall time of
  ``torch.cuda.caching_allocator_alloc(n)``, which must cudaMalloc one new segment of ``n``
  bytes (checked with ``torch.cuda.memory_stats()``: ``num_device_alloc``, or
  ``segment.all.allocated`` on older torch, grows by exactly one), for sizes of 32 MiB to a few
  GiB (multiples of 2 MiB: PyTorch's large-segment rounding, so the segment is ``n`` bytes).
- cudaFree: the block is handed back (``caching_allocator_delete``: into the cache, no device
  call), then ``torch.cuda.empty_cache()`` is timed, which synchronises and cudaFrees that one
  segment (``num_device_free`` / ``segment.all.freed`` grows by one); the time of an
  ``empty_cache()`` with nothing cached (its own synchronise and bookkeeping) is subtracted.
- Each call's time is fitted as ``latency + bytes / throughput`` by `fit_call_cost` (least
  squares on the relative error; a per-byte cost that the data cannot show is reported as an
  unbounded throughput, `UNBOUNDED_THROUGHPUT`).

With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` the calls are page maps and unmaps,
not cudaMalloc / cudaFree; the measurement says which it measured. On CPU nothing is measured:
there is no caching allocator to price, and the written profile has no ``gpu.allocator``
section, so the simulator uses its assumed defaults (whose sources say so).

`run` returns the raw results (JSON-ready); `profile_fields` turns them into the profile's
``gpu.allocator`` quantities with units and sources; both are pure Python apart from `run`.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from memo_exec.allocator_counters import COUNTERS, counter, not_measured
from memo_sim.errors import MemoError
from memo_exec.calibrate.fit import relative_least_squares
from memo_exec.calibrate.quantities import FlowMap, q_bw, q_time

MiB, GiB = 2**20, 2**30
SYNC_REPEATS = 200
UNBOUNDED_THROUGHPUT = 1e18  # bytes/s: no measurable per-byte cost (1e9 GB/s)
FIELDS = ("sync", "cuda_malloc_latency", "cuda_malloc_throughput", "cuda_free_latency", "cuda_free_throughput")


def sizes_for(quick: bool, free_bytes: int) -> list[int]:
    """Segment sizes to measure: 32 MiB .. 8 GiB (quick: three sizes up to 2 GiB), each a multiple
    of 2 MiB and at most a quarter of the free device memory."""
    want = [32 * MiB, 512 * MiB, 2 * GiB] if quick else [32 * MiB, 128 * MiB, 512 * MiB, 2 * GiB, 8 * GiB]
    cap = max(32 * MiB, (free_bytes // 4) // (2 * MiB) * (2 * MiB))
    return sorted({min(n, cap) for n in want})


# --------------------------------------------------------------------------------------- fitting
def fit_call_cost(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """Fit ``t = latency + size / throughput``; return ``(latency s, throughput bytes/s)``.

    Least squares on the relative error (rows ``[1/t, size/t] . [latency, 1/throughput] = 1``).
    A negative latency is clamped to 0 (throughput refitted through the origin); a per-byte cost
    that comes out <= 1 / `UNBOUNDED_THROUGHPUT` (times that do not grow with size) gives
    `UNBOUNDED_THROUGHPUT` and the latency refitted alone.
    """
    pts = [(float(s), float(t)) for s, t in zip(sizes, times) if s > 0 and t > 0]
    if not pts:
        raise MemoError("cannot fit an allocator call cost: no positive (size, time) point")
    sol = relative_least_squares(pts)
    if sol is not None and sol[1] > 1.0 / UNBOUNDED_THROUGHPUT:
        lat, per_byte = sol
        if lat >= 0:
            return lat, 1.0 / per_byte
        # through the origin: minimises sum((s / (T t) - 1)^2)
        return 0.0, sum((s / t) ** 2 for s, t in pts) / sum(s / t for s, t in pts)
    # latency alone: minimises sum((L / t - 1)^2)
    return sum(1 / t for s, t in pts) / sum(1 / t ** 2 for s, t in pts), UNBOUNDED_THROUGHPUT


def fit_results(raw: dict) -> dict:
    """The fitted costs from `run`'s rows: ``{sync_s, malloc_latency_s, malloc_throughput, ...}``."""
    rows = raw["rows"]
    sizes = [r["bytes"] for r in rows]
    m_lat, m_tp = fit_call_cost(sizes, [r["malloc_s"] for r in rows])
    f_lat, f_tp = fit_call_cost(sizes, [r["free_s"] for r in rows])
    return {"sync_s": float(raw["sync_s"]), "malloc_latency_s": m_lat, "malloc_throughput": m_tp,
            "free_latency_s": f_lat, "free_throughput": f_tp}


# ------------------------------------------------------------------------------------ measuring
def run(device: Any, quick: bool, progress: Any) -> dict:
    """Measure on a CUDA ``device`` (a ``torch.device``); see the module docs. Never raises for
    a measurement that goes wrong: the result says ``measured: False`` and why."""
    import torch  # noqa: PLC0415

    if getattr(device, "type", "cpu") != "cuda":
        progress.note("allocator calls: not measured on CPU (the profile keeps the simulator's assumed defaults)")
        return not_measured("CPU run: no CUDA caching allocator, no cudaMalloc / cudaFree to time; the profile keeps "
                            "memo's assumed defaults")
    if device.index is None:  # caching_allocator_alloc needs an index: the current device's
        device = torch.device("cuda", torch.cuda.current_device())
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    expandable = "expandable_segments:true" in conf.replace(" ", "").lower()
    try:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free_bytes, _total = torch.cuda.mem_get_info(device)
        sizes = sizes_for(quick, int(free_bytes))
        repeats = 3 if quick else 5
        progress.stage("allocator calls: synchronise, cudaMalloc, cudaFree", 1 + len(sizes))

        def timed(fn) -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        sync = [timed(lambda: torch.cuda.synchronize(device)) for _ in range(SYNC_REPEATS)]
        sync_s = statistics.median(sync)
        progress.step(f"idle synchronise {sync_s * 1e6:.1f} us (median of {SYNC_REPEATS})")
        empty = statistics.median([timed(torch.cuda.empty_cache) for _ in range(20)])

        def one(n: int) -> tuple[float, float, bool]:
            torch.cuda.synchronize(device)
            s0 = torch.cuda.memory_stats(device)
            t0 = time.perf_counter()
            ptr = torch.cuda.caching_allocator_alloc(n, device)
            t1 = time.perf_counter()
            s1 = torch.cuda.memory_stats(device)
            torch.cuda.caching_allocator_delete(ptr)
            torch.cuda.synchronize(device)
            t2 = time.perf_counter()
            torch.cuda.empty_cache()
            t3 = time.perf_counter()
            s2 = torch.cuda.memory_stats(device)
            a = [counter(s, "num_device_alloc", COUNTERS["num_device_alloc"]) for s in (s0, s1)]
            f = [counter(s, "num_device_free", COUNTERS["num_device_free"]) for s in (s1, s2)]
            ok = None not in a + f and a[1] - a[0] == 1 and f[1] - f[0] == 1
            return t1 - t0, max(0.0, (t3 - t2) - empty), ok

        one(sizes[0])  # warm-up: the driver's first large allocation
        rows = []
        for n in sizes:
            samples = [one(n) for _ in range(repeats)]
            if not all(ok for _, _, ok in samples):
                return not_measured(f"torch.cuda.memory_stats() did not show exactly one device allocation and one "
                                    f"free per call at {n} bytes (allocator settings {conf or 'default'})")
            row = {"bytes": n, "repeats": repeats,
                   "malloc_s": statistics.median(s[0] for s in samples),
                   "free_s": statistics.median(s[1] for s in samples)}
            rows.append(row)
            progress.step(f"{n / MiB:.0f} MiB: cudaMalloc {row['malloc_s'] * 1e6:.0f} us, cudaFree "
                          f"{row['free_s'] * 1e6:.0f} us")
    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # pragma: no cover - needs a GPU
        return not_measured(f"allocator measurement failed ({str(e).splitlines()[0]})")
    out = {"measured": True, "sync_s": sync_s, "sync_samples": len(sync), "empty_cache_overhead_s": empty,
           "rows": rows, "alloc_conf": conf, "expandable_segments": expandable,
           "method": ("wall time of torch.cuda.caching_allocator_alloc(n) after torch.cuda.empty_cache() (one new "
                      "segment per call, checked with torch.cuda.memory_stats), and of torch.cuda.empty_cache() "
                      "freeing that one segment minus an empty empty_cache(); torch.cuda.synchronize() on an idle "
                      "device")}
    out["fit"] = fit_results(out)
    progress.note("  fit: sync {:.1f} us, cudaMalloc {:.1f} us + {:.3g} GB/s, cudaFree {:.1f} us + {:.3g} GB/s".format(
        out["fit"]["sync_s"] * 1e6, out["fit"]["malloc_latency_s"] * 1e6, out["fit"]["malloc_throughput"] / 1e9,
        out["fit"]["free_latency_s"] * 1e6, out["fit"]["free_throughput"] / 1e9))
    return out


# ------------------------------------------------------------------------------- profile fields
def profile_fields(r: dict, at: str, base: Any = None) -> tuple[dict | None, list[str], list[str]]:
    """``(gpu.allocator mapping or None, measured field names, not-measured field notes)`` from a
    calibration run's results ``r`` (`memo_exec.calibrate.suite.run_suite`).

    Measured: the fitted values with ``measured: ...`` sources. CUDA but not measured: the base
    profile's section (its sources quoted) when it has one. Otherwise (CPU, or nothing to take):
    None, and the loader's assumed defaults apply.
    """
    res = r.get("allocator") or not_measured("the calibration run did not measure the allocator")
    cuda = r["env"]["device_kind"] == "cuda"
    if res.get("measured"):
        fit = res["fit"]
        rows = res["rows"]
        kind = "page map/unmap (expandable segments)" if res.get("expandable_segments") else "cudaMalloc/cudaFree"
        sizes = f"{rows[0]['bytes'] // MiB}..{rows[-1]['bytes'] // MiB} MiB"
        conf = f", PYTORCH_CUDA_ALLOC_CONF={res['alloc_conf']!r}" if res.get("alloc_conf") else ""

        def call_src(call: str, what: str) -> str:
            return (f"measured: {what} of {kind} calls from {call} for one segment of {sizes} (median of "
                    f"{rows[0]['repeats']} per size), fitted as latency + bytes / throughput{conf}, {at}")

        def tp(v: float, src: str) -> FlowMap:
            if v >= UNBOUNDED_THROUGHPUT:
                src += "; no per-byte cost measurable: unbounded"
            return q_bw(v, src)

        fields = {
            "sync": q_time(fit["sync_s"], f"measured: torch.cuda.synchronize() on an idle device, wall clock, median "
                                          f"of {res['sync_samples']} calls (the launch-queue refill after a "
                                          f"reorganisation is not included), {at}"),
            "cuda_malloc_latency": q_time(fit["malloc_latency_s"], call_src("torch.cuda.caching_allocator_alloc",
                                                                            "fixed part")),
            "cuda_malloc_throughput": tp(fit["malloc_throughput"], call_src("torch.cuda.caching_allocator_alloc",
                                                                            "bytes per second")),
            "cuda_free_latency": q_time(fit["free_latency_s"], call_src("torch.cuda.empty_cache", "fixed part")),
            "cuda_free_throughput": tp(fit["free_throughput"], call_src("torch.cuda.empty_cache", "bytes per second")),
        }
        return fields, [f"gpu.allocator.{k}" for k in FIELDS], []
    if cuda and base is not None:
        node = (base.raw.get("gpu") or {}).get("allocator")
        if isinstance(node, dict) and all(k in node for k in FIELDS):
            why = f"not measured ({res.get('reason', 'unknown')})"
            return ({k: base.quantity(f"gpu.allocator.{k}", why) for k in FIELDS}, [],
                    ["gpu.allocator"])
    why = "CPU run" if not cuda else f"not measured: {res.get('reason', 'unknown')}"
    return None, [], [f"gpu.allocator ({why}; the simulator's assumed defaults)"]


def summary(r: dict) -> dict | str:
    """The allocator measurements for the profile's provenance."""
    res = r.get("allocator") or {}
    if not res.get("measured"):
        return f"not measured: {res.get('reason', 'not run')}"
    fit = res["fit"]
    return {"sync_us": round(fit["sync_s"] * 1e6, 2),
            "cuda_malloc": {"latency_us": round(fit["malloc_latency_s"] * 1e6, 2),
                            "throughput_gb_s": float(f"{fit['malloc_throughput'] / 1e9:.4g}")},
            "cuda_free": {"latency_us": round(fit["free_latency_s"] * 1e6, 2),
                          "throughput_gb_s": float(f"{fit['free_throughput'] / 1e9:.4g}")},
            "rows": [{"bytes": row["bytes"], "malloc_us": round(row["malloc_s"] * 1e6, 1),
                      "free_us": round(row["free_s"] * 1e6, 1)} for row in res["rows"]]}
