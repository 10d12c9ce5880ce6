"""What a caching-allocator replay reports: the out-of-memory event, fragmentation failures,
the report of a whole trace, and the fragmentation measure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from memo_sim.memplan.allocator_config import AllocatorConfig

@dataclass(frozen=True)
class OomEvent:
    """The request the allocator could not serve, even after freeing its cache.

    ``available_bytes`` is the device memory left to the allocator (capacity minus reserved)
    after the reorganisation; ``cached_free_bytes`` is reserved minus allocated then (memory
    held in split segments that could not be released); ``largest_free_block_bytes`` is the
    largest cached free block of the request's pool.
    """

    buffer_id: str
    step: int
    requested_bytes: int
    rounded_bytes: int
    alloc_size_bytes: int
    pool: str
    available_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    cached_free_bytes: int
    largest_free_block_bytes: int


@dataclass(frozen=True)
class FragmentationFailure:
    """A request no cached block fitted although its pool's free cached bytes sufficed."""

    buffer_id: str
    step: int
    rounded_bytes: int
    pool: str
    pool_free_bytes: int
    largest_free_block_bytes: int


class AllocatorOutOfMemory(Exception):
    """Raised by :meth:`CachingAllocatorModel.malloc` when a request cannot be served."""

    def __init__(self, event: OomEvent) -> None:
        super().__init__(
            f"CUDA out of memory (model): buffer {event.buffer_id!r} at step {event.step} needs "
            f"{event.alloc_size_bytes} B, {event.available_bytes} B available"
        )
        self.event = event


@dataclass
class AllocatorReport:
    """Outcome of replaying a trace through the caching-allocator model.

    ``peak_reserved_unallocated_bytes`` is the largest reserved-minus-allocated right after a
    request is served or fails (cache left idle after the last frees is not counted).
    ``series_*`` are parallel lists, one entry per step at which something happened, holding
    reserved and allocated bytes after that step's frees and allocations (a step plot).
    """

    config: AllocatorConfig
    trace_name: str
    num_requests: int
    num_served: int
    max_live_bytes: int
    peak_requested_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    allocated_at_peak_reserved_bytes: int
    step_at_peak_reserved: int | None
    fragmentation_at_peak: float
    peak_reserved_unallocated_bytes: int
    fragmentation_failures: int
    worst_fragmentation_failure: FragmentationFailure | None
    num_cuda_malloc: int
    num_cuda_free: int
    num_reorganizations: int
    reorganization_steps: list[int]
    num_oversize_releases: int
    peak_segments: int
    final_reserved_bytes: int
    final_allocated_bytes: int
    oom: bool
    oom_event: OomEvent | None
    series_steps: list[int] = field(default_factory=list)
    series_reserved_bytes: list[int] = field(default_factory=list)
    series_allocated_bytes: list[int] = field(default_factory=list)

    def to_json_obj(self) -> dict:
        """A JSON-ready dict (plain ints, floats, strings, lists, dicts and None)."""
        return asdict(self)


def fragmentation(allocated: int, reserved: int) -> float:
    """The share of reserved bytes not allocated: 1 - allocated / reserved (0 with nothing reserved)."""
    return 1.0 - allocated / reserved if reserved else 0.0
