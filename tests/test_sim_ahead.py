"""Tier 2's summaries taken from where they were simulated early (SPPO's search beside the rest,
`memo_sim.search.sppo_beside`: tier 2 takes its child's summaries instead of simulating again, and
they are the ones simulated in this process); one pool of workers for every batch of a query's tier 2
(`Tier2Pool`) returns the serial summaries; and a what-if with ``jobs`` > 1 answers what it answers
with one job."""

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
from memo_sim.search.sppo_beside import SppoBeside

REPO = Path(__file__).resolve().parents[1]


def _strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "sim_wall_s"}


@pytest.fixture(scope="module")
def cands():
    res = w.candidates_for(get_model("gpt-7b"), 32768, 8, load_profile("a800-80gb"),
                           policies=("store_all", "full_recompute"))
    return [c for c in res.candidates if c.memory.status == "OK"][:8]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="simulating ahead forks")
def test_summaries_from_the_child_are_the_plain_ones_and_tier2_takes_them(cands, monkeypatch):
    """Two candidates simulated in `SppoBeside`'s child: tier 2 takes their summaries (the ones simulated
    here) and simulates only the third itself."""
    cands = cands[:3]
    model, profile = cands[0].model, cands[0].profile
    beside = SppoBeside(lambda bounds=None: (None, cands, [], ""), lambda cs: cs[:2],
                        lambda c: w._simulate_summary(w._summary_args(c, True, 0)), shared=(model, profile))
    try:
        _s, got_cands, _r, _w = beside.result()
        assert got_cands[0].model is model and got_cands[0].profile is profile  # shared, not copies
        plain = [w._simulate_summary(w._summary_args(c, True, 0)) for c in got_cands]
        simulated_here = []
        real = w._simulate_summary
        monkeypatch.setattr(w, "_simulate_summary", lambda args: simulated_here.append(args) or real(args))
        got = w.simulate_candidates(got_cands, jobs=1, ahead=beside)
    finally:
        beside.close()
    assert [_strip(g) for g in got] == [_strip(p) for p in plain]
    assert [c.simulated for c in got_cands] == got
    assert len(simulated_here) == 1 and simulated_here[0][1] == got_cands[2].layout  # only the one not ahead


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
