"""What a replay of the caching allocator over training iterations reports (`IterationReplay`), and
the seconds its allocator calls stall the compute stream (`memo_sim.memplan.iteration_replay`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from memo_sim.memplan.caching_allocator import OomEvent
from memo_sim.profile.schema import AllocatorCosts, HardwareProfile


@dataclass
class IterationReplay:
    """The caching allocator over a steady-state training iteration of one GPU.

    ``iterations`` were replayed back to back and the last is reported (``steady``: it left the
    cache as it found it, so every later iteration repeats it). Bytes are per GPU.
    ``peak_reserved_bytes`` includes the segments cached by earlier iterations;
    ``fragmentation_at_peak`` = 1 - allocated / reserved at the moment allocated bytes peak in
    the reported iteration. Counts (reorganisations, cudaMalloc / cudaFree calls and their bytes,
    fragmentation failures) are the reported iteration's; ``warmup`` holds the earlier ones'
    together. ``reorganization_requests`` names the requests that triggered a reorganisation.
    On OOM the replay stops: ``oom_iteration`` (0-based; -1: the static requests, model states
    and the policy's static buffers, do not fit) and ``oom_event`` say where (the OOM request is
    ``oom_request``); the counts are those of the failing iteration up to there. Where ``steady`` is False the
    reported iteration is the last of ``iterations`` and need not be what every iteration does:
    ``reorganizations_by_iteration`` and `steadiness` say so (`to_json_obj` carries ``steadiness`` too).
    """

    name: str
    policy: str
    capacity_bytes: int
    iterations: int
    steady: bool
    requests_per_iteration: int  # mallocs
    static_bytes: int  # model states and the policy's static buffers
    max_live_bytes: int  # the most bytes live at once (static included): the bound for any allocator
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    reserved_at_peak_allocated_bytes: int
    fragmentation_at_peak: float
    reorganizations: int
    reorganization_requests: list[str]
    cuda_mallocs: int
    cuda_malloc_bytes: int
    cuda_frees: int
    cuda_free_bytes: int
    reorganization_cuda_frees: int
    fragmentation_failures: int
    phase_counts: dict  # phase name -> its counts (reorganizations, cuda_free(_bytes), cuda_malloc(_bytes))
    warmup: dict  # counters of the iterations before the reported one, summed
    oom: bool
    oom_iteration: int | None
    oom_event: OomEvent | None
    expandable_segments: bool = False
    max_split_size_bytes: int | None = None
    stream_lag_phases: int = 0
    static_memory_plan: bool = False  # the policy has one: these numbers do not apply to it
    series_reserved_bytes: list[int] = field(default_factory=list)  # per request, reported iteration
    series_allocated_bytes: list[int] = field(default_factory=list)
    segments: int = 0  # segments held at the reported iteration's end (an expandable one counts once)
    # allocation retries of every replayed iteration, first to last (the reported one last): where ``steady`` is
    # False they show how the iterations differ (a review: a 672K plan's retries alternated 39/40 and the replay
    # showed one iteration's as if every iteration repeated it)
    reorganizations_by_iteration: list[int] = field(default_factory=list)

    def steadiness(self) -> str:
        """The replay's steady state in words: '' where the reported iteration repeats (``steady``) or the replay
        ran out of memory, else how many iterations were replayed without one repeating and their retries."""
        if self.steady or self.oom:
            return ""
        by_it = ", ".join(map(str, self.reorganizations_by_iteration))
        return (f"not steady: none of the {self.iterations} iterations replayed left the cache as it found it, so "
                f"later iterations may differ from the reported last one"
                + (f" (allocation retries per iteration: {by_it})" if by_it else ""))

    def memory_stats(self) -> dict[str, int]:
        """The reported iteration's counters and peaks under the keys of PyTorch's
        ``torch.cuda.memory_stats()``, so a measured run compares key by key: ``num_alloc_retries``
        (reorganisations: cached segments freed and the cudaMalloc retried), ``num_ooms``,
        ``num_device_alloc`` / ``num_device_free`` (cudaMalloc / cudaFree calls, page maps and unmaps
        with expandable segments), ``reserved_bytes.all.peak``, ``allocated_bytes.all.peak`` and
        ``segment.all.current`` (segments held at the iteration's end).
        PyTorch counts from the process start: compare the difference over one iteration with the
        counters, and the peaks after `reset_peak_memory_stats` at the iteration's start."""
        return {"num_alloc_retries": self.reorganizations, "num_ooms": int(self.oom),
                "num_device_alloc": self.cuda_mallocs, "num_device_free": self.cuda_frees,
                "reserved_bytes.all.peak": self.peak_reserved_bytes,
                "allocated_bytes.all.peak": self.peak_allocated_bytes,
                "segment.all.current": self.segments}

    @property
    def oom_request(self) -> str | None:
        return self.oom_event.buffer_id if self.oom_event is not None else None

    def stall_breakdown(self, profile: HardwareProfile | AllocatorCosts) -> dict[str, float]:
        """Seconds the reported iteration's allocator calls stall the compute stream, by kind:
        one device synchronise per reorganisation, every cudaFree and every cudaMalloc (in a
        steady state all of them follow from reorganisations: the segments a flush released are
        cudaMalloc'd again later in the iteration)."""
        costs = profile.gpu.allocator if isinstance(profile, HardwareProfile) else profile
        out = {
            "sync_s": self.reorganizations * float(costs.sync),
            "cuda_free_s": costs.free_seconds(self.cuda_frees, self.cuda_free_bytes),
            "cuda_malloc_s": costs.malloc_seconds(self.cuda_mallocs, self.cuda_malloc_bytes),
        }
        out["total_s"] = out["sync_s"] + out["cuda_free_s"] + out["cuda_malloc_s"]
        return out

    def stall_by_phase(self, profile: HardwareProfile | AllocatorCosts) -> dict[str, float]:
        """`stall_seconds` split by the phase whose requests made the calls (``L<i>.fwd``,
        ``L<i>.bwd``, ``classifier``, ...; phases without a call are left out): where an event
        simulator puts the stall on the compute stream. The values add up to `stall_seconds`."""
        costs = profile.gpu.allocator if isinstance(profile, HardwareProfile) else profile
        return {name: (c["reorganizations"] * float(costs.sync)
                       + costs.free_seconds(c["cuda_free"], c["cuda_free_bytes"])
                       + costs.malloc_seconds(c["cuda_malloc"], c["cuda_malloc_bytes"]))
                for name, c in self.phase_counts.items()}

    def stall_seconds(self, profile: HardwareProfile | AllocatorCosts) -> float:
        """Seconds per iteration the compute stream waits for the allocator (`stall_breakdown`)."""
        return self.stall_breakdown(profile)["total_s"]

    def to_json_obj(self) -> dict:
        d = asdict(self)
        d["oom_request"] = self.oom_request
        d["steadiness"] = self.steadiness()
        return d
