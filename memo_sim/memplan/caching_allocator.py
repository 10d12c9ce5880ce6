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

What the model keeps of ``c10/cuda/CUDACachingAllocator.cpp`` (one device):

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

* Per-stream pools: a request names its stream (``malloc(..., stream=k)``, default 0); only
  blocks cached by that stream serve it (PyTorch orders its pools by stream first), an
  expandable segment grows per stream and pool, and a reorganisation frees every stream's cache.
* ``roundup_power2_divisions`` (`AllocatorConfig.round_size`): a request whose size class asks
  for more than one division rounds up to the next of that many equal steps between powers of
  two.
* ``garbage_collection_threshold`` under ``set_per_process_memory_fraction``
  (``memory_fraction``; the limit becomes that share of ``capacity_bytes``): when the cache
  misses and reserved memory is above threshold x limit, cached unsplit large segments at least
  as old as the mean (age: free-block searches since they were cached) are cudaFree'd, round
  after round, without a device synchronisation (PyTorch's ``garbage_collect_cached_blocks``).

The settings come from a ``PYTORCH_CUDA_ALLOC_CONF``-style string (`memo_sim.layout.alloc_conf`,
`AllocatorConfig.from_conf`): the framework's data or ``memo-sim whatif --alloc-conf``. Source:
c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.cpp, pytorch/pytorch at
001074d25084fdb87a799823e395a50f5ec044d3.

What it leaves out: CUDA-graph private pools, free-memory callbacks, IPC,
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

from memo_sim.errors import MemoError
from memo_sim.memplan.allocator_blocks import Block, Pool, merge_free
from memo_sim.memplan.allocator_config import (  # noqa: F401  (re-exported: the model's settings)
    K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE, MiB,
    AllocatorConfig,
)
from memo_sim.memplan.allocator_device import DeviceMemory
from memo_sim.memplan.allocator_report import (  # noqa: F401  (re-exported: what a replay reports)
    AllocatorOutOfMemory, AllocatorReport, FragmentationFailure, OomEvent, fragmentation,
)
from memo_sim.memplan.allocator_stats import AllocatorStats
from memo_sim.request_trace import Buffer, RequestTrace


class CachingAllocatorModel(DeviceMemory, AllocatorStats):
    """PyTorch's CUDA caching allocator on one device (per-stream pools), without the device.

    Call :meth:`malloc` and :meth:`free` with buffer ids; read the counters and byte totals
    from the attributes. :func:`replay` drives it from a trace and builds the report.
    This class is the allocation policy (best fit, split, merge, the order of fallbacks when
    the cache cannot serve a request); `DeviceMemory` (`memo_sim.memplan.allocator_device`)
    gets and gives back device memory, `AllocatorStats` (`memo_sim.memplan.allocator_stats`)
    keeps the statistics and the views of the state.
    """

    def __init__(self, config: AllocatorConfig) -> None:
        self.config = config
        self._gc_calls = {True: [0], False: [0]}
        self._pools: dict[tuple[int, bool], Pool] = {}
        self._small = self._pool(0, True)
        self._large = self._pool(0, False)
        self._live: dict[str, Block] = {}
        self._pending: list[tuple[int, Block]] = []  # freed, waiting for a stream event
        self.pending_bytes = 0
        self.init_device()
        self.init_stats()

    def _pool(self, stream: int, small: bool) -> Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = Pool(small, stream, self._gc_calls[small])
        return pool

    # ---- public API -----------------------------------------------------------------------
    def malloc(self, buffer_id: str, size: int, step: int = 0, stream: int = 0) -> int:
        """Serve a request of ``size`` bytes on ``stream``; return the block's (model) address.

        Only blocks cached by the same stream serve it (PyTorch's pools are ordered by stream
        first). Raises :class:`AllocatorOutOfMemory` when even a reorganisation cannot make room.
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
        small = cfg.is_small(rounded)
        pool = (self._small if small else self._large) if stream == 0 else self._pool(stream, small)

        block = self._get_free_block(pool, rounded)
        if block is None:
            if cfg.gc_active:
                self._garbage_collect()
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
                    available_bytes=cfg.limit_bytes - self.reserved_bytes,
                    reserved_bytes=self.reserved_bytes, allocated_bytes=self.allocated_bytes,
                    cached_free_bytes=self.reserved_bytes - self.allocated_bytes,
                    largest_free_block_bytes=pool.largest(),
                ))

        if self._should_split(block, rounded, pool):
            front = Block(block.addr, rounded, block.segment)
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

    def _return_block(self, block: Block) -> None:
        seg = block.segment
        pool = self._pools[(seg.stream, seg.small)]
        block.allocated = False
        # merge_free with each neighbour, skipped where the neighbour is busy (the common case)
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            merge_free(block, prev, pool)
        if nxt is not None and not nxt.allocated:
            merge_free(block, nxt, pool)
        pool.insert(block)

    def complete_pending(self, until: int | None = None) -> int:
        """Return to the cache the pending blocks whose events completed by ``until`` (all when
        None, as ``synchronize_and_free_events`` does); returns how many."""
        done = 0
        keep: list[tuple[int, Block]] = []
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

    # ---- block search, split --------------------------------------------------------------
    def _get_free_block(self, pool: Pool, size: int) -> Block | None:
        if self.config.gc_active:
            pool.gc_calls[0] += 1  # PyTorch counts the searches only while the collection is on
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
            def grow(x: Block) -> int:
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

    def _should_split(self, block: Block, size: int, pool: Pool) -> bool:
        remaining = block.size - size
        if pool.small or self.config.expandable_segments:
            return remaining >= self.config.min_block_size
        mss = self.config.max_split_size_bytes
        return (mss is None or size < mss) and remaining > self.config.small_size


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
