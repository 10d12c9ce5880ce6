"""Measurement: per-op, per-stream start/end, memory over time, per-step summaries.

CUDA: every span is a pair of timing events on the stream it ran on (compute ops on the current
stream, copy groups on the offload / prefetch streams, stalls as events around a
``wait_event``, which therefore measure how long the compute stream sat idle); they are
resolved against the step's start event after the step synchronises. Memory: allocated bytes
from the caching allocator at layer boundaries, peak allocated / reserved per step, and the
allocator's counters over each step (`memo_exec.allocator_counters`).
CPU: host ``perf_counter`` on the calling thread and inside the copy worker threads; memory is
the process resident set (VmRSS, peak VmHWM reset each step), which counts everything the
process holds, not just tensors.

Everything becomes a `memo_sim.timeline.Timeline` (meta source = "measured") in the same format
the simulator writes. The recorder also keeps the step's issue order (`memo_exec.streams.Issued`):
every compute op as its span opens, and every copy, event record and wait as the streams issue
them, which `tests.exec_op_order` turns into dependency edges.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from memo_exec.allocator_counters import iteration_stats, memory_stats
from memo_exec.device import process_rss_bytes, process_rss_now, reset_process_peak_rss
from memo_exec.streams import CopyLabel, Issued
from memo_sim.timeline import MemorySample, Timeline, TimelineEvent

STALL_OPS = ("wait_offload", "wait_prefetch")


@dataclass
class StepRecord:
    step: int
    iteration_s: float
    events: list[TimelineEvent]
    memory: list[MemorySample]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    loss: float = float("nan")
    issued: list[Issued] = field(default_factory=list)  # issue order of compute ops, copies, records, waits
    allocator: dict | None = None  # CUDA: `memo_exec.allocator_counters.iteration_stats` of the step


class Recorder:
    """Collects spans during one step; ``end_step`` turns them into a `StepRecord`."""

    def __init__(self, device: torch.device, flops_fn: Callable[[str, int | None, str], float] | None = None,
                 host_bytes: int = 0, rank: int = 0) -> None:
        self.device = device
        self.rank = rank  # the Timeline device index of everything recorded here
        self.cuda = device.type == "cuda"
        self.flops_fn = flops_fn
        self.host_bytes = host_bytes
        self._lock = threading.Lock()
        self._spans: list = []
        self._mem: list = []
        self._issued: list[Issued] = []
        self._step = -1
        self._t0 = None
        self._stats0: dict = {}  # CUDA: torch.cuda.memory_stats() at the step's start

    # ------------------------------------------------------------------ step
    def begin_step(self, step: int) -> None:
        self._step = step
        self._spans, self._mem, self._issued = [], [], []
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._stats0 = memory_stats(self.device)
            self._t0 = torch.cuda.Event(enable_timing=True)
            self._t0.record(torch.cuda.current_stream(self.device))
        else:
            reset_process_peak_rss()
            self._t0 = time.perf_counter()
        self.memory_sample()

    def end_step(self, engine) -> StepRecord:
        self.memory_sample()
        if self.cuda:
            t_end = torch.cuda.Event(enable_timing=True)
            t_end.record(torch.cuda.current_stream(self.device))
            engine.synchronize()
            t0 = self._t0
            conv = lambda ev: t0.elapsed_time(ev) / 1e3  # noqa: E731
            iteration = conv(t_end)
            peak_alloc = int(torch.cuda.max_memory_allocated(self.device))
            peak_res = int(torch.cuda.max_memory_reserved(self.device))
            alloc = iteration_stats(self._stats0, memory_stats(self.device))
        else:
            engine.synchronize()
            t_end = time.perf_counter()
            t0 = self._t0
            conv = lambda t: t - t0  # noqa: E731
            iteration = t_end - t0
            _, peak_alloc = process_rss_bytes()
            peak_res = peak_alloc
            alloc = None
        events = []
        with self._lock:
            spans, mem = list(self._spans), list(self._mem)
        for op, layer, phase, stream, s, e, nb, fl in spans:
            events.append(TimelineEvent(op=op, layer=layer, phase=phase, stream=stream, device=self.rank,
                                        start=conv(s), end=conv(e), nbytes=float(nb), flops=float(fl)))
        events.sort(key=lambda ev: (ev.start, ev.stream))
        memory = [MemorySample(time=conv(t), device=self.rank, kind="gpu", nbytes=float(v)) for t, v in mem]
        memory += [MemorySample(time=0.0, device=-1, kind="host", nbytes=float(self.host_bytes)),
                   MemorySample(time=iteration, device=-1, kind="host", nbytes=float(self.host_bytes))]
        memory.sort(key=lambda m: (m.kind, m.time))
        return StepRecord(self._step, iteration, events, memory, peak_alloc, peak_res, issued=list(self._issued),
                          allocator=alloc)

    # ------------------------------------------------------------------ spans
    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    @contextlib.contextmanager
    def span(self, op: str, layer: int | None, phase: str, stream: str = "compute", nbytes: float = 0,
             flops: float | None = None):
        if phase != "stall":  # a stall is a wait, which the stream reports itself
            self._issued.append(Issued(stream, "op", op, layer, phase))
        s = self._mark()
        try:
            yield
        finally:
            e = self._mark()
            fl = flops if flops is not None else (self.flops_fn(op, layer, phase) if self.flops_fn else 0.0)
            with self._lock:
                self._spans.append((op, layer, phase, stream, s, e, nbytes, fl))

    def issued(self, entry: Issued) -> None:
        """Called by the streams, on the issuing thread, for every copy, record and wait."""
        self._issued.append(entry)

    def add_copy(self, stream: str, label: CopyLabel, start, end) -> None:
        with self._lock:
            self._spans.append((label.op, label.layer, label.phase, stream, start, end, label.nbytes, 0.0))

    def memory_sample(self) -> None:
        if self.cuda:
            v = torch.cuda.memory_allocated(self.device)
        else:
            v = process_rss_now()
        t = self._mark()
        with self._lock:
            self._mem.append((t, v))


# --------------------------------------------------------------------------------------------------
# summaries
# --------------------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize_step(rec: StepRecord, layers: int, micro_batches: int = 1) -> dict:
    """Per-layer means of forward / backward / recompute compute time, copy durations, stalls. A layer's
    times are one micro-batch's, as the plan's ``layer_timings_s`` are: a step of ``micro_batches``
    micro-batches (gradient accumulation, a pipeline) runs each layer that many times, summed, then divided."""
    ev = rec.events
    per: dict[str, dict[int, float]] = {k: {} for k in ("fwd", "bwd", "recompute", "offload", "prefetch")}
    for e in ev:
        if e.layer is None:
            continue
        if e.stream == "compute" and e.phase in ("fwd", "bwd", "recompute") and e.op != "input_copy":
            per[e.phase][e.layer] = per[e.phase].get(e.layer, 0.0) + e.duration / micro_batches
        elif e.stream in ("d2h", "h2d"):
            per[e.phase][e.layer] = per[e.phase].get(e.layer, 0.0) + e.duration / micro_batches
    stalls = [e for e in ev if e.op in STALL_OPS]
    by_stream = {}
    for e in ev:
        by_stream[e.stream] = by_stream.get(e.stream, 0.0) + e.duration
    other = {}
    for e in ev:
        if e.layer is None and e.stream == "compute":
            other[e.op] = other.get(e.op, 0.0) + e.duration
    return {
        "iteration_s": rec.iteration_s,
        "layer_forward_s": _mean(list(per["fwd"].values())),
        "layer_backward_s": _mean(list(per["bwd"].values())),
        "layer_recompute_s": _mean(list(per["recompute"].values())),
        "layer_offload_s": _mean(list(per["offload"].values())),
        "layer_prefetch_s": _mean(list(per["prefetch"].values())),
        "layers_recomputed": len(per["recompute"]),
        "layers_offloaded": len(per["offload"]),
        "exposed_copy_s": sum(e.duration for e in stalls),
        "exposed_offload_s": sum(e.duration for e in stalls if e.op == "wait_offload"),
        "exposed_prefetch_s": sum(e.duration for e in stalls if e.op == "wait_prefetch"),
        "stream_busy_s": by_stream,
        "non_layer_s": other,
        "per_layer": {k: {str(i): v for i, v in sorted(d.items())} for k, d in per.items()},
        "peak_allocated_bytes": rec.peak_allocated_bytes,
        "peak_reserved_bytes": rec.peak_reserved_bytes,
        "loss": rec.loss,
    }


def steady_value(values: list[float]) -> float:
    """The steady-state value of a time measured once per step: the median over the steps
    after the warm-up. A step that lost its cores to another process for a while (the CPU and the
    host are shared) moves a mean by its whole delay and a median not at all, so every measured
    time the executor compares with a prediction is this one statistic (peak memory is not: `steady_state` takes
    its maximum, `STEADY_STATE_WORDS`)."""
    return statistics.median(values)


def steady_steps(items: list) -> list:
    """The steps the steady state is taken over: all but step 0 (the warm-up) when there are more."""
    return items[1:] if len(items) > 1 else items


# what `steady_state` computes, in the words a report's header gives it (a review: report.md said "the median of each
# quantity" where the peak memory is the maximum over the same steps)
STEADY_STATE_WORDS = "the median of each time and the maximum of the peak memory"


def steady_state(summaries: list[dict]) -> dict:
    """`steady_value` (the median) of the time fields over the measured steps (step 0 is a warm-up when there are
    more), and the maximum of the peak-memory fields over the same steps: a peak is the most the run held, which a
    median of the steps' peaks would understate. ``statistic`` and ``peak_statistic`` name the two."""
    use = steady_steps(summaries)
    out: dict = {"steps_averaged": [s["step"] for s in use], "statistic": "median", "peak_statistic": "max"}
    keys = ("iteration_s", "layer_forward_s", "layer_backward_s", "layer_recompute_s", "layer_offload_s",
            "layer_prefetch_s", "exposed_copy_s", "exposed_offload_s", "exposed_prefetch_s")
    for k in keys:
        vals = [s[k] for s in use if s.get(k) is not None]
        out[k] = steady_value(vals) if vals else None
    out["peak_allocated_bytes"] = max(s["peak_allocated_bytes"] for s in use)
    out["peak_reserved_bytes"] = max(s["peak_reserved_bytes"] for s in use)
    return out


def timeline_from_step(rec: StepRecord, meta: dict) -> Timeline:
    return Timeline(events=list(rec.events), memory=list(rec.memory), meta={**meta, "source": "measured",
                                                                              "step": rec.step})


@dataclass
class RunMeasurements:
    steps: list[StepRecord] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)
