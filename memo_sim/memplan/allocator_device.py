"""Device memory of the caching-allocator model: new segments from cudaMalloc (or pages mapped
into an expandable segment) and memory given back (cudaFree of cached segments, unmapping of
free pages, the reorganisation that frees the whole cache).

`DeviceMemory` is a part of `memo_sim.memplan.caching_allocator.CachingAllocatorModel`; it owns
the segment list, the next free address, ``reserved_bytes`` and the cudaMalloc/cudaFree and
reorganisation counters (`init_device`), and reads the model's pools and config.
"""

from __future__ import annotations

import bisect

from memo_sim.memplan.allocator_blocks import Block, Pool, Segment, merge_free


class DeviceMemory:
    """cudaMalloc, map, cudaFree and unmap for the caching-allocator model."""

    def init_device(self) -> None:
        self._segments: list[Segment] = []
        self._next_addr = 0
        self.reserved_bytes = 0
        self.num_cuda_malloc = 0
        self.num_cuda_free = 0
        self.cuda_malloc_bytes = 0  # bytes of the segments (pages) cudaMalloc'd (mapped)
        self.cuda_free_bytes = 0  # bytes of the segments (pages) cudaFree'd (unmapped)
        self.num_reorganizations = 0
        self.reorganization_steps: list[int] = []
        self.reorganization_cuda_frees = 0  # the cudaFree calls (unmaps) made by reorganisations
        self.reorganization_free_bytes = 0
        self.num_oversize_releases = 0
        self.num_gc_releases = 0  # segments cudaFree'd by the garbage collection (no synchronisation)

    # ---- new memory -----------------------------------------------------------------------
    def _new_address_range(self, size: int) -> int:
        base = self._next_addr
        self._next_addr += size
        return base

    def _alloc_block(self, pool: Pool, rounded: int, alloc_size: int) -> Block | None:
        """cudaMalloc a segment (or map pages of an expandable one); None when it does not fit."""
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, rounded)
        if self.reserved_bytes + alloc_size > self.config.limit_bytes:
            return None
        seg = Segment(self._new_address_range(alloc_size), alloc_size, pool.small, False, alloc_size, pool.stream)
        self._segments.append(seg)
        self.num_cuda_malloc += 1
        self.cuda_malloc_bytes += alloc_size
        self._raise_reserved(alloc_size)
        return Block(seg.base, alloc_size, seg)

    def _find_expandable_block(self, pool: Pool, size: int) -> Block:
        """Lowest-address run of free and unmapped space of ``size`` bytes, else a new segment."""
        def has_room(b: Block | None) -> bool:
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
        seg = Segment(self._new_address_range(virtual), virtual, pool.small, True, page, pool.stream)
        self._segments.append(seg)
        c = Block(seg.base, virtual, seg, mapped=False)
        pool.insert_unmapped(c)
        return c

    def _map_block(self, b: Block, size: int, pool: Pool) -> bool:
        """Map the pages covering the first ``size`` bytes of unmapped block ``b``."""
        page = b.segment.page
        n = min(-(-size // page) * page, b.size)
        if self.reserved_bytes + n > self.config.limit_bytes:
            return False
        pool.remove_unmapped(b)
        b.mapped = True
        if n < b.size:
            rest = Block(b.addr + n, b.size - n, b.segment, mapped=False)
            rest.prev = b
            rest.next = b.next
            if rest.next is not None:
                rest.next.prev = rest
            b.next = rest
            b.size = n
            pool.insert_unmapped(rest)
        merge_free(b, b.prev, pool)
        merge_free(b, b.next, pool)
        pool.insert(b)
        self.num_cuda_malloc += 1
        self.cuda_malloc_bytes += n
        self._raise_reserved(n)
        return True

    def _try_allocate_expandable_block(self, pool: Pool, size: int) -> Block | None:
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
    def _release_block(self, b: Block, pool: Pool) -> None:
        """cudaFree a whole cached segment."""
        pool.remove(b)
        self._segments.remove(b.segment)
        self.reserved_bytes -= b.size
        self.num_cuda_free += 1
        self.cuda_free_bytes += b.size

    def _release_available_cached_blocks(self, pool: Pool, size: int) -> bool:
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

    def _unmap_block(self, b: Block, pool: Pool) -> None:
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
            head = Block(b.addr, before, seg)
            head.prev = b.prev
            if head.prev is not None:
                head.prev.next = head
            head.next = b
            b.prev = head
            pool.insert(head)
        after = off + b.size - end
        if after > 0:
            tail = Block(seg.base + end, after, seg)
            tail.next = b.next
            if tail.next is not None:
                tail.next.prev = tail
            tail.prev = b
            b.next = tail
            pool.insert(tail)
        b.addr = seg.base + begin
        b.size = end - begin
        b.mapped = False
        merge_free(b, b.prev, pool)
        merge_free(b, b.next, pool)
        pool.insert_unmapped(b)
        self.reserved_bytes -= end - begin
        self.num_cuda_free += 1
        self.cuda_free_bytes += end - begin

    def _garbage_collect(self) -> None:
        """PyTorch's ``garbage_collect_cached_blocks``: above ``threshold x limit`` reserved, cudaFree
        cached unsplit large segments whose age (free-block searches since they were cached) is at
        least the mean age, round after round, until the excess is reclaimed or none is left; no
        device synchronisation. Expandable segments are left alone, as PyTorch's release_block
        refuses them."""
        cfg = self.config
        threshold = int(cfg.garbage_collection_threshold * cfg.limit_bytes)
        if self.reserved_bytes <= threshold:
            return
        target = self.reserved_bytes - threshold
        pools = [p for p in self._pools.values() if not p.small]
        counter = self._gc_calls[False][0]

        def freeable() -> list[tuple[Pool, Block]]:
            return [(p, p.by_addr[a]) for p in pools for _, a in list(p.keys)
                    if not p.by_addr[a].is_split() and not p.by_addr[a].segment.expandable]

        blocks = freeable()
        if not blocks:
            return
        total_age = sum(counter - b.gc_base for _, b in blocks)
        count = len(blocks)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            threshold_age = total_age / count
            freed = False
            for p, b in freeable():
                age = counter - b.gc_base
                if age >= threshold_age:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b, p)
                    self.num_gc_releases += 1

    def _release_cached_blocks(self, count_as_reorganization: bool) -> None:
        """Free every cached unsplit segment and unmap every free expandable page, every stream's."""
        self.complete_pending()  # synchronize_and_free_events: every stream event has completed
        frees0, bytes0 = self.num_cuda_free, self.cuda_free_bytes
        for pool in sorted(self._pools.values(), key=lambda p: (p.small, p.stream)):
            to_unmap: list[Block] = []
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
