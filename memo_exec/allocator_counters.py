"""PyTorch's caching allocator as ``torch.cuda.memory_stats()`` reports it, in the simulator's words.

`memo_sim.memplan.replay_result.IterationReplay.memory_stats` gives a replayed iteration's counters
and peaks under ``torch.cuda.memory_stats()``'s keys (`KEYS`); this module reads the same keys on a
CUDA device, over one training iteration: the event counters as differences between the
iteration's start and its end (`COUNTERS`: PyTorch counts from the process start), the peaks after
``torch.cuda.reset_peak_memory_stats`` at the iteration's start (`PEAKS`), and the segments held
at its end (``segment.all.current``; ``segment.all.peak``, the most held during the iteration, is
kept beside them). A run's ``allocator`` block (`run_block`) reports its last step (the steadiest)
and every step, the ``PYTORCH_CUDA_ALLOC_CONF`` in effect and, once at the end, the segments of
``torch.cuda.memory._snapshot()`` (a private API: where it fails the block says why). On CPU
nothing is measured (`not_measured`: the block says why).

Older torch names the device allocation counters ``segment.all.allocated`` / ``segment.all.freed``
instead of ``num_device_alloc`` / ``num_device_free`` (`counter` reads either). Pure Python apart
from the functions that take a ``torch.device``, which import torch when called.
"""

from __future__ import annotations

import os
from typing import Any

# key -> the older torch's key for the same count (None: no other name)
COUNTERS = {"num_alloc_retries": None, "num_ooms": None, "num_device_alloc": "segment.all.allocated",
            "num_device_free": "segment.all.freed"}
PEAKS = ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "segment.all.peak")
SEGMENTS = "segment.all.current"
KEYS = (*COUNTERS, *PEAKS, SEGMENTS)  # one iteration's `iteration_stats`, in this order
CPU_REASON = ("CPU run: there is no CUDA caching allocator, so torch.cuda.memory_stats() has nothing to count "
              "(the process RSS is measured instead)")


def not_measured(reason: str) -> dict:
    return {"measured": False, "reason": reason}


def counter(stats: dict, new: str, old: str | None = None) -> int | None:
    """``stats[new]``, else ``stats[old]`` (older torch's name), as an int; None where neither is."""
    v = stats.get(new, stats.get(old) if old else None)
    return int(v) if v is not None else None


def iteration_stats(start: dict, end: dict) -> dict[str, int | None]:
    """One iteration's `KEYS` from ``torch.cuda.memory_stats()`` at its start (just after
    ``reset_peak_memory_stats``) and at its end: counters as differences, peaks and segments as
    read at the end (None where this torch has no such key)."""
    out: dict[str, int | None] = {}
    for key, old in COUNTERS.items():
        a, b = counter(start, key, old), counter(end, key, old)
        out[key] = b - a if a is not None and b is not None else None
    for key in (*PEAKS, SEGMENTS):
        out[key] = counter(end, key)
    return out


def alloc_conf() -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` in effect ("" where unset: PyTorch's defaults)."""
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def memory_stats(device: Any) -> dict:
    import torch  # noqa: PLC0415

    return torch.cuda.memory_stats(device)


def snapshot_segments() -> tuple[int | None, str | None]:
    """(segments in ``torch.cuda.memory._snapshot()``, None) or (None, why it could not be read)."""
    try:
        import torch  # noqa: PLC0415

        return len(torch.cuda.memory._snapshot()["segments"]), None
    except Exception as e:  # noqa: BLE001 - a private API: any failure only loses this one number
        return None, f"torch.cuda.memory._snapshot() failed: {type(e).__name__}: {e}"


def run_block(device: Any, steps: list[tuple[int, dict | None]]) -> dict:
    """The measured document's ``allocator`` block of a run on ``device`` whose steps measured
    ``steps`` ((step, `iteration_stats` or None) each)."""
    if getattr(device, "type", "cpu") != "cuda":
        return not_measured(CPU_REASON)
    per = [{"step": k, **st} for k, st in steps if st is not None]
    if not per:
        return not_measured("no step was measured")
    n, why = snapshot_segments()
    last = per[-1]
    return {"measured": True, "step": last["step"], "memory_stats": {k: last[k] for k in KEYS}, "per_step": per,
            "alloc_conf": alloc_conf(), "snapshot_segments": n, "snapshot_error": why,
            "method": "torch.cuda.memory_stats() at the step's start (after torch.cuda.reset_peak_memory_stats) and "
                      "after its end's synchronise: counters as differences, peaks and segment.all.current at the "
                      "end; memory_stats is the last step's; snapshot_segments once after the last step"}
