"""Tests of the caching-allocator model on small hand-made traces with outcomes worked out by hand.

Every expected number below is derived in the comment next to it from PyTorch's rules
(512 B rounding, 2 MiB small segments, 20 MiB segments for 1-10 MiB requests, 2 MiB rounding
above, best fit, split only if the tail is >= 512 B (small) / > 1 MiB (large), coalescing,
release-cache-and-retry before OOM).
"""

from __future__ import annotations

import json
import random

import pytest

from memo_sim.errors import MemoError
from memo_sim.memplan.caching_allocator import (
    AllocatorConfig,
    AllocatorOutOfMemory,
    CachingAllocatorModel,
    replay,
)
from memo_sim.request_trace import Buffer, RequestTrace

MiB = 1 << 20
BIG = 1 << 40  # a capacity that never runs out


def trace(*rows: tuple[str, int, int, int]) -> RequestTrace:
    """Rows of (id, size, lower, upper)."""
    return RequestTrace([Buffer(i, s, lo, up) for i, s, lo, up in rows], name="hand")


# s_i of growing size, each freed before the next is allocated: 12, 14, 16, 18 MiB.
GROWING = trace(("s0", 12 * MiB, 0, 1), ("s1", 14 * MiB, 1, 2), ("s2", 16 * MiB, 2, 3), ("s3", 18 * MiB, 3, 4))

# a (8 MiB) and a long-lived p (2 MiB) share one 20 MiB segment; after a is freed, b (16 MiB) fits
# in neither free piece (8 MiB, 10 MiB), and the segment cannot be released because p lives in it.
PINNED = trace(("a", 8 * MiB, 0, 1), ("p", 2 * MiB, 0, 3), ("b", 16 * MiB, 1, 3))


def test_round_size_and_segment_sizes():
    c = AllocatorConfig(capacity_bytes=BIG)
    assert [c.round_size(n) for n in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]
    assert c.is_small(MiB) and not c.is_small(MiB + 512)
    assert c.allocation_size(512) == 2 * MiB  # small -> kSmallBuffer
    assert c.allocation_size(MiB) == 2 * MiB
    assert c.allocation_size(MiB + 512) == 20 * MiB  # (1, 10) MiB -> kLargeBuffer
    assert c.allocation_size(10 * MiB - 512) == 20 * MiB
    assert c.allocation_size(10 * MiB) == 10 * MiB  # >= 10 MiB -> rounded up to 2 MiB
    assert c.allocation_size(10 * MiB + 512) == 12 * MiB


def test_one_byte_request_takes_512_bytes_of_a_2_mib_segment():
    r = replay(trace(("x", 1, 0, 1)), AllocatorConfig(capacity_bytes=BIG))
    assert r.peak_requested_bytes == 1
    assert r.peak_allocated_bytes == 512
    assert r.peak_reserved_bytes == 2 * MiB
    assert r.num_cuda_malloc == 1 and r.num_cuda_free == 0
    assert r.allocated_at_peak_reserved_bytes == 512
    assert r.fragmentation_at_peak == pytest.approx(1 - 512 / (2 * MiB))


