"""The caching-allocator model's bookkeeping: segments, the blocks that tile them (handed out,
cached free, or unmapped pages of an expandable segment), the per-pool free lists, and the merge
of a free block with a free neighbour."""

from __future__ import annotations

import bisect


class Segment:
    """A cudaMalloc'd segment, or a virtual address range of an expandable segment."""

    __slots__ = ("base", "size", "small", "expandable", "page", "stream")

    def __init__(self, base: int, size: int, small: bool, expandable: bool, page: int, stream: int = 0) -> None:
        self.base = base
        self.size = size
        self.small = small
        self.expandable = expandable
        self.page = page
        self.stream = stream  # the stream whose allocation made it; only that stream's requests reuse it


class Block:
    """A contiguous range of one segment: handed out, cached free, or (expandable) unmapped."""

    __slots__ = ("addr", "size", "allocated", "mapped", "prev", "next", "segment", "requested", "gc_base")

    def __init__(self, addr: int, size: int, segment: Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.allocated = False
        self.mapped = mapped
        self.prev: Block | None = None
        self.next: Block | None = None
        self.segment = segment
        self.requested = 0
        self.gc_base = 0  # the pool's free-block searches when it was cached (its age is the searches since)

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class Pool:
    """Cached free blocks of one stream ordered by (size, address), and unmapped blocks by address.

    PyTorch keeps one small and one large pool ordered by (stream, size, address), so a search
    never crosses streams; here each (stream, pool) pair is its own `Pool`. ``gc_calls`` is the
    counter of free-block searches shared by every stream's pools of one size class (PyTorch's
    ``get_free_blocks_call_count``), whose value each block records when it is cached."""

    def __init__(self, small: bool, stream: int = 0, gc_calls: list[int] | None = None) -> None:
        self.small = small
        self.stream = stream
        self.gc_calls = gc_calls if gc_calls is not None else [0]
        self.keys: list[tuple[int, int]] = []
        self.by_addr: dict[int, Block] = {}
        self.free_bytes = 0
        self.unmapped_addrs: list[int] = []
        self.unmapped: dict[int, Block] = {}

    @property
    def name(self) -> str:
        return "small" if self.small else "large"

    def insert(self, b: Block) -> None:
        b.gc_base = self.gc_calls[0]
        bisect.insort(self.keys, (b.size, b.addr))
        self.by_addr[b.addr] = b
        self.free_bytes += b.size

    def remove(self, b: Block) -> None:
        i = bisect.bisect_left(self.keys, (b.size, b.addr))
        del self.keys[i]
        del self.by_addr[b.addr]
        self.free_bytes -= b.size

    def pop_at(self, i: int) -> Block:
        """Remove and return the block at position ``i`` of ``keys`` (`remove` without the search)."""
        _size, addr = self.keys.pop(i)
        b = self.by_addr.pop(addr)
        self.free_bytes -= b.size
        return b

    def at(self, i: int) -> Block:
        return self.by_addr[self.keys[i][1]]

    def largest(self) -> int:
        return self.keys[-1][0] if self.keys else 0

    def insert_unmapped(self, b: Block) -> None:
        bisect.insort(self.unmapped_addrs, b.addr)
        self.unmapped[b.addr] = b

    def remove_unmapped(self, b: Block) -> None:
        i = bisect.bisect_left(self.unmapped_addrs, b.addr)
        del self.unmapped_addrs[i]
        del self.unmapped[b.addr]


def merge_free(dst: Block, src: Block | None, pool: Pool) -> None:
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
