"""SPPO's candidates simulated ahead (`memo_sim.search.sim_ahead`) while the analytic tier goes on:
the summaries are the ones simulated in this process, tier 2 takes them instead of simulating
again; one pool of workers for every batch of a query's tier 2 (`Tier2Pool`) returns the serial
summaries; and a what-if with ``jobs`` > 1 (SPPO's search beside the rest, `memo_sim.search.sppo_beside`)
answers what it answers with one job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memo_sim.model.config import get_model
from memo_sim.profile import load_profile
from memo_sim.search import whatif as w
from memo_sim.search.sim_ahead import SimulatedAhead

REPO = Path(__file__).resolve().parents[1]


def _strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "sim_wall_s"}


@pytest.fixture(scope="module")
def cands():
    res = w.candidates_for(get_model("gpt-7b"), 32768, 8, load_profile("a800-80gb"),
                           policies=("store_all", "full_recompute"))
    return [c for c in res.candidates if c.memory.status == "OK"][:8]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="simulating ahead forks")
def test_ahead_summaries_are_the_plain_ones_and_tier2_takes_them(cands, monkeypatch):
    cands = cands[:3]
    ahead = SimulatedAhead(cands[:2], [w._summary_args(c, True, 0) for c in cands[:2]], w._simulate_summary)
    try:
        plain = [w._simulate_summary(w._summary_args(c, True, 0)) for c in cands]
        simulated_here = []
        real = w._simulate_summary
        monkeypatch.setattr(w, "_simulate_summary", lambda args: simulated_here.append(args) or real(args))
        got = w.simulate_candidates(cands, jobs=1, ahead=ahead)
    finally:
        ahead.close()
    assert [_strip(g) for g in got] == [_strip(p) for p in plain]
    assert [c.simulated for c in cands] == got
    assert len(simulated_here) == 1 and simulated_here[0][1] is cands[2].layout  # only the one not ahead


@pytest.mark.skipif(not hasattr(os, "fork"), reason="simulating ahead forks")
def test_close_ends_every_child_never_read(cands):
    ahead = SimulatedAhead(cands[:2], [w._summary_args(c, True, 0) for c in cands[:2]], w._simulate_summary,
                           children=2)
    pids = [c.pid for c in ahead._children]
    assert len(pids) == 2
    ahead.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left


@pytest.mark.skipif(not hasattr(os, "fork"), reason="simulating ahead forks")
def test_children_share_the_work_and_each_summary_is_the_plain_one(cands):
    """Three candidates in two children, the heaviest alone: each summary is the one simulated
    here, whichever child ran it and in whatever order they are taken."""
    cands = cands[:3]
    weights = [1, 5, 2]
    ahead = SimulatedAhead(cands, [w._summary_args(c, True, 0) for c in cands], w._simulate_summary, children=2,
                           weights=weights)
    try:
        assert sorted(c.items for c in ahead._children) == [[0, 2], [1]]
        got = [ahead.take(c) for c in reversed(cands)][::-1]
    finally:
        ahead.close()
    plain = [w._simulate_summary(w._summary_args(c, True, 0)) for c in cands]
    assert [_strip(g) for g in got] == [_strip(p) for p in plain]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="simulating ahead forks")
def test_a_child_that_dies_leaves_its_candidates_to_the_caller():
    """A child killed before it answers: `take` says None for its candidates (tier 2 then simulates
    them itself), and the other child's summaries still come back."""
    import signal
    import time

    def fn(x):
        if x == "slow":
            time.sleep(60)
        return {"x": x}

    cands = [object(), object()]
    ahead = SimulatedAhead(cands, ["slow", "fast"], fn, children=2)
    try:
        os.kill(ahead._of[0].pid, signal.SIGKILL)
        assert ahead.take(cands[0]) is None
        assert ahead.take(cands[1]) == {"x": "fast"}
    finally:
        ahead.close()


