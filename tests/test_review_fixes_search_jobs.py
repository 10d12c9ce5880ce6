"""The bound search's answer does not depend on --jobs (a review: ``--jobs 4`` simulated in batches of 8 and ranked
79 plans where ``--jobs 1`` ranked 76, its margin and rows differing). The pool is fed 2 x jobs candidates at a
time, the stop decided 4 at a time as the serial run does, and what was simulated past the stop is dropped."""

from __future__ import annotations

import random

import pytest

from memo_sim.search import prune


class _Cand:
    def __init__(self, ub: float, tgs: float, ok: bool = True):
        self.ub, self.tgs, self.ok, self.simulated = ub, tgs, ok, None


def _run(cands, window, always=()):
    calls = []

    def simulate(chunk):
        calls.append(len(chunk))
        for c in chunk:
            c.simulated = {"status": "OK" if c.ok else "OOM", "tgs_tokens_per_gpu_s": c.tgs}

    rep = prune.simulate_by_bound(cands, simulate, batch=4, window=window, always=list(always))
    return rep, [c.simulated is not None for c in cands], calls


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("window", [8, 12, 16, 5])
def test_the_window_changes_how_many_run_at_once_not_what_is_simulated(seed, window, monkeypatch):
    monkeypatch.setattr(prune, "tgs_upper_bound", lambda c: c.ub)
    rng = random.Random(seed)

    def fresh():
        r = random.Random(seed)
        out = []
        for _ in range(rng.randint(1, 40)):
            ub = r.uniform(50, 100)
            out.append(_Cand(ub, ub * r.uniform(0.5, 1.0), ok=r.random() > 0.1))
        return out

    rng_state = rng.getstate()
    a = fresh()
    rng.setstate(rng_state)
    b = fresh()
    always_a = [a[-1]] if seed % 3 == 0 else []
    always_b = [b[-1]] if seed % 3 == 0 else []
    rep_a, sim_a, calls_a = _run(a, None, always_a)
    rep_b, sim_b, calls_b = _run(b, window, always_b)
    assert sim_a == sim_b
    assert (rep_a.simulated, rep_a.skipped_by_bound, rep_a.margin, rep_a.best_tgs) == \
        (rep_b.simulated, rep_b.skipped_by_bound, rep_b.margin, rep_b.best_tgs)
    assert max(calls_a, default=0) <= 4 + len(always_a)


def test_a_wider_window_feeds_more_at_once(monkeypatch):
    monkeypatch.setattr(prune, "tgs_upper_bound", lambda c: c.ub)
    cands = [_Cand(100 - i, 1.0) for i in range(40)]  # every bound above the best: all simulated
    _rep, _sim, calls = _run(cands, 16)
    assert calls[0] == 16