def test_small_and_large_pools_get_their_own_segments():
    t = trace(
        ("s", MiB, 0, 1),  # small: new 2 MiB segment, 1 MiB tail kept
        ("m", MiB + 1, 0, 1),  # large (1 MiB + 512): new 20 MiB segment, tail 19 MiB - 512 kept
        ("l", 30 * MiB + 1, 0, 1),  # large (30 MiB + 512): new 32 MiB segment, tail 2 MiB - 512 kept
        ("s2", MiB, 0, 1),  # fits the small tail: no cudaMalloc
        ("m2", 2 * MiB, 0, 1),  # best fit is the 19 MiB - 512 tail (the other is 2 MiB - 512): no cudaMalloc
    )
    r = replay(t, AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 3
    assert r.peak_reserved_bytes == (2 + 20 + 32) * MiB
    assert r.peak_allocated_bytes == MiB + (MiB + 512) + (30 * MiB + 512) + MiB + 2 * MiB
    assert r.peak_segments == 3


def test_small_request_never_uses_large_pool_memory():
    # The 20 MiB large segment has an 18 MiB free tail, yet a 4 KiB request gets a 2 MiB segment.
    r = replay(trace(("big", 2 * MiB, 0, 2), ("tiny", 4096, 1, 2)), AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 2
    assert r.peak_reserved_bytes == 22 * MiB


def test_freed_block_of_same_size_is_reused():
    # b is allocated at step 1 after a is freed at step 1 (frees first): same 12 MiB segment.
    r = replay(trace(("a", 12 * MiB, 0, 1), ("b", 12 * MiB, 1, 2)), AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 1
    assert r.peak_reserved_bytes == 12 * MiB
    assert r.series_steps == [0, 1, 2]
    assert r.series_reserved_bytes == [12 * MiB] * 3
    assert r.series_allocated_bytes == [12 * MiB, 12 * MiB, 0]
    assert r.final_reserved_bytes == 12 * MiB and r.final_allocated_bytes == 0


def test_split_then_coalesce_serves_a_larger_request_from_the_same_segment():
    # One 20 MiB segment: a=[0,6) b=[6,12) c=[12,18), 2 MiB tail kept (> 1 MiB).
    # At step 2 a and b are freed and merge into a 12 MiB block that d (12 MiB) takes whole.
    t = trace(("a", 6 * MiB, 0, 2), ("b", 6 * MiB, 0, 2), ("c", 6 * MiB, 0, 3), ("d", 12 * MiB, 2, 3))
    r = replay(t, AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 1
    assert r.peak_reserved_bytes == 20 * MiB
    assert r.series_allocated_bytes == [18 * MiB, 18 * MiB, 0]

    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=BIG))
    for bid in ("a", "b", "c"):
        m.malloc(bid, 6 * MiB)
    m.free("a")
    assert m.largest_free_block(small=False) == 6 * MiB  # a alone: b is still live next to it
    m.free("b")
    assert m.largest_free_block(small=False) == 12 * MiB  # a + b merged
    m.check_invariants()


def test_split_thresholds_of_small_and_large_pools():
    # Small pool: 1 MiB, then 1 MiB - 512 leaves a 512 B tail (>= 512: kept), which the 512 B
    # request takes; the fourth request needs a second 2 MiB segment.
    t = trace(("a", MiB, 0, 1), ("b", MiB - 512, 0, 1), ("c", 512, 0, 1), ("d", 1, 0, 1))
    r = replay(t, AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 2
    assert r.peak_allocated_bytes == 2 * MiB + 512

    # Large pool: 19 MiB + 1 -> 20 MiB segment; the tail 1 MiB - 512 is not > 1 MiB, so the whole
    # 20 MiB is handed out and the next large request needs its own segment.
    r = replay(trace(("e", 19 * MiB + 1, 0, 1), ("f", MiB + 1, 0, 1)), AllocatorConfig(capacity_bytes=BIG))
    assert r.peak_allocated_bytes == 20 * MiB + (MiB + 512)
    assert r.num_cuda_malloc == 2
    assert r.peak_reserved_bytes == 40 * MiB
    # 19 MiB exactly: 20 MiB segment, tail exactly 1 MiB, which is not > 1 MiB: not split.
    r = replay(trace(("e", 19 * MiB, 0, 1)), AllocatorConfig(capacity_bytes=BIG))
    assert r.peak_allocated_bytes == 20 * MiB


def test_best_fit_takes_the_smallest_cached_block_that_fits():
    # Cached at step 1: a 16 MiB and a 12 MiB segment. p (12 MiB) must take the 12 MiB one, so q
    # (16 MiB) still finds the 16 MiB one: no new segment. Taking the 16 MiB block for p (split
    # 12 + 4) would force a third cudaMalloc for q.
    t = trace(("x", 16 * MiB, 0, 1), ("y", 12 * MiB, 0, 1), ("p", 12 * MiB, 1, 2), ("q", 16 * MiB, 1, 2))
    r = replay(t, AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 2
    assert r.peak_reserved_bytes == 28 * MiB


def test_growing_sizes_fragment_reserved_memory():
    # No freed block is big enough for the next request: 4 segments, 12+14+16+18 = 60 MiB reserved
    # while at most 18 MiB is ever live. At s2 the cache holds 26 MiB >= 16 and at s3 42 MiB >= 18:
    # two fragmentation failures, the worst (largest request) being s3.
    r = replay(GROWING, AllocatorConfig(capacity_bytes=BIG))
    assert r.max_live_bytes == 18 * MiB
    assert r.num_cuda_malloc == 4
    assert r.peak_reserved_bytes == 60 * MiB
    assert r.peak_allocated_bytes == 18 * MiB
    assert r.step_at_peak_reserved == 3
    assert r.allocated_at_peak_reserved_bytes == 18 * MiB
    assert r.fragmentation_at_peak == pytest.approx(0.7)
    assert r.peak_reserved_unallocated_bytes == 42 * MiB
    assert r.fragmentation_failures == 2
    w = r.worst_fragmentation_failure
    assert w is not None
    assert (w.buffer_id, w.step, w.rounded_bytes, w.pool) == ("s3", 3, 18 * MiB, "large")
    assert w.pool_free_bytes == 42 * MiB and w.largest_free_block_bytes == 16 * MiB
    assert not r.oom and r.num_reorganizations == 0


def test_expandable_segments_remove_the_fragmentation_of_growing_sizes():
    # Default 20 MiB large-pool pages: s0 maps one page; every later request fits the one free
    # 20 MiB block. Reserved peaks at 20 MiB at step 0 with 12 MiB allocated.
    r = replay(GROWING, AllocatorConfig(capacity_bytes=BIG, expandable_segments=True))
    assert r.num_cuda_malloc == 1
    assert r.peak_reserved_bytes == 20 * MiB
    assert r.step_at_peak_reserved == 0
    assert r.fragmentation_at_peak == pytest.approx(1 - 12 / 20)
    assert r.fragmentation_failures == 0

    # 2 MiB pages: the segment grows by exactly one page per request, so reserved tracks max-live.
    r = replay(GROWING, AllocatorConfig(capacity_bytes=BIG, expandable_segments=True,
                                        expandable_large_page_bytes=2 * MiB))
    assert r.num_cuda_malloc == 4  # 6 pages, then 1, 1, 1
    assert r.peak_reserved_bytes == 18 * MiB
    assert r.fragmentation_at_peak == 0.0
    assert r.series_reserved_bytes == [12 * MiB, 14 * MiB, 16 * MiB, 18 * MiB, 18 * MiB]


def test_oom_although_max_live_fits_capacity():
    # Capacity 30 MiB, max-live 18 MiB. b needs a new 16 MiB segment: 20 + 16 > 30. The cache
    # holds 18 MiB but in pieces of 8 and 10 MiB of a segment p keeps split, so the
    # reorganisation frees nothing and the retry fails.
    r = replay(PINNED, AllocatorConfig(capacity_bytes=30 * MiB))
    assert r.max_live_bytes == 18 * MiB
    assert r.oom
    e = r.oom_event
    assert e is not None
    assert (e.buffer_id, e.step, e.pool) == ("b", 1, "large")
    assert e.requested_bytes == e.rounded_bytes == e.alloc_size_bytes == 16 * MiB
    assert e.available_bytes == 10 * MiB
    assert e.reserved_bytes == 20 * MiB and e.allocated_bytes == 2 * MiB
    assert e.cached_free_bytes == 18 * MiB and e.largest_free_block_bytes == 10 * MiB
    assert r.num_reorganizations == 1 and r.reorganization_steps == [1]
    assert r.num_cuda_malloc == 1 and r.num_cuda_free == 0
    assert r.num_served == 2 and r.num_requests == 3
    assert r.fragmentation_failures == 1
    assert r.series_steps == [0, 1]
    assert r.series_reserved_bytes == [20 * MiB, 20 * MiB]
    assert r.series_allocated_bytes == [10 * MiB, 2 * MiB]
    # With room for a second segment there is no OOM.
    assert not replay(PINNED, AllocatorConfig(capacity_bytes=36 * MiB)).oom


def test_expandable_segments_with_small_pages_avoid_that_oom():
    # 2 MiB pages: a maps [0,8), p maps [8,10), b maps [10,26): 26 MiB <= 30 MiB.
    cfg = AllocatorConfig(capacity_bytes=30 * MiB, expandable_segments=True, expandable_large_page_bytes=2 * MiB)
    r = replay(PINNED, cfg)
    assert not r.oom
    assert r.num_cuda_malloc == 3
    assert r.peak_reserved_bytes == 26 * MiB
    assert r.step_at_peak_reserved == 1
    assert r.fragmentation_at_peak == pytest.approx(1 - 18 / 26)
    # PyTorch's 20 MiB large-pool pages: b needs a second page (40 > 30 MiB) and no page is free
    # to unmap (p sits in the first one), so it still fails.
    r = replay(PINNED, AllocatorConfig(capacity_bytes=30 * MiB, expandable_segments=True))
    assert r.oom and r.oom_event is not None and r.oom_event.buffer_id == "b"
    assert r.num_reorganizations == 1


def test_expandable_reorganisation_unmaps_free_pages_and_retry_succeeds():
    # 2 MiB pages, capacity 30 MiB. a maps [0,20), p maps [20,22). After a is freed, b (24 MiB)
    # needs 24 more MiB at the tail: 22 + 24 > 30. The reorganisation unmaps the 10 free pages
    # [0,20) (one unmap call), reserved drops to 2 MiB, and the retry maps [22,46): 26 MiB.
    t = trace(("a", 20 * MiB, 0, 1), ("p", 2 * MiB, 0, 3), ("b", 24 * MiB, 1, 3))
    cfg = AllocatorConfig(capacity_bytes=30 * MiB, expandable_segments=True, expandable_large_page_bytes=2 * MiB)
    r = replay(t, cfg)
    assert not r.oom
    assert r.num_reorganizations == 1 and r.reorganization_steps == [1]
    assert r.num_cuda_malloc == 3 and r.num_cuda_free == 1
    assert r.series_steps == [0, 1, 3]
    assert r.series_reserved_bytes == [22 * MiB, 26 * MiB, 26 * MiB]
    assert r.series_allocated_bytes == [22 * MiB, 26 * MiB, 0]
    assert r.peak_reserved_bytes == 26 * MiB and r.fragmentation_at_peak == 0.0


def test_reorganisation_frees_cache_and_retry_succeeds():
    # Capacity 40 MiB. s2 (16 MiB) would bring reserved to 26 + 16 = 42: the allocator frees the
    # cached s0 and s1 segments (2 cudaFree), retries, and succeeds (reserved 16). s3 then gets a
    # new 18 MiB segment next to the cached 16 MiB one: reserved 34, the new peak.
    r = replay(GROWING, AllocatorConfig(capacity_bytes=40 * MiB))
    assert not r.oom
    assert r.num_reorganizations == 1 and r.reorganization_steps == [2]
    assert r.num_cuda_malloc == 4 and r.num_cuda_free == 2
    assert r.series_reserved_bytes == [12 * MiB, 26 * MiB, 16 * MiB, 34 * MiB, 34 * MiB]
    assert r.series_allocated_bytes == [12 * MiB, 14 * MiB, 16 * MiB, 18 * MiB, 0]
    assert r.peak_reserved_bytes == 34 * MiB and r.step_at_peak_reserved == 3
    assert r.allocated_at_peak_reserved_bytes == 18 * MiB
    assert r.fragmentation_failures == 1  # s2: 26 MiB cached; s3: only 16 MiB cached < 18


def test_max_split_size_keeps_oversize_blocks_whole():
    mss = 40 * MiB
    t = trace(("a", 64 * MiB, 0, 1), ("b", 24 * MiB, 1, 2))
    # Unlimited: b splits the cached 64 MiB block (tail 40 MiB kept).
    r = replay(t, AllocatorConfig(capacity_bytes=BIG))
    assert r.num_cuda_malloc == 1 and r.peak_allocated_bytes == 64 * MiB
    # b < mss may not take a block >= mss: new 24 MiB segment.
    r = replay(t, AllocatorConfig(capacity_bytes=BIG, max_split_size_bytes=mss))
    assert r.num_cuda_malloc == 2 and r.peak_reserved_bytes == 88 * MiB
    # 50 MiB >= mss may take the 64 MiB block (64 < 50 + 20), whole, unsplit.
    r = replay(trace(("a", 64 * MiB, 0, 1), ("c", 50 * MiB, 1, 2)),
               AllocatorConfig(capacity_bytes=BIG, max_split_size_bytes=mss))
    assert r.num_cuda_malloc == 1 and r.series_allocated_bytes == [64 * MiB, 64 * MiB, 0]
    # 44 MiB may not: 64 >= 44 + 20.
    r = replay(trace(("a", 64 * MiB, 0, 1), ("c", 44 * MiB, 1, 2)),
               AllocatorConfig(capacity_bytes=BIG, max_split_size_bytes=mss))
    assert r.num_cuda_malloc == 2


def test_max_split_size_releases_oversize_cache_before_a_full_reorganisation():
    # Capacity 80 MiB: 64 + 24 > 80, so the cached oversize 64 MiB segment is cudaFree'd and the
    # retry succeeds without a full release_cached_blocks.
    t = trace(("a", 64 * MiB, 0, 1), ("b", 24 * MiB, 1, 2))
    r = replay(t, AllocatorConfig(capacity_bytes=80 * MiB, max_split_size_bytes=40 * MiB))
    assert not r.oom
    assert r.num_oversize_releases == 1 and r.num_reorganizations == 0
    assert r.num_cuda_malloc == 2 and r.num_cuda_free == 1
    assert r.peak_reserved_bytes == 64 * MiB and r.final_reserved_bytes == 24 * MiB


def test_empty_cache_is_not_a_reorganisation():
    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=BIG))
    m.malloc("a", 12 * MiB)
    m.malloc("b", 100)
    m.free("a")
    m.empty_cache()
    assert m.reserved_bytes == 2 * MiB  # the small segment still holds b
    assert m.num_cuda_free == 1 and m.num_reorganizations == 0
    m.check_invariants()


def test_model_raises_oom_and_rejects_misuse():
    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=10 * MiB))
    with pytest.raises(AllocatorOutOfMemory) as info:
        m.malloc("huge", 11 * MiB, step=7)
    assert info.value.event.step == 7 and info.value.event.available_bytes == 10 * MiB
    m.malloc("x", 100)
    with pytest.raises(MemoError, match="already allocated"):
        m.malloc("x", 100)
    with pytest.raises(MemoError, match="not allocated"):
        m.free("y")
    with pytest.raises(MemoError, match="max_split_size_bytes"):  # PyTorch: max_split_size_mb >= 20
        AllocatorConfig(capacity_bytes=BIG, max_split_size_bytes=19 * MiB)
    AllocatorConfig(capacity_bytes=BIG, max_split_size_bytes=20 * MiB)
    with pytest.raises(MemoError, match="capacity_bytes"):
        AllocatorConfig(capacity_bytes=0)


