"""The kinds of entry in the engine's event log (`memo_sim.engine.core.EngineRun.events`).

The log is a list of ``(kind, x)`` pairs in the order things happened: an op started
(``x``: the `Op`), an op ended (``x``: the `Op`), or a memory sample was taken (``x``: its
index in ``EngineRun.memory`` and ``EngineRun.sample_src``). `memo_sim.engine.periodic`
reads it to check that a short run repeats and to unfold it. Plain ints (an `IntEnum`) so
the hot loop's tuples stay cheap and compare by value.
"""

from __future__ import annotations

from enum import IntEnum


class EventKind(IntEnum):
    OP_START = 0
    OP_END = 1
    MEMORY_SAMPLE = 2


# module-level aliases: the engine's hot loop and the fold read these names (one global lookup)
OP_START = EventKind.OP_START
OP_END = EventKind.OP_END
MEMORY_SAMPLE = EventKind.MEMORY_SAMPLE
