"""SPPO's search beside the rest of the analytic tier (`memo_sim.search.sppo_beside`) and the
stream it comes back on (`memo_sim.forked.ForkedStream`): values in order as the child makes
them, shared objects back as this process's own, an error raised here, a dead child's work done
here; the what-if answers (and refuses) with the search in a child what it answers with it here."""

from __future__ import annotations

import os
import signal

import pytest

from memo_sim.errors import MemoError
from memo_sim.forked import ForkedStream
from memo_sim.model.config import get_model
from memo_sim.profile import load_profile
from memo_sim.search import whatif as w
from memo_sim.search.sppo_beside import SppoBeside

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="the search beside forks")


@needs_fork
def test_stream_values_in_order_with_shared_objects_back_as_themselves():
    shared = {"a": [1, 2]}, object.__new__(type("Marker", (), {}))
    other = {"b": 3}

    def make():
        yield os.getpid(), shared[0], other
        yield shared[1]

    s = ForkedStream(make, shared=shared)
    try:
        pid, a, b = s.next()
        assert pid != os.getpid()
        assert a is shared[0]  # the very object, not a copy
        assert b == other and b is not other  # not shared: a copy
        assert s.next() is shared[1]
        assert s.next() is None  # past the last value
    finally:
        s.close()


@needs_fork
def test_stream_error_raised_here_and_dead_child_gives_none():
    def bad():
        yield 1
        raise ValueError("bad value")

    s = ForkedStream(bad)
    try:
        assert s.next() == 1
        with pytest.raises(ValueError, match="bad value"):
            s.next()
    finally:
        s.close()

    def slow():
        import time

        time.sleep(60)
        yield 1

    s = ForkedStream(slow)
    os.kill(s.pid, signal.SIGKILL)
    assert s.next() is None
    s.close()
    assert s.pid is None


def _search(bounds=None):
    return ("search", [{"n": i} for i in range(3)], [], "")


@needs_fork
def test_beside_result_and_summaries_of_the_chosen():
    b = SppoBeside(_search, lambda cands: [cands[2], cands[0]], lambda c: {"sim": c["n"]})
    try:
        search, cands, rejected, why = b.result()
        assert (search, rejected, why) == ("search", [], "")
        assert cands == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert b.has(cands[0]) and b.has(cands[2]) and not b.has(cands[1])
        assert b.take(cands[0]) == {"sim": 0}  # the later one first: read past the other
        assert b.take(cands[2]) == {"sim": 2}
    finally:
        b.close()


@needs_fork
def test_beside_child_that_dies_leaves_the_search_and_simulations_here():
    parent = os.getpid()

    def search(bounds=None):
        if os.getpid() != parent:
            os._exit(3)
        return _search()

    b = SppoBeside(search, lambda cands: cands, lambda c: {})
    try:
        _s, cands, _r, _w = b.result()
        assert cands == [{"n": i} for i in range(3)]
        assert not b.has(cands[0])  # tier 2 simulates them
    finally:
        b.close()


def test_beside_without_fork_runs_the_search_here(monkeypatch):
    from memo_sim.search import sppo_beside

    monkeypatch.setattr(sppo_beside, "FORKS", False)
    b = SppoBeside(_search, lambda cands: cands, lambda c: {})
    assert b.result()[1] == [{"n": i} for i in range(3)]
    assert not b.has(b.result()[1][0])
    b.close()


@needs_fork
def test_whatif_refuses_with_the_same_words_with_the_search_beside():
    """A query nothing can run (SPPO searched, every layout rejected): the same reason either way."""
    msgs = []
    for jobs in (1, 2):
        with pytest.raises(MemoError) as e:
            w.rank(get_model("gpt-7b"), 131072, 6, load_profile("a800-80gb"), jobs=jobs, tp=4,
                   policies=("store_all", "sppo"))
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


@needs_fork
def test_whatif_lists_sppo_rows_where_the_search_here_lists_them():
    """Every candidate in the same order (a stable sort of the list built: SPPO's rows after the
    single stage's, before the pipelines'), with the search here and beside."""
    seen = {}
    for jobs in (1, 2):
        beside = (lambda search, shared: SppoBeside(search, lambda cands: [], lambda c: {}, shared)) if jobs == 2 \
            else None
        res = w.candidates_for(get_model("gpt-7b"), 131072, 8, load_profile("a800-80gb"),
                               policies=("store_all", "sppo"), schedules=("single_stage", "sppo", "1f1b"),
                               sppo_beside=beside)
        seen[jobs] = [(c.schedule, c.layout.label(), c.policy.label(), c.estimate.iteration_s)
                      for c in res.candidates]
        assert any(s == "sppo" for s, *_ in seen[jobs]) and any(s == "1f1b" for s, *_ in seen[jobs])
    assert seen[1] == seen[2]
