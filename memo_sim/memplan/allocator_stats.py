"""Statistics and views of the caching-allocator model: PyTorch's peak statistics, the event
counters, fragmentation failures, the segments and blocks as a snapshot or a signature, and the
check of the internal bookkeeping.

`AllocatorStats` is a part of `memo_sim.memplan.caching_allocator.CachingAllocatorModel`; it
owns the peaks and the fragmentation-failure record (`init_stats`) and reads the model's
segments, pools and live blocks.
"""

from __future__ import annotations

from memo_sim.memplan.allocator_blocks import Block, Pool, Segment
from memo_sim.memplan.allocator_report import FragmentationFailure


class AllocatorStats:
    """The peaks, counters and views of the caching-allocator model."""

    def init_stats(self) -> None:
        self._step = 0
        self._peak_set_in_op = False
        self.allocated_bytes = 0
        self.requested_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_requested_bytes = 0
        self.allocated_at_peak_reserved_bytes = 0
        self.step_at_peak_reserved: int | None = None
        self.peak_reserved_unallocated_bytes = 0
        self.peak_segments = 0
        self.fragmentation_failures = 0
        self.worst_fragmentation_failure: FragmentationFailure | None = None
        # when a list: (pool is small, the pool's free bytes - the rounded request) per request
        # the cache could not serve, whether or not it counted as a fragmentation failure
        self.miss_margins: list[tuple[bool, int]] | None = None

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
            "gc_releases": self.num_gc_releases,
            "fragmentation_failures": self.fragmentation_failures,
        }

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

    def _note_fragmentation_failure(self, buffer_id: str, rounded: int, pool: Pool) -> None:
        self.fragmentation_failures += 1
        worst = self.worst_fragmentation_failure
        if worst is None or rounded > worst.rounded_bytes:
            self.worst_fragmentation_failure = FragmentationFailure(
                buffer_id=buffer_id, step=self._step, rounded_bytes=rounded, pool=pool.name,
                pool_free_bytes=pool.free_bytes, largest_free_block_bytes=pool.largest())

    # ---- views ----------------------------------------------------------------------------
    def _segment_blocks(self) -> list[tuple[Segment, list[Block]]]:
        """Each segment in address order with its blocks in address order."""
        heads: dict[int, Block] = {}
        for pool in self._pools.values():
            for b in list(pool.by_addr.values()) + list(pool.unmapped.values()):
                heads.setdefault(id(b.segment), b)
        for b in list(self._live.values()) + [b for _, b in self._pending]:
            heads.setdefault(id(b.segment), b)
        out = []
        for seg in sorted(self._segments, key=lambda sg: sg.base):
            b: Block | None = heads.get(id(seg))
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
        return tuple((seg.small, seg.expandable, seg.stream,
                       tuple((b.size, b.allocated, b.mapped) for b in blocks))
                     for seg, blocks in self._segment_blocks())

    def segments(self) -> list[dict]:
        """The segments in address order with their blocks (address, size, requested bytes, state:
        ``allocated``, ``free`` or ``unmapped``), for snapshots of the allocator's state."""
        return [{"address": seg.base, "size": seg.size, "small": seg.small, "expandable": seg.expandable,
                 "stream": seg.stream,
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
        """Largest cached free block of the small or large pool of any stream, in bytes."""
        return max((p.largest() for p in self._pools.values() if p.small == small), default=0)

    def check_invariants(self) -> None:
        """Check the internal bookkeeping; raise AssertionError when it is inconsistent."""
        reserved = allocated = 0
        pools = self._pools
        free_seen = {key: 0 for key in pools}
        heads: dict[int, Block] = {}
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
            b: Block | None = head
            while b is not None:
                assert b.segment is seg and b.addr == pos, "blocks do not tile their segment"
                assert b.size > 0
                if b.next is not None:
                    assert b.next.prev is b, "broken block links"
                    if not b.allocated and not b.next.allocated:
                        assert b.mapped != b.next.mapped, "adjacent free blocks were not merged"
                key = (seg.stream, seg.small)
                pool = pools[key]
                if b.allocated:
                    assert b.mapped
                    allocated += b.size
                elif b.mapped:
                    assert pool.by_addr.get(b.addr) is b, "free block missing from its pool"
                    free_seen[key] += 1
                else:
                    assert seg.expandable and pool.unmapped.get(b.addr) is b
                    assert (b.addr - seg.base) % seg.page == 0 and b.size % seg.page == 0
                if b.mapped:
                    reserved += b.size
                pos += b.size
                b = b.next
            assert pos == seg.base + seg.size, "blocks do not cover their segment"
        for key, pool in pools.items():
            assert len(pool.keys) == len(pool.by_addr) == free_seen[key], "stale free-list entries"
            assert pool.keys == sorted(pool.keys)
            assert pool.free_bytes == sum(k[0] for k in pool.keys)
        assert reserved == self.reserved_bytes, (reserved, self.reserved_bytes)
        assert allocated == self.allocated_bytes + self.pending_bytes, (allocated, self.allocated_bytes)
        assert self.reserved_bytes <= self.config.limit_bytes
