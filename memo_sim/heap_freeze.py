"""The cyclic garbage collector's permanent generation, as memo uses it: `freeze_heap` moves every object this
process holds there (`gc.freeze`: never scanned again) and remembers that it did, so that `heap_frozen` answers in
constant time where memo froze the heap itself, in this process or in one it was forked from (the flag is forked
with the heap). Elsewhere `heap_frozen` asks `gc.get_freeze_count`, which counts the frozen objects one by one.

Why it matters: `memo_sim.engine.core.gc_paused` asks after every simulation whether anything is frozen. A what-if's
pool worker freezes everything it was forked with (`memo_sim.search.whatif`), so in a worker forked from a large
process the count walked the whole inherited heap after each simulation: 0.04 s for 5 million objects, and in a
test process of several GB it was the largest single cost of a what-if (py-spy over the first fifth of CI's default
selection, 2026-12-05, 2-core VM: 553 of its 4,505 samples in that walk, all in one test's what-if, which had 692)."""

from __future__ import annotations

import gc

_frozen_by_memo = False  # set by `freeze_heap` in this process or in the one it was forked from


def freeze_heap() -> None:
    """`gc.freeze`, remembered (`heap_frozen`)."""
    global _frozen_by_memo
    gc.freeze()
    _frozen_by_memo = True


def heap_frozen() -> bool:
    """Whether any object is in the permanent generation: at once where memo froze the heap itself (`freeze_heap`;
    nothing in memo unfreezes what it froze), else by `gc.get_freeze_count` (which walks the frozen objects; where
    nothing is frozen, at once)."""
    return _frozen_by_memo or gc.get_freeze_count() > 0
