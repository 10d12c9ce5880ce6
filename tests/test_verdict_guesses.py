"""While the what-if waits for the child's simulation of the SPPO verdict side, it simulates the plan the verdict
is likely to name next (`memo_sim.search.verdicts.likely_next_sides`, `memo_sim.search.whatif._guess_sides`); the
verdict takes that summary where it names the plan, and drops it where not, so the answer is the one without
guesses (2026-12-02: GPT-13B / 64 A800s / 1M simulated the child's N = 512 plan, then N = 256 here, one after
the other)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from memo_sim.layout.parallel import Layout
from memo_sim.policy import get_policy
from memo_sim.search.prune import _BOUND_ATTR
from memo_sim.search.verdicts import TIERS_GAP, likely_next_sides


@dataclass
class Est:
    tgs: float
    iteration_s: float = 1.0


@dataclass(eq=False)
class Cand:
    layout: Layout
    policy: object
    tgs: float
    bound: float
    sppo: object = None
    status: str = "OK"
    simulated: dict | None = None
    estimate: Est = field(init=False)

    def __post_init__(self):
        self.estimate = Est(self.tgs)
        self.__dict__[_BOUND_ATTR] = self.bound


def _sppo(tgs, bound):
    return Cand(Layout(tp=4, pp=8), get_policy("sppo"), tgs, bound, sppo={"subseqs": 256})


def test_the_pending_sides_next_plan_of_the_highest_bound_above_the_gap():
    memo = Cand(Layout(tp=8), get_policy("memo", 0.3), 125.0, 125.5, simulated={"status": "OK"})
    first = _sppo(118.87, 118.90)
    near, nearer, far = _sppo(118.0, 118.50), _sppo(118.2, 118.79), _sppo(110.0, 118.87 * (1 - TIERS_GAP) - 0.01)
    cands = [memo, first, near, nearer, far]
    pending = {id(first)}
    assert likely_next_sides(cands, lambda c: id(c) in pending) == [nearer]  # one a side: the highest bound
    assert likely_next_sides([memo, first, far], lambda c: id(c) in pending) == []  # below the gap: no guess
    assert likely_next_sides(cands, lambda c: False) == []  # nothing pending: nothing to guess
    first.simulated = {"status": "OK"}  # known: the verdict itself names what it needs
    assert likely_next_sides(cands, lambda c: id(c) in pending) == []


@pytest.mark.slow
def test_the_verdict_takes_the_guess_and_the_answer_is_the_one_without_guesses(monkeypatch):
    """GPT-13B / 64 A800s / 1M (the README's cluster query): with the SPPO search beside, the plan the verdict names
    after the child's SPPO plan was simulated while waiting, and the verdict took that summary; the simulated plans
    and every summary are the ones of a run in one process (no child, no guess)."""
    from memo_sim.forked import FORKS
    from memo_sim.model import get_model
    from memo_sim.profile import load_profile
    import memo_sim.search.whatif as w

    if not FORKS:
        pytest.skip("the SPPO search runs beside only where the platform forks")
    args = (get_model("gpt-13b"), 1 << 20, 64, load_profile("a800-80gb"))
    made: list[dict] = []
    real = w._guess_sides

    def spy(candidates, beside, guessed, allocator_lag):
        real(candidates, beside, guessed, allocator_lag)
        made.extend(guessed.values())

    monkeypatch.setattr(w, "_guess_sides", spy)
    two = w.rank(*args, jobs=2)
    one = w.rank(*args, jobs=1)

    def simulated(r):
        return {(c.layout.label(), c.policy.label(), c.schedule): {k: v for k, v in c.simulated.items()
                                                                 if k != "sim_wall_s"}
                for c in r.candidates if c.simulated is not None}

    assert simulated(two) == simulated(one)
    assert two.tier2.line() == one.tier2.line()
    taken = [c for c in two.candidates if c.simulated is not None and any(c.simulated is m for m in made)]
    assert made and taken, "the verdict's next SPPO plan was simulated while waiting and taken from there"
    assert all(c.sppo is not None for c in taken)


def test_two_pipelines_go_to_the_pool_however_few():
    """Fewer than PARALLEL_MIN candidates are simulated in this process, unless two or more are pipelines (a
    verdict round of two SPPO plans ran one after the other): then the pool takes them, with the serial summaries."""
    import memo_sim.search.whatif as w
    from memo_sim.model import get_model
    from memo_sim.profile import load_profile

    if not w.Tier2Pool([], 2).usable:
        pytest.skip("no forked pool on this platform")
    res = w.candidates_for(get_model("gpt-7b"), 32768, 8, load_profile("a800-80gb"), tp=2, pp=2, schedules=["1f1b"])
    two = [c for c in res.candidates if c.memory.status == "OK" and c.schedule != "single_stage"][:2]
    assert len(two) == 2 and len(two) < w.PARALLEL_MIN
    pool = w.Tier2Pool(two, 2)
    sent: list = []
    real = pool.submit
    pool.submit = lambda chunk: sent.append(chunk) or real(chunk)
    try:
        pooled = w.simulate_candidates(two, jobs=2, pool=pool)
    finally:
        pool.close()
    assert sorted(len(chunk) for chunk in sent) == [1, 1]  # one pipeline a task
    for c in two:
        c.simulated = None
    serial = w.simulate_candidates(two, jobs=1)
    assert [{k: v for k, v in s.items() if k != "sim_wall_s"} for s in pooled] == \
        [{k: v for k, v in s.items() if k != "sim_wall_s"} for s in serial]