def test_report_is_json_ready():
    r = replay(PINNED, AllocatorConfig(capacity_bytes=30 * MiB))
    obj = json.loads(json.dumps(r.to_json_obj()))
    assert obj["oom"] is True and obj["oom_event"]["buffer_id"] == "b"
    assert obj["config"]["capacity_bytes"] == 30 * MiB
    assert obj["worst_fragmentation_failure"]["rounded_bytes"] == 16 * MiB
    assert len(obj["series_steps"]) == len(obj["series_reserved_bytes"]) == len(obj["series_allocated_bytes"])


@pytest.mark.parametrize("expandable", [False, True])
def test_random_traces_keep_the_bookkeeping_consistent(expandable):
    rng = random.Random(7)
    bufs = []
    for i in range(600):
        lo = rng.randrange(300)
        size = rng.choice([rng.randint(1, 64 * 1024), rng.randint(1, MiB), rng.randint(MiB, 12 * MiB),
                           rng.randint(10 * MiB, 60 * MiB)])
        bufs.append(Buffer(f"t{i}", size, lo, lo + rng.randint(1, 20)))
    t = RequestTrace(bufs)
    cfg = AllocatorConfig(capacity_bytes=BIG, expandable_segments=expandable)
    r = replay(t, cfg)
    assert not r.oom and r.num_served == len(bufs)
    assert r.peak_requested_bytes == t.max_live_bytes()
    assert r.max_live_bytes <= r.peak_allocated_bytes <= r.peak_reserved_bytes
    assert r.final_allocated_bytes == 0
    assert all(a <= s for a, s in zip(r.series_allocated_bytes, r.series_reserved_bytes))

    # A capacity between max-live and the unconstrained peak forces reorganisations; the model's
    # internal state stays consistent whatever happens, and reserved never exceeds capacity.
    cap = (t.max_live_bytes() + r.peak_reserved_bytes) // 2
    m = CachingAllocatorModel(AllocatorConfig(capacity_bytes=cap, expandable_segments=expandable))
    events = sorted([(b.upper, 0, b) for b in bufs] + [(b.lower, 1, b) for b in bufs],
                    key=lambda e: (e[0], e[1]))
    for step, is_alloc, b in events:
        if is_alloc:
            try:
                m.malloc(b.id, b.size, step)
            except AllocatorOutOfMemory:
                pass
        elif m.is_live(b.id):
            m.free(b.id, step)
        m.check_invariants()
    assert m.num_reorganizations > 0
    assert m.peak_reserved_bytes <= cap
