"""A model of PyTorch's CUDA caching allocator that replays a request trace.

The MEMO paper (sections 1, 3.3, 4.2) argues that the caching allocator fragments memory in
long-context training: memory is reserved but cannot serve a request, the allocator then frees
its cache and calls cudaMalloc again (a "reorganisation" that synchronises the device), and it
runs out of memory at lengths a static plan fits. This module replays a
:class:`~memo_sim.request_trace.RequestTrace` through a model of that allocator so the planner
can compare its static plan with what PyTorch would do on the same requests.

Replay order: steps are visited in increasing order; at each step the buffers whose
``upper == step`` are freed, then the buffers whose ``lower == step`` are allocated, both in
trace order. Replay stops at the first out-of-memory (a real training run would crash there).

What the model keeps of ``c10/cuda/CUDACachingAllocator.cpp`` (one device, one stream):

* Size rounding: requests are rounded up to a multiple of ``kMinBlockSize`` = 512 B
  (1 byte -> 512 B).
* Two pools: small (rounded size <= ``kSmallSize`` = 1 MiB) and large. A new small segment is
  ``kSmallBuffer`` = 2 MiB; a large request below ``kMinLargeAlloc`` = 10 MiB gets a
  ``kLargeBuffer`` = 20 MiB segment; larger ones get a segment rounded up to ``kRoundLarge`` =
  2 MiB.
* Best fit: the smallest cached free block of the right pool that fits (ties: lowest address).
  With ``max_split_size_bytes`` set, a request below it never takes a cached block at or above
  it, and a request at or above it only takes a block smaller than ``request + kLargeBuffer``.
* Splitting: the unused tail of the chosen block stays cached if it is >= 512 B (small pool, or
  any pool with expandable segments) or > 1 MiB (large pool, and only for requests below
  ``max_split_size_bytes``); otherwise the whole block is handed out.
* Coalescing: a freed block merges with free neighbours of the same segment.
* New segments from cudaMalloc when no cached block fits. When cudaMalloc would exceed
  ``capacity_bytes``: first (only with ``max_split_size_bytes`` set) free enough cached
  oversize segments and retry; then free every cached, unsplit segment (``release_cached_blocks``,
  counted as one *reorganisation*, as PyTorch's ``num_alloc_retries``) and retry; only then OOM.
* Expandable segments (``expandable_segments=True``): one virtual segment per pool, mapped in
  pages (2 MiB for the small pool and 20 MiB for the large pool, PyTorch's defaults; both are
  configurable). A request that no cached block fits maps pages at the lowest address where
  free and unmapped space together fit it (usually the tail of the segment, merging with the
  free tail block). A reorganisation unmaps every completely free page, so free memory is no
  longer trapped between segments. Page maps and unmaps count as cudaMalloc and cudaFree calls
  (PyTorch's ``num_device_alloc`` / ``num_device_free``).
* ``record_stream``: a block freed while another stream still uses it (``free(...,
  pending_until=t)``) stops counting as allocated but stays out of the cache until its event
  completes (:meth:`CachingAllocatorModel.complete_pending`, driven by the caller's clock) or a
  reorganisation synchronises the device (``synchronize_and_free_events``) and returns it.

What it leaves out: per-stream pools and cross-stream reuse, the garbage-collection threshold
and ``set_per_process_memory_fraction`` (``capacity_bytes`` plays the role of the limit),
``roundup_power2_divisions``, CUDA-graph private pools, free-memory callbacks, IPC,
``empty_cache`` calls by the program (available as :meth:`CachingAllocatorModel.empty_cache`,
never called by :func:`replay`), the latency of cudaMalloc/cudaFree/map/unmap and of the
device synchronisation in a reorganisation (the model counts the calls and their bytes;
:mod:`memo_sim.memplan.iteration_replay` prices them with the profile's ``gpu.allocator`` costs),
and fragmentation inside the driver (cudaMalloc succeeds whenever the total fits).

Byte counts follow PyTorch's statistics: *allocated* is the sum of the sizes of blocks handed
out (rounded, including a tail too small to split), *requested* the sum of the raw sizes asked
for, *reserved* the sum of segment sizes (mapped pages for expandable segments).

Fragmentation (reported two ways):

* ``fragmentation_at_peak`` = 1 - allocated / reserved at the first moment reserved reaches its
  peak (after the request that made it so is served): the share of the peak footprint that is
  reserved but not allocated.
* A *fragmentation failure* is a request that no cached block could serve although the free
  cached bytes of its pool summed to at least the (rounded) request: it needed a new segment
  (or a reorganisation, or failed) only because the free memory was in pieces. The report
  counts them and keeps the one with the largest request.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

from memo_sim.errors import MemoError
from memo_sim.request_trace import Buffer, RequestTrace

MiB = 1 << 20

# PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp).
K_MIN_BLOCK_SIZE = 512  # every size is rounded up to a multiple of this
K_SMALL_SIZE = 1 * MiB  # largest "small" request
K_SMALL_BUFFER = 2 * MiB  # small segments, and expandable small-pool pages
K_LARGE_BUFFER = 20 * MiB  # segments for 1-10 MiB requests, and expandable large-pool pages
K_MIN_LARGE_ALLOC = 10 * MiB  # requests below this (and > 1 MiB) get a kLargeBuffer segment
K_ROUND_LARGE = 2 * MiB  # larger requests get a segment rounded up to this


@dataclass(frozen=True)
class AllocatorConfig:
    """Settings of the modelled allocator.

    ``capacity_bytes`` is the device memory the allocator may reserve (total memory minus the
    CUDA context, NCCL buffers and anything else outside the allocator).
    ``max_split_size_bytes`` is ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb`` in bytes (``None``:
    unlimited, PyTorch's default); PyTorch requires it to exceed ``kLargeBuffer``.
    The remaining fields are PyTorch's constants; change them only to study variants.
    """

    capacity_bytes: int
    expandable_segments: bool = False
    max_split_size_bytes: int | None = None
    min_block_size: int = K_MIN_BLOCK_SIZE
    small_size: int = K_SMALL_SIZE
    small_buffer: int = K_SMALL_BUFFER
    large_buffer: int = K_LARGE_BUFFER
    min_large_alloc: int = K_MIN_LARGE_ALLOC
    round_large: int = K_ROUND_LARGE
    expandable_small_page_bytes: int = K_SMALL_BUFFER
    expandable_large_page_bytes: int = K_LARGE_BUFFER

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise MemoError(f"AllocatorConfig.{name} must be a positive integer of bytes, got {v!r}")

        for name in ("capacity_bytes", "min_block_size", "small_size", "small_buffer", "large_buffer",
                     "min_large_alloc", "round_large", "expandable_small_page_bytes",
                     "expandable_large_page_bytes"):
            positive(name)
        if self.max_split_size_bytes is not None:
            positive("max_split_size_bytes")
            if self.max_split_size_bytes <= self.large_buffer:
                raise MemoError(
                    f"AllocatorConfig.max_split_size_bytes must exceed large_buffer ({self.large_buffer} B) "
                    f"as in PyTorch, got {self.max_split_size_bytes}; use None for no limit"
                )
        if self.small_buffer < self.small_size:
            raise MemoError("AllocatorConfig.small_buffer must be >= small_size (a small segment holds "
                            "at least one small request)")

    def round_size(self, size: int) -> int:
        """Size of the block a request of ``size`` bytes needs (PyTorch's ``round_size``)."""
        m = self.min_block_size
        return m if size < m else m * ((size + m - 1) // m)

    def is_small(self, rounded: int) -> bool:
        """Whether a rounded request belongs to the small pool."""
        return rounded <= self.small_size

    def allocation_size(self, rounded: int) -> int:
        """Size of the segment cudaMalloc'd for a rounded request (``get_allocation_size``)."""
        if rounded <= self.small_size:
            return self.small_buffer
        if rounded < self.min_large_alloc:
            return self.large_buffer
        r = self.round_large
        return r * ((rounded + r - 1) // r)

    def page_bytes(self, small: bool) -> int:
        """Page size of the expandable segment of the small or large pool."""
        return self.expandable_small_page_bytes if small else self.expandable_large_page_bytes


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


# ---- internal state --------------------------------------------------------------------------
class _Segment:
    """A cudaMalloc'd segment, or a virtual address range of an expandable segment."""

    __slots__ = ("base", "size", "small", "expandable", "page")

    def __init__(self, base: int, size: int, small: bool, expandable: bool, page: int) -> None:
        self.base = base
        self.size = size
        self.small = small
        self.expandable = expandable
        self.page = page


class _Block:
    """A contiguous range of one segment: handed out, cached free, or (expandable) unmapped."""

    __slots__ = ("addr", "size", "allocated", "mapped", "prev", "next", "segment", "requested")

    def __init__(self, addr: int, size: int, segment: _Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.segment = segment
        self.requested = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """Cached free blocks ordered by (size, address), and unmapped blocks by address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.by_addr: dict[int, _Block] = {}
        self.free_bytes = 0
        self.unmapped_addrs: list[int] = []
        self.unmapped: dict[int, _Block] = {}

    @property
    def name(self) -> str:
        return "small" if self.small else "large"

    def insert(self, b: _Block) -> None:
        bisect.insort(self.keys, (b.size, b.addr))
        self.by_addr[b.addr] = b
        self.free_bytes += b.size

    def remove(self, b: _Block) -> None:
        i = bisect.bisect_left(self.keys, (b.size, b.addr))
        del self.keys[i]
        del self.by_addr[b.addr]
        self.free_bytes -= b.size

    def pop_at(self, i: int) -> _Block:
        """Remove and return the block at position ``i`` of ``keys`` (`remove` without the search)."""
        _size, addr = self.keys.pop(i)
        b = self.by_addr.pop(addr)
        self.free_bytes -= b.size
        return b

    def at(self, i: int) -> _Block:
        return self.by_addr[self.keys[i][1]]

    def largest(self) -> int:
        return self.keys[-1][0] if self.keys else 0

    def insert_unmapped(self, b: _Block) -> None:
        bisect.insort(self.unmapped_addrs, b.addr)
        self.unmapped[b.addr] = b

    def remove_unmapped(self, b: _Block) -> None:
        i = bisect.bisect_left(self.unmapped_addrs, b.addr)
        del self.unmapped_addrs[i]
        del self.unmapped[b.addr]


class CachingAllocatorModel:
    """PyTorch's CUDA caching allocator on one device and one stream, without the device.

    Call :meth:`malloc` and :meth:`free` with buffer ids; read the counters and byte totals
    from the attributes. :func:`replay` drives it from a trace and builds the report.
    """

    def __init__(self, config: AllocatorConfig) -> None:
        self.config = config
        self._small = _Pool(small=True)
        self._large = _Pool(small=False)
        self._live: dict[str, _Block] = {}
        self._pending: list[tuple[int, _Block]] = []  # freed, waiting for a stream event
        self.pending_bytes = 0
        self._segments: list[_Segment] = []
        self._next_addr = 0
        self._step = 0
        self._peak_set_in_op = False
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.requested_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_requested_bytes = 0
        self.allocated_at_peak_reserved_bytes = 0
        self.step_at_peak_reserved: int | None = None
        self.peak_reserved_unallocated_bytes = 0
        self.peak_segments = 0
        self.num_cuda_malloc = 0
        self.num_cuda_free = 0
        self.cuda_malloc_bytes = 0  # bytes of the segments (pages) cudaMalloc'd (mapped)
        self.cuda_free_bytes = 0  # bytes of the segments (pages) cudaFree'd (unmapped)
        self.num_reorganizations = 0
        self.reorganization_steps: list[int] = []
        self.reorganization_cuda_frees = 0  # the cudaFree calls (unmaps) made by reorganisations
        self.reorganization_free_bytes = 0
        self.num_oversize_releases = 0
        self.fragmentation_failures = 0
        self.worst_fragmentation_failure: FragmentationFailure | None = None
        # when a list: (pool is small, the pool's free bytes - the rounded request) per request
        # the cache could not serve, whether or not it counted as a fragmentation failure
        self.miss_margins: list[tuple[bool, int]] | None = None

    # ---- public API -----------------------------------------------------------------------
    def malloc(self, buffer_id: str, size: int, step: int = 0) -> int:
        """Serve a request of ``size`` bytes; return the block's (model) address.

        Raises :class:`AllocatorOutOfMemory` when even a reorganisation cannot make room.
        """
        live = self._live
        if buffer_id in live:
            raise MemoError(f"buffer {buffer_id!r} is already allocated; free it before allocating it again")
        if not isinstance(size, int) or size <= 0:
            raise MemoError(f"buffer {buffer_id!r}: size must be a positive integer of bytes, got {size!r}")
        cfg = self.config
        self._step = step
        self._peak_set_in_op = False
        rounded = cfg.round_size(size)
        pool = self._small if cfg.is_small(rounded) else self._large

        block = self._get_free_block(pool, rounded)
        if block is None:
            alloc_size = cfg.allocation_size(rounded)
            if self.miss_margins is not None:
                self.miss_margins.append((pool.small, pool.free_bytes - rounded))
            if pool.free_bytes >= rounded:
                self._note_fragmentation_failure(buffer_id, rounded, pool)
            block = self._alloc_block(pool, rounded, alloc_size)
            if (block is None and cfg.max_split_size_bytes is not None and not cfg.expandable_segments
                    and self._release_available_cached_blocks(pool, rounded)):
                block = self._alloc_block(pool, rounded, alloc_size)
            if block is None:
                self._release_cached_blocks(count_as_reorganization=True)
                block = self._alloc_block(pool, rounded, alloc_size)
            if block is None:
                self._update_end_of_op_peaks(after_request=True)
                raise AllocatorOutOfMemory(OomEvent(
                    buffer_id=buffer_id, step=step, requested_bytes=size, rounded_bytes=rounded,
                    alloc_size_bytes=alloc_size, pool=pool.name,
                    available_bytes=cfg.capacity_bytes - self.reserved_bytes,
                    reserved_bytes=self.reserved_bytes, allocated_bytes=self.allocated_bytes,
                    cached_free_bytes=self.reserved_bytes - self.allocated_bytes,
                    largest_free_block_bytes=pool.largest(),
                ))

        if self._should_split(block, rounded, pool):
            front = _Block(block.addr, rounded, block.segment)
            prev = front.prev = block.prev
            if prev is not None:
                prev.next = front
            front.next = block
            block.prev = front
            block.addr += rounded
            block.size -= rounded
            pool.insert(block)
            block = front
        block.allocated = True
        block.requested = size
        live[buffer_id] = block
        allocated = self.allocated_bytes = self.allocated_bytes + block.size
        self.requested_bytes += size
        if self._peak_set_in_op and self.reserved_bytes == self.peak_reserved_bytes:
            self.allocated_at_peak_reserved_bytes = allocated
        self._update_end_of_op_peaks(after_request=True)
        return block.addr

    def free(self, buffer_id: str, step: int = 0, pending_until: int | None = None) -> None:
        """Return a buffer's block to the cache, merging it with free neighbours.

        ``pending_until``: the block was used on another stream (``record_stream``: a collective
        or a copy still reads or writes it), so PyTorch records an event and keeps the block out
        of the cache until the event completes. It stops counting as allocated at once (as in
        PyTorch's statistics) but only :meth:`complete_pending` (the event completed at
        ``pending_until``, a caller-defined clock) or a reorganisation (which synchronises the
        device first) returns it to the cache.
        """
        block = self._live.pop(buffer_id, None)
        if block is None:
            raise MemoError(f"buffer {buffer_id!r} is not allocated; cannot free it")
        self._step = step
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        block.requested = 0
        if pending_until is not None:
            # the block stays marked allocated (nothing may reuse or merge it) until its event completes
            self._pending.append((pending_until, block))
            self.pending_bytes += block.size
        else:
            self._return_block(block)
        self._update_end_of_op_peaks()

    def _return_block(self, block: _Block) -> None:
        pool = self._small if block.segment.small else self._large
        block.allocated = False
        # _merge with each neighbour, skipped where the neighbour is busy (the common case)
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self._merge(block, prev, pool)
        if nxt is not None and not nxt.allocated:
            self._merge(block, nxt, pool)
        pool.insert(block)

    def complete_pending(self, until: int | None = None) -> int:
        """Return to the cache the pending blocks whose events completed by ``until`` (all when
        None, as ``synchronize_and_free_events`` does); returns how many."""
        done = 0
        keep: list[tuple[int, _Block]] = []
        for t, block in self._pending:
            if until is None or t <= until:
                self.pending_bytes -= block.size
                self._return_block(block)
                done += 1
            else:
                keep.append((t, block))
        self._pending = keep
        return done

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: free every cached unsplit segment (not a reorganisation)."""
        self._release_cached_blocks(count_as_reorganization=False)

    def reset_peak_stats(self) -> None:
        """Start the peak statistics afresh from the current state (``torch.cuda.reset_peak_memory_stats``).

        Counters (cudaMalloc/cudaFree calls and bytes, reorganisations) keep counting; read them
        before and after a stretch of requests with :meth:`counters` to get that stretch's share.
        """
        self.peak_reserved_bytes = self.reserved_bytes
        self.allocated_at_peak_reserved_bytes = self.allocated_bytes
        self.step_at_peak_reserved = self._step
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_requested_bytes = self.requested_bytes
        self.peak_reserved_unallocated_bytes = 0
        self.peak_segments = len(self._segments)

    def counters(self) -> dict[str, int]:
        """The cumulative event counters now (differences of two snapshots count a stretch)."""
        return {
            "cuda_malloc": self.num_cuda_malloc,
            "cuda_free": self.num_cuda_free,
            "cuda_malloc_bytes": self.cuda_malloc_bytes,
            "cuda_free_bytes": self.cuda_free_bytes,
            "reorganizations": self.num_reorganizations,
            "reorganization_cuda_frees": self.reorganization_cuda_frees,
            "reorganization_free_bytes": self.reorganization_free_bytes,
            "oversize_releases": self.num_oversize_releases,
            "fragmentation_failures": self.fragmentation_failures,
        }

    def _segment_blocks(self) -> list[tuple[_Segment, list[_Block]]]:
        """Each segment in address order with its blocks in address order."""
        heads: dict[int, _Block] = {}
        for pool in (self._small, self._large):
            for b in list(pool.by_addr.values()) + list(pool.unmapped.values()):
                heads.setdefault(id(b.segment), b)
        for b in list(self._live.values()) + [b for _, b in self._pending]:
            heads.setdefault(id(b.segment), b)
        out = []
        for seg in sorted(self._segments, key=lambda sg: sg.base):
            b: _Block | None = heads.get(id(seg))
            while b is not None and b.prev is not None:
                b = b.prev
            blocks = []
            while b is not None:
                blocks.append(b)
                b = b.next
            out.append((seg, blocks))
        return out

    def layout_signature(self) -> tuple:
        """The segments and their blocks in address order, without absolute addresses: (pool,
        expandable, ((size, allocated, mapped), ...)) per segment. Two states with the same
        signature serve the same request sequence the same way (new segments always come at
        higher addresses), which is how a replay recognises a steady state."""
        return tuple((seg.small, seg.expandable, tuple((b.size, b.allocated, b.mapped) for b in blocks))
                     for seg, blocks in self._segment_blocks())

    def segments(self) -> list[dict]:
        """The segments in address order with their blocks (address, size, requested bytes, state:
        ``allocated``, ``free`` or ``unmapped``), for snapshots of the allocator's state."""
        return [{"address": seg.base, "size": seg.size, "small": seg.small, "expandable": seg.expandable,
                 "blocks": [{"address": b.addr, "size": b.size, "requested": b.requested if b.allocated else 0,
                             "state": "allocated" if b.allocated else ("free" if b.mapped else "unmapped")}
                            for b in blocks]}
                for seg, blocks in self._segment_blocks()]

    def address_of(self, buffer_id: str) -> int:
        """The (model) address of a live buffer."""
        return self._live[buffer_id].addr

    def is_live(self, buffer_id: str) -> bool:
        """Whether the buffer is currently allocated."""
        return buffer_id in self._live

    def num_segments(self) -> int:
        """Number of segments held (an expandable segment counts once while it maps any page)."""
        return len(self._segments)

    def largest_free_block(self, small: bool) -> int:
        """Largest cached free block of the small or large pool, in bytes."""
        return (self._small if small else self._large).largest()

    def check_invariants(self) -> None:
        """Check the internal bookkeeping; raise AssertionError when it is inconsistent."""
        reserved = allocated = 0
        pools = {True: self._small, False: self._large}
        free_seen = {True: 0, False: 0}
        heads: dict[int, _Block] = {}
        for pool in pools.values():
            for b in list(pool.by_addr.values()) + list(pool.unmapped.values()):
                heads.setdefault(id(b.segment), b)
        for b in list(self._live.values()) + [b for _, b in self._pending]:
            heads.setdefault(id(b.segment), b)
        assert set(heads) == {id(s) for s in self._segments}, "blocks and segments disagree"
        for seg in self._segments:
            head = heads[id(seg)]
            while head.prev is not None:
                head = head.prev
            pos = seg.base
            b: _Block | None = head
            while b is not None:
                assert b.segment is seg and b.addr == pos, "blocks do not tile their segment"
                assert b.size > 0
                if b.next is not None:
                    assert b.next.prev is b, "broken block links"
                    if not b.allocated and not b.next.allocated:
                        assert b.mapped != b.next.mapped, "adjacent free blocks were not merged"
                pool = pools[seg.small]
                if b.allocated:
                    assert b.mapped
                    allocated += b.size
                elif b.mapped:
                    assert pool.by_addr.get(b.addr) is b, "free block missing from its pool"
                    free_seen[seg.small] += 1
                else:
                    assert seg.expandable and pool.unmapped.get(b.addr) is b
                    assert (b.addr - seg.base) % seg.page == 0 and b.size % seg.page == 0
                if b.mapped:
                    reserved += b.size
                pos += b.size
                b = b.next
            assert pos == seg.base + seg.size, "blocks do not cover their segment"
        for small, pool in pools.items():
            assert len(pool.keys) == len(pool.by_addr) == free_seen[small], "stale free-list entries"
            assert pool.keys == sorted(pool.keys)
            assert pool.free_bytes == sum(k[0] for k in pool.keys)
        assert reserved == self.reserved_bytes, (reserved, self.reserved_bytes)
        assert allocated == self.allocated_bytes + self.pending_bytes, (allocated, self.allocated_bytes)
        assert self.reserved_bytes <= self.config.capacity_bytes

    # ---- bookkeeping ----------------------------------------------------------------------
    def _raise_reserved(self, n: int) -> None:
        self.reserved_bytes += n
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
            self.allocated_at_peak_reserved_bytes = self.allocated_bytes
            self.step_at_peak_reserved = self._step
            self._peak_set_in_op = True

    def _update_end_of_op_peaks(self, after_request: bool = False) -> None:
        # comparisons rather than max(): this runs after every request
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes
        if len(self._segments) > self.peak_segments:
            self.peak_segments = len(self._segments)
        if after_request:  # idle cache after frees is not counted, only what a request sees
            idle = self.reserved_bytes - self.allocated_bytes
            if idle > self.peak_reserved_unallocated_bytes:
                self.peak_reserved_unallocated_bytes = idle

    def _note_fragmentation_failure(self, buffer_id: str, rounded: int, pool: _Pool) -> None:
        self.fragmentation_failures += 1
        worst = self.worst_fragmentation_failure
        if worst is None or rounded > worst.rounded_bytes:
            self.worst_fragmentation_failure = FragmentationFailure(
                buffer_id=buffer_id, step=self._step, rounded_bytes=rounded, pool=pool.name,
                pool_free_bytes=pool.free_bytes, largest_free_block_bytes=pool.largest())

    # ---- block search, split, merge -------------------------------------------------------
    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        i = bisect.bisect_left(pool.keys, (size, -1))
        n = len(pool.keys)
        if i == n:
            return None
        cfg = self.config
        if not cfg.expandable_segments and cfg.max_split_size_bytes is None:
            return pool.pop_at(i)  # PyTorch's defaults: the best fit, whatever it is
        b = pool.at(i)
        if self.config.expandable_segments and b.segment.expandable:
            # Prefer the block that would waste least of what it can grow to (a free block
            # followed by unmapped space counts as that much larger), as PyTorch does.
            def grow(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            while b.segment.expandable and i + 1 < n and grow(pool.at(i + 1)) < grow(b):
                i += 1
                b = pool.at(i)
        mss = self.config.max_split_size_bytes
        if mss is not None:
            if size < mss and b.size >= mss:
                return None
            if size >= mss and b.size >= size + self.config.large_buffer:
                return None
        return pool.pop_at(i)

    def _should_split(self, block: _Block, size: int, pool: _Pool) -> bool:
        remaining = block.size - size
        if pool.small or self.config.expandable_segments:
            return remaining >= self.config.min_block_size
        mss = self.config.max_split_size_bytes
        return (mss is None or size < mss) and remaining > self.config.small_size

    def _merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> None:
        """Absorb the free neighbour ``src`` into ``dst`` (which is in no list yet)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # ---- new memory -----------------------------------------------------------------------
    def _new_address_range(self, size: int) -> int:
        base = self._next_addr
        self._next_addr += size
        return base

    def _alloc_block(self, pool: _Pool, rounded: int, alloc_size: int) -> _Block | None:
        """cudaMalloc a segment (or map pages of an expandable one); None when it does not fit."""
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, rounded)
        if self.reserved_bytes + alloc_size > self.config.capacity_bytes:
            return None
        seg = _Segment(self._new_address_range(alloc_size), alloc_size, pool.small, False, alloc_size)
        self._segments.append(seg)
        self.num_cuda_malloc += 1
        self.cuda_malloc_bytes += alloc_size
        self._raise_reserved(alloc_size)
        return _Block(seg.base, alloc_size, seg)

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """Lowest-address run of free and unmapped space of ``size`` bytes, else a new segment."""
        def has_room(b: _Block | None) -> bool:
            got = 0
            while got < size and b is not None and not b.allocated:
                got += b.size
                b = b.next
            return got >= size

        for addr in pool.unmapped_addrs:
            c = pool.unmapped[addr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if has_room(c):
                return c
        page = self.config.page_bytes(pool.small)
        cap = self.config.capacity_bytes
        virtual = -(-(cap + cap // 8) // page) * page  # PyTorch reserves 9/8 of device memory
        seg = _Segment(self._new_address_range(virtual), virtual, pool.small, True, page)
        self._segments.append(seg)
        c = _Block(seg.base, virtual, seg, mapped=False)
        pool.insert_unmapped(c)
        return c

    def _map_block(self, b: _Block, size: int, pool: _Pool) -> bool:
        """Map the pages covering the first ``size`` bytes of unmapped block ``b``."""
        page = b.segment.page
        n = min(-(-size // page) * page, b.size)
        if self.reserved_bytes + n > self.config.capacity_bytes:
            return False
        pool.remove_unmapped(b)
        b.mapped = True
        if n < b.size:
            rest = _Block(b.addr + n, b.size - n, b.segment, mapped=False)
            rest.prev = b
            rest.next = b.next
            if rest.next is not None:
                rest.next.prev = rest
            b.next = rest
            b.size = n
            pool.insert_unmapped(rest)
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert(b)
        self.num_cuda_malloc += 1
        self.cuda_malloc_bytes += n
        self._raise_reserved(n)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        c = self._find_expandable_block(pool, size)
        if not c.mapped and not self._map_block(c, min(c.size, size), pool):
            if not c.is_split():  # a virtual segment with nothing mapped holds no memory
                pool.remove_unmapped(c)
                self._segments.remove(c.segment)
            return None
        while c.size < size:
            nxt = c.next
            if nxt is None or nxt.mapped or nxt.allocated:
                return None
            if not self._map_block(nxt, min(size - c.size, nxt.size), pool):
                return None
            c = nxt  # it absorbed the free block before it
        pool.remove(c)
        return c

    # ---- giving memory back ---------------------------------------------------------------
    def _release_block(self, b: _Block, pool: _Pool) -> None:
        """cudaFree a whole cached segment."""
        pool.remove(b)
        self._segments.remove(b.segment)
        self.reserved_bytes -= b.size
        self.num_cuda_free += 1
        self.cuda_free_bytes += b.size

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """With max_split_size: cudaFree cached oversize segments until ``size`` would fit."""
        mss = self.config.max_split_size_bytes
        assert mss is not None
        key = max(size, mss)
        i = bisect.bisect_left(pool.keys, (key, -1))
        if i < len(pool.keys):
            b = pool.at(i)
            if b.is_split():
                return False
            self._release_block(b, pool)
            self.num_oversize_releases += 1
            return True
        released = 0
        j = len(pool.keys) - 1
        while released < key and j >= 0 and pool.keys[j][0] >= mss:
            b = pool.at(j)
            j -= 1
            if b.is_split():
                continue
            released += b.size
            self._release_block(b, pool)
            self.num_oversize_releases += 1
        return released >= key

    def _unmap_block(self, b: _Block, pool: _Pool) -> None:
        """Unmap the completely free pages inside cached free block ``b`` of an expandable segment."""
        seg = b.segment
        page = seg.page
        off = b.addr - seg.base
        begin = -(-off // page) * page
        end = ((off + b.size) // page) * page
        if begin >= end:
            return
        pool.remove(b)
        before = begin - off
        if before > 0:
            head = _Block(b.addr, before, seg)
            head.prev = b.prev
            if head.prev is not None:
                head.prev.next = head
            head.next = b
            b.prev = head
            pool.insert(head)
        after = off + b.size - end
        if after > 0:
            tail = _Block(seg.base + end, after, seg)
            tail.next = b.next
            if tail.next is not None:
                tail.next.prev = tail
            tail.prev = b
            b.next = tail
            pool.insert(tail)
        b.addr = seg.base + begin
        b.size = end - begin
        b.mapped = False
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert_unmapped(b)
        self.reserved_bytes -= end - begin
        self.num_cuda_free += 1
        self.cuda_free_bytes += end - begin

    def _release_cached_blocks(self, count_as_reorganization: bool) -> None:
        """Free every cached unsplit segment and unmap every free expandable page."""
        self.complete_pending()  # synchronize_and_free_events: every stream event has completed
        frees0, bytes0 = self.num_cuda_free, self.cuda_free_bytes
        for pool in (self._large, self._small):
            to_unmap: list[_Block] = []
            for b in [pool.by_addr[a] for _, a in list(pool.keys)]:
                if b.segment.expandable:
                    to_unmap.append(b)
                elif not b.is_split():
                    self._release_block(b, pool)
            for b in to_unmap:
                self._unmap_block(b, pool)
                if not b.mapped and not b.is_split():
                    pool.remove_unmapped(b)
                    self._segments.remove(b.segment)
        if count_as_reorganization:
            self.num_reorganizations += 1
            self.reorganization_steps.append(self._step)
            self.reorganization_cuda_frees += self.num_cuda_free - frees0
            self.reorganization_free_bytes += self.cuda_free_bytes - bytes0


def fragmentation(allocated: int, reserved: int) -> float:
    """The share of reserved bytes not allocated: 1 - allocated / reserved (0 with nothing reserved)."""
    return 1.0 - allocated / reserved if reserved else 0.0


def replay(trace: RequestTrace, config: AllocatorConfig) -> AllocatorReport:
    """Replay ``trace`` through the caching-allocator model and report what happened.

    At each step, frees (``upper == step``) come before allocations (``lower == step``), each in
    trace order. Replay stops at the first out-of-memory; ``oom_event`` then says which buffer
    failed and how much memory was left.
    """
    model = CachingAllocatorModel(config)
    allocs: dict[int, list[Buffer]] = {}
    frees: dict[int, list[Buffer]] = {}
    for b in trace.buffers:
        allocs.setdefault(b.lower, []).append(b)
        frees.setdefault(b.upper, []).append(b)
    steps: list[int] = []
    reserved_series: list[int] = []
    allocated_series: list[int] = []
    served = 0
    oom_event: OomEvent | None = None
    for step in sorted(set(allocs) | set(frees)):
        for b in frees.get(step, ()):
            model.free(b.id, step)
        for b in allocs.get(step, ()):
            try:
                model.malloc(b.id, b.size, step)
            except AllocatorOutOfMemory as e:
                oom_event = e.event
                break
            served += 1
        steps.append(step)
        reserved_series.append(model.reserved_bytes)
        allocated_series.append(model.allocated_bytes)
        if oom_event is not None:
            break

    peak_reserved = model.peak_reserved_bytes
    frag = fragmentation(model.allocated_at_peak_reserved_bytes, peak_reserved)
    return AllocatorReport(
        config=config,
        trace_name=trace.name,
        num_requests=len(trace.buffers),
        num_served=served,
        max_live_bytes=trace.max_live_bytes(),
        peak_requested_bytes=model.peak_requested_bytes,
        peak_allocated_bytes=model.peak_allocated_bytes,
        peak_reserved_bytes=peak_reserved,
        allocated_at_peak_reserved_bytes=model.allocated_at_peak_reserved_bytes,
        step_at_peak_reserved=model.step_at_peak_reserved,
        fragmentation_at_peak=frag,
        peak_reserved_unallocated_bytes=model.peak_reserved_unallocated_bytes,
        fragmentation_failures=model.fragmentation_failures,
        worst_fragmentation_failure=model.worst_fragmentation_failure,
        num_cuda_malloc=model.num_cuda_malloc,
        num_cuda_free=model.num_cuda_free,
        num_reorganizations=model.num_reorganizations,
        reorganization_steps=list(model.reorganization_steps),
        num_oversize_releases=model.num_oversize_releases,
        peak_segments=model.peak_segments,
        final_reserved_bytes=model.reserved_bytes,
        final_allocated_bytes=model.allocated_bytes,
        oom=oom_event is not None,
        oom_event=oom_event,
        series_steps=steps,
        series_reserved_bytes=reserved_series,
        series_allocated_bytes=allocated_series,
    )
