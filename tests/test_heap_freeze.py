"""A heap memo froze itself is known frozen without counting it (`memo_sim.heap_freeze`): `gc_paused`, which asks
after every simulation, counted the frozen objects one by one (`gc.get_freeze_count`), and a what-if's pool worker
freezes everything it was forked with, so each simulation in a worker forked from a large process walked that whole
heap (the largest single cost of one test's what-if inside CI's default selection, 2026-12-05)."""

from __future__ import annotations

import gc
import os

import pytest

from memo_sim import heap_freeze
from memo_sim.engine.core import gc_paused
from memo_sim.forked import ForkedStream


def _no_walk(*_a):
    raise AssertionError("gc.get_freeze_count walked the frozen heap")


def test_a_heap_memo_froze_is_not_counted_and_not_unfrozen(monkeypatch):
    monkeypatch.setattr(heap_freeze, "_frozen_by_memo", True)
    monkeypatch.setattr(gc, "get_freeze_count", _no_walk)
    monkeypatch.setattr(gc, "unfreeze", lambda: pytest.fail("gc_paused unfroze a heap memo froze"))
    assert heap_freeze.heap_frozen()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_elsewhere_the_count_decides(monkeypatch):
    """Nothing frozen by memo: a caller's own frozen objects are seen (and left frozen), an empty permanent generation
    lets the block's objects be moved to the oldest generation (freeze then unfreeze)."""
    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 7)
    assert heap_freeze.heap_frozen()
    with gc_paused():
        pass
    assert calls == []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)
    assert not heap_freeze.heap_frozen()
    with gc_paused():
        pass
    assert calls == ["freeze", "unfreeze"]


def _in_a_worker():
    """A what-if pool worker's start (`_worker_init`), then a simulation's pause, with the count made to fail."""
    from memo_sim.search.whatif import _worker_init

    _worker_init()
    gc.get_freeze_count = _no_walk  # this child's own module object: the parent's is untouched
    with gc_paused():
        pass
    yield heap_freeze.heap_frozen(), gc.isenabled(), os.getpid()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_pool_worker_knows_its_heap_frozen_without_counting_it():
    stream = ForkedStream(_in_a_worker)
    got = stream.next()
    stream.close()
    assert got is not None, "the child died"
    frozen, enabled, pid = got
    assert frozen and enabled and pid != os.getpid()
    assert not heap_freeze._frozen_by_memo and gc.get_freeze_count() == 0  # this process: untouched