def test_share_out_gives_the_longest_to_the_least_loaded():
    from memo_sim.search.sim_ahead import share_out

    assert share_out([3, 1, 2], 2) == [[0], [1, 2]]
    assert share_out([1, 1, 1], 1) == [[0, 1, 2]]
    assert share_out([5], 4) == [[0]]  # never more children than candidates
    assert share_out([2, 2, 1, 1], 2) == [[0, 2], [1, 3]]
    assert share_out([], 3) == []


def test_one_weight_per_candidate(cands):
    with pytest.raises(ValueError, match="one weight per candidate"):
        SimulatedAhead(cands[:2], [w._summary_args(c, True, 0) for c in cands[:2]], w._simulate_summary,
                       weights=[1.0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the pool forks")
def test_one_pool_for_every_batch_returns_the_serial_summaries(cands):
    assert len(cands) == 8
    plain = [_strip(w._simulate_summary(w._summary_args(c, True, 0))) for c in cands]
    pool = w.Tier2Pool(cands, 2)
    try:
        first = w.simulate_candidates(cands[:4], jobs=2, pool=pool)
        executor = pool._executor
        assert executor is not None  # the pool served the batch
        second = w.simulate_candidates(cands[4:], jobs=2, pool=pool)
        assert pool._executor is executor  # the second batch forked nothing
    finally:
        pool.close()
    assert [_strip(s) for s in first + second] == plain
    assert not pool.serves(cands[:4], True, 1)  # another stream lag: not these workers' work


def test_whatif_with_two_jobs_answers_what_one_job_does():
    """A query with SPPO candidates and pipelines: every candidate's row and tier 2's report equal (MEMO
    searched too: the SPPO vs MEMO verdict's SPPO side is what the bound search simulates ahead)."""
    code = r'''
import json
from memo_sim.model.config import get_model
from memo_sim.profile import load_profile
from memo_sim.search import sppo_beside, whatif as w
started = []
orig = sppo_beside.SppoBeside.result
def spy(self):
    first = self._result is None
    out = orig(self)
    if first:
        started.append(len(self._ids))
    return out
w.SppoBeside.result = spy
out = {}
for jobs in (1, 2):
    r = w.rank(get_model("gpt-7b"), 131072, 8, load_profile("a800-80gb"), jobs=jobs,
               schedules=("single_stage", "1f1b", "sppo"), policies=("store_all", "memo", "sppo"))
    rows = [c.to_json() for c in r.candidates]
    for row in rows:
        row.pop("simulated_sim_wall_s", None)
        (row.get("simulated") or {}).pop("sim_wall_s", None)
    sims = sum(1 for row in rows if "simulated_status" in row and row["schedule"] == "sppo")
    out[jobs] = json.dumps({"rows": rows, "tier2": r.tier2.to_dict(), "sppo": r.sppo_summary}, sort_keys=True,
                           default=str)
print(json.dumps({"same": out[1] == out[2], "started": started, "sppo_simulated": sims}))
'''
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["started"] and got["started"][0] >= 1  # jobs=2 searched SPPO beside and simulated ahead
    assert got["sppo_simulated"] >= got["started"][0]  # the rows compared hold their simulated summaries
    assert got["same"]


def test_sppo_always_lists_each_candidate_once_in_rank_order():
    """The heuristic choice that is also among the n best SPPO candidates is simulated (and
    listed) once; unfit and non-SPPO candidates are never picked."""
    from types import SimpleNamespace as NS

    from memo_sim.search.whatif import sppo_always

    def cand(status, roles=None, sppo=True):
        return NS(memory=NS(status=status), sppo={"roles": roles or []} if sppo else None)

    plain, best, heur, unfit, third = (cand("OK", sppo=False), cand("OK"), cand("OK", ["heuristic"]),
                                       cand("OOM", ["heuristic"]), cand("OK"))
    ranked = [plain, best, heur, unfit, third]
    picked = sppo_always(ranked, 2)
    assert [id(c) for c in picked] == [id(heur), id(best)]
    assert [id(c) for c in sppo_always(ranked, 3)] == [id(heur), id(best), id(third)]
    assert sppo_always(ranked, 0) == [heur]
