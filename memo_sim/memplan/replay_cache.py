"""The replays `memo_sim.memplan.iteration_replay.replay_iteration` remembers: by content (the
stream's recipe and the allocator's settings, `_REPLAYS`) and, for replays in which no cudaMalloc
failed, shared by streams that differ only in their static buffers' sizes (`_StaticBase`,
`_SHARED`). Each caller gets its own copy (`_copy_replay`)."""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, replace

from memo_sim.memplan.caching_allocator import AllocatorConfig, AllocatorOutOfMemory, CachingAllocatorModel, fragmentation
from memo_sim.memplan.iteration_requests import _StreamRecipe
from memo_sim.memplan.iteration_stream import Request
from memo_sim.memplan.replay_result import IterationReplay

REPLAY_CACHE_SIZE = 4096  # replays remembered by `replay_iteration` (least recently used go first)
_REPLAYS: OrderedDict[tuple, IterationReplay] = OrderedDict()
_SHARED: OrderedDict[tuple, tuple[IterationReplay, "_StaticBase", list]] = OrderedDict()  # replay, base, margins


def _remember(memo: OrderedDict, key, value) -> None:
    memo[key] = value
    if len(memo) > REPLAY_CACHE_SIZE:
        memo.popitem(last=False)


def clear_replay_cache() -> None:
    """Forget the replays `replay_iteration` remembers."""
    _REPLAYS.clear()
    _SHARED.clear()


@dataclass(frozen=True)
class _StaticBase:
    """The allocator after a stream's static requests (model states, the policy's static
    buffers), as far as the iteration's requests can tell.

    Static blocks are never freed, so their segments are never released and never merge with
    anything the iteration frees. What the iteration can see of them: the reserved bytes
    (a cudaMalloc fails where reserved + segment > capacity); each static segment's free
    remainder that some iteration request could take (``visible``: its pool and size, in address
    order; static segments come first), where a large-pool remainder smaller than the smallest
    large request never serves one; the large pool's free bytes (``large_free``: a request the
    cache cannot serve counts as a fragmentation failure where the pool's free bytes would hold
    it); and, in the statistics, the allocated bytes.

    Two streams with the same iteration requests and the same visible remainders are served the
    same way wherever no cudaMalloc fails; with none failing the allocator never frees a segment,
    so the reserved bytes only grow and the last reported peak bounds them all. Such a replay
    (`holds`) serves any capacity with at least that much room above its own static bytes
    (`reserved_above`): its byte counts move by the difference of the static ones and its
    fragmentation failures are recounted from the margins of the requests the cache missed
    (`moved_to`). Expandable segments size their virtual ranges by the capacity: never shared.
    """

    reserved: int
    allocated: int
    visible: tuple[tuple[bool, int], ...]
    large_free: int
    segments: int = 0  # the static requests' segments

    @staticmethod
    def of(recipe: _StreamRecipe, cfg: AllocatorConfig) -> "_StaticBase | None":
        if cfg.expandable_segments or cfg.memory_fraction is not None:
            return None  # virtual ranges sized by the capacity; a fraction's limit and collection move with it
        m = CachingAllocatorModel(cfg)
        try:
            for _k, bid, size in recipe.static:
                m.malloc(bid, size, 0)
        except AllocatorOutOfMemory:
            return None
        smallest = min((q for q in map(cfg.round_size, recipe.request_sizes()) if not cfg.is_small(q)), default=None)
        visible, large_free = [], 0
        for small, _expandable, _stream, blocks in m.layout_signature():
            for size, allocated, _mapped in blocks:
                if allocated:
                    continue
                if not small:
                    large_free += size
                if small or (smallest is not None and size >= smallest):
                    visible.append((small, size))
        return _StaticBase(m.reserved_bytes, m.allocated_bytes, tuple(visible), large_free, m.num_segments())

    @staticmethod
    def holds(r: IterationReplay) -> bool:
        """No cudaMalloc failed in any replayed iteration: every failure ends in a cudaFree
        (a reorganisation or an oversize release) or in OOM."""
        return (not r.oom and r.cuda_frees == 0 and r.warmup.get("cuda_free", 0) == 0
                and r.reorganizations == 0 and r.warmup.get("reorganizations", 0) == 0)

    def reserved_above(self, r: IterationReplay) -> int:
        """The most bytes ``r``'s iterations reserved on top of the static segments."""
        return r.peak_reserved_bytes - self.reserved

    def moved_to(self, other: "_StaticBase", r: IterationReplay, margins: list[list[int]], capacity: int,
                 static: tuple[Request, ...]) -> IterationReplay:
        """``r`` (replayed on this base, with the large pool's ``margins`` per iteration) as
        replayed on ``other`` at ``capacity``."""
        dr, da = other.reserved - self.reserved, other.allocated - self.allocated
        df = other.large_free - self.large_free

        def recount(failures: int, its: list[list[int]]) -> int:
            return failures + sum((x + df >= 0) - (x >= 0) for it in its for x in it)

        static_bytes = sum(q[2] for q in static)
        peak, at_peak = r.peak_allocated_bytes + da, r.reserved_at_peak_allocated_bytes + dr
        warmup = dict(r.warmup)
        warmup["fragmentation_failures"] = recount(warmup["fragmentation_failures"], margins[:-1])
        return replace(  # shares r's lists and dicts: the caller copies what it keeps or hands out
            r, capacity_bytes=capacity, static_bytes=static_bytes,
            max_live_bytes=r.max_live_bytes - r.static_bytes + static_bytes,
            peak_reserved_bytes=r.peak_reserved_bytes + dr, peak_allocated_bytes=peak,
            reserved_at_peak_allocated_bytes=at_peak,
            fragmentation_at_peak=fragmentation(peak, at_peak),
            fragmentation_failures=recount(r.fragmentation_failures, margins[-1:]), warmup=warmup,
            series_reserved_bytes=[x + dr for x in r.series_reserved_bytes],
            series_allocated_bytes=[x + da for x in r.series_allocated_bytes],
            segments=r.segments + other.segments - self.segments)


def _copy_replay(r: IterationReplay, **changes) -> IterationReplay:
    """A copy of ``r`` that shares nothing mutable with it (the cache keeps its own)."""
    out = copy.deepcopy(r)
    for k, v in changes.items():
        setattr(out, k, v)
    return out
