"""SPPO's bounding pass shared between the what-if's two processes
(`memo_sim.search.sppo.shared_bounds`, `memo_sim.forked.Handoff`): the split covers every point
once, the search with the shared pass finds bit for bit what the plain one finds (also where the
parent sends nothing), the handoff carries a value across a fork and says None where none came;
and the plan built while the what-if waits (`memo_sim.search.plan_build.prebuild_plan`) is the
plan built afterwards."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from memo_sim.forked import ForkedStream, Handoff
from memo_sim.model.config import get_model
from memo_sim.profile import load_profile
from memo_sim.search.sppo import search_sppo
from memo_sim.search.sppo.shared_bounds import ChildShare, HandedOver, ParentShare, split

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="the handoff crosses a fork")
A800 = load_profile("a800-80gb")
MODEL = replace(get_model("gpt-7b"), layers=8)
SEQ, GPUS = 131072, 16


class _FakeHandoff:
    """A handoff inside one process: what `send` got is what `receive` gives."""

    def __init__(self, value=None):
        self.value = value

    def send(self, value):
        self.value = value

    def receive(self):
        return self.value


def _found(search) -> list:
    return [search.space_size, search.solved, search.best.to_dict() if search.best else None,
            [(p.to_dict(), p.lower_bound_s, p.grid, p.estimate) for p in search.points]]


def _parent_sent() -> dict:
    h = _FakeHandoff()
    with pytest.raises(HandedOver):
        search_sppo(MODEL, SEQ, GPUS, A800, bounds=ParentShare(h))
    return h.value


def test_split_covers_every_point_once_and_leaves_the_dead_to_the_child():
    seen = {}

    def grab(pricing):
        seen["pricing"] = pricing
        return [pricing.price(i) for i in range(len(pricing.points))]

    search_sppo(MODEL, SEQ, GPUS, A800, bounds=grab)
    pricing = seen["pricing"]
    child, parent = split(pricing)
    assert sorted(child + parent) == list(range(len(pricing.points)))
    assert parent and child  # both share the work here
    assert all(pricing.alive(i) for i in parent)
    assert split(pricing) == (child, parent)  # the same split in both processes
    # the parent's share is the points it prices; each comes back as (seconds, threshold) or None
    sent = _parent_sent()
    assert sorted(sent) == parent
    assert any(v is not None for v in sent.values())


def test_search_with_the_shared_pass_is_the_plain_one():
    plain = _found(search_sppo(MODEL, SEQ, GPUS, A800))
    shared = _found(search_sppo(MODEL, SEQ, GPUS, A800, bounds=ChildShare(_FakeHandoff(_parent_sent()))))
    assert shared == plain  # every float bit for bit: the child rebuilds the plans from the thresholds
    alone = _found(search_sppo(MODEL, SEQ, GPUS, A800, bounds=ChildShare(_FakeHandoff(None))))
    assert alone == plain  # the parent sent nothing: the child priced its points too


@needs_fork
def test_handoff_crosses_a_fork_and_gives_none_where_nothing_was_sent():
    for value in ({"a": (1.5, 2.0), "b": None}, None):
        h = Handoff()

        def child(h=h):
            h.child_side()
            yield h.receive()

        s = ForkedStream(child)
        h.parent_side()
        try:
            if value is None:
                h.close()  # gave up: the child stops waiting
            else:
                h.send(value)
            assert s.next() == value
        finally:
            s.close()
            h.close()


@needs_fork
def test_would_wait_until_the_child_has_sent():
    r, w = os.pipe()

    def child():
        os.close(w)
        os.read(r, 1)  # until the parent says go
        yield "done"
        yield "and more"

    s = ForkedStream(child)
    os.close(r)
    try:
        assert s.would_wait()
        os.write(w, b"x")
        assert s.next() == "done"
        assert s.next() == "and more"  # read exactly: the second value was not taken with the first
        assert s.next() is None
        assert not s.would_wait()  # closed: `next` answers at once
    finally:
        os.close(w)
        s.close()


def _untimed(x):
    """A plan's dict without the times it was made and solved in (two builds differ only there)."""
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if k not in ("solve_time_s", "created")}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def test_prebuilt_plan_is_the_plan_built_after():
    from memo_sim.search import plan_build
    from memo_sim.search import whatif as w
    from memo_sim.search.plan_build import build_plan, prebuild_plan

    res = w.rank(get_model("gpt-7b"), 65536, 8, A800, simulate_top=1, policies=("memo",), schedules=("single_stage",))
    best = res.best
    fresh = build_plan(best)
    assert fresh.memory_plan is not None  # MEMO: the part worth building ahead
    prebuild_plan(best)
    made = plan_build._PREBUILT[id(best)][2]
    made.created = "made while the what-if waited"
    taken = build_plan(best)
    assert taken.created != made.created  # stamped when taken
    assert taken.memory_plan is made.memory_plan  # the prebuilt one, not solved again ...
    assert _untimed(taken.to_dict()) == _untimed(fresh.to_dict())  # ... is what a build gives
    assert id(best) not in plan_build._PREBUILT  # taken once; built afresh after
    prebuild_plan(best)
    second = plan_build._PREBUILT[id(best)][2]
    best.simulated = dict(best.simulated, iteration_s=best.simulated["iteration_s"] * 2)
    again = build_plan(best)  # the candidate changed: built afresh
    assert again.memory_plan is not second.memory_plan
    assert again.predicted.iteration_s == 2 * fresh.predicted.iteration_s
