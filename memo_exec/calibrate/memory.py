"""Memory capacities and pinned-allocation rounding.

- GPU capacity: ``torch.cuda.mem_get_info`` (total); memory the device uses outside PyTorch's
  caching allocator (CUDA context, library handles) = total - free - reserved-by-torch, taken
  after the kernels have run so that cuBLAS / cuDNN handles exist.
- Host capacity: ``MemTotal`` / ``MemAvailable`` from /proc/meminfo.
- Pinned rounding (CUDA): allocate pinned tensors of sizes that are neither powers of two nor
  page multiples with ``torch.empty(..., pin_memory=True)`` and read what the pinned host
  allocator took (``torch.cuda.host_memory_stats()['allocated_bytes.current']``): equal to the next
  power of two -> ``power_of_two``, to the next 4 KiB page -> ``page``, to the request -> ``none``.
- Host allocation rounding (CPU, where "pinned" buffers are plain tensors): allocate and touch
  tensors of such sizes and read the growth of the process's resident set.
"""

from __future__ import annotations

import math
import os
import statistics

import torch

from memo_exec.device import DeviceSpec, device_free_bytes, process_rss_bytes
from memo_sim.units import PAGE_BYTES

# neither powers of two nor page multiples; next power of two adds 20-60 %
PROBE_SIZES = (3 * 2**20 + 123, 5 * 2**20 + 4097, 11 * 2**20 + 1, 25 * 2**20 + 999)


def host_memory() -> tuple[int, int]:
    """(total, available) host bytes."""
    avail, total = device_free_bytes(DeviceSpec("cpu"))
    return int(total), int(avail)


def gpu_memory(device: torch.device) -> dict:
    free, total = torch.cuda.mem_get_info(device)
    reserved_by_torch = torch.cuda.memory_reserved(device)
    return {"total": int(total), "free": int(free), "torch_reserved": int(reserved_by_torch),
            "outside_torch": int(total - free - reserved_by_torch)}


def _classify(requested: list[int], taken: list[int]) -> tuple[str, str]:
    models = {
        "power_of_two": [2 ** math.ceil(math.log2(n)) for n in requested],
        "page": [math.ceil(n / PAGE_BYTES) * PAGE_BYTES for n in requested],
        "none": list(requested),
    }
    # median relative error of each model: exact for the allocator's rule; RSS readings have pages of
    # slack and an occasional outlier (another thread's allocation, an arena growing)
    err = {k: statistics.median(abs(t - m) / m for t, m in zip(taken, v)) for k, v in models.items()}
    best = min(err, key=err.get)
    if best in ("page", "none") and err["page"] < 0.02 and err["none"] < 0.02:
        # page vs none cannot be told apart from RSS (<= 4 KiB per allocation); the simulator's
        # difference is as small, report the plainer one
        best = "none" if err["none"] <= err["page"] else "page"
    return best, ", ".join(f"{n} B -> {t} B" for n, t in zip(requested, taken))


def probe_pinned_rounding(device: torch.device) -> dict:
    """Measured rounding of PyTorch's pinned host allocator (CUDA only)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return {"measured": False, "reason": f"torch {torch.__version__} has no torch.cuda.host_memory_stats"}
    key = "allocated_bytes.current"
    keep, taken = [], []
    for empty in (getattr(getattr(torch, "accelerator", None), "empty_host_cache", None),
                  getattr(torch._C, "_host_emptyCache", None)):
        if empty is not None:
            try:
                empty()
            except RuntimeError:
                continue
            break
    try:
        for n in PROBE_SIZES:
            before = int(stats().get(key, 0))
            keep.append(torch.empty(n, dtype=torch.uint8, pin_memory=True))
            after = int(stats().get(key, 0))
            taken.append(after - before)
    except RuntimeError as e:
        return {"measured": False, "reason": f"pinned allocation failed ({str(e).splitlines()[0]})"}
    finally:
        del keep
    # a request served from a block cached earlier in this process does not grow the pool
    pairs = [(n, t) for n, t in zip(PROBE_SIZES, taken) if t > 0]
    if not pairs:
        return {"measured": False, "reason": "torch.cuda.host_memory_stats() did not change"}
    mode, detail = _classify([n for n, _ in pairs], [t for _, t in pairs])
    return {"measured": True, "mode": mode, "detail": detail,
            "method": "torch.empty(n, pin_memory=True) and torch.cuda.host_memory_stats()['allocated_bytes.current']"}


def probe_host_rounding() -> dict:
    """Measured rounding of plain host tensors (the CPU executor's host buffers) from RSS growth."""
    warm = torch.empty(2**20, dtype=torch.uint8)
    warm.fill_(1)  # the first fill starts the thread pool, which grows the RSS by itself
    keep, taken = [warm], []
    for n in PROBE_SIZES:
        before = process_rss_bytes()[0]
        t = torch.empty(n, dtype=torch.uint8)
        t.fill_(1)  # touch every page
        after = process_rss_bytes()[0]
        keep.append(t)
        taken.append(after - before)
    del keep
    if any(t <= 0 for t in taken):
        return {"measured": False, "reason": "the resident set did not grow with the allocations (/proc unavailable?)"}
    mode, detail = _classify(list(PROBE_SIZES), taken)
    return {"measured": True, "mode": mode, "detail": detail,
            "method": "torch.empty(n).fill_(1) and the growth of VmRSS (/proc/self/status)"}


def framework_rss() -> int:
    """Resident set of this process now (torch imported, before the benchmarks allocate)."""
    return int(process_rss_bytes()[0])


def default_cpu_budget(host_total: int, ranks: int = 1) -> int:
    """A CPU rank's device budget: at most 8 GiB, and the ``ranks`` executor ranks of the machine together at most
    half of its RAM."""
    return int(min(8 * 2**30, host_total // (2 * ranks)))


def hostname() -> str:
    try:
        return os.uname().nodename
    except AttributeError:  # pragma: no cover - non-POSIX
        import socket  # noqa: PLC0415

        return socket.gethostname()
