"""[sim-speed]: the memoised analytic tier prices exactly what a cold computation prices, the
engine's fast paths keep the timeline, and tier 2 in a process pool returns the serial run's
results in the same order (multi-process parts run under a subprocess timeout)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memo_sim.cost.memo import clear_caches, memoised
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.search.whatif import candidates_for, make_candidate, simulate_candidates

REPO = Path(__file__).resolve().parents[1]
K = 1024
WALL_KEYS = ("sim_wall_s", "elapsed_s", "simulated_sim_wall_s")


def _strip_wall(obj):
    """Everything but the host seconds a run took (the only field that may differ between runs)."""
    if isinstance(obj, dict):
        return {k: _strip_wall(v) for k, v in obj.items() if k not in WALL_KEYS}
    if isinstance(obj, list):
        return [_strip_wall(v) for v in obj]
    return obj


def test_memoised_analytic_tier_equals_cold_computation():
    """Every candidate of a what-if (shared shards, policies, DP/ZeRO variants) priced from warm
    caches equals the same candidate priced with every cache emptied first."""
    profile = load_profile("a800-80gb")
    model = get_model("gpt-7b")
    warm = candidates_for(model, 256 * K, 16, profile, policies=("store_all", "full_recompute", "full_offload", "memo"))
    picked = warm.candidates[::7][:40]
    assert len({c.layout.label() for c in picked}) > 10
    for c in picked:
        clear_caches()
        cold = make_candidate(model, c.layout, c.policy.name, 1, 256 * K, profile,
                              c.policy.alpha if c.policy.takes_alpha else None)
        assert cold.estimate == c.estimate, c.layout.label()
        assert cold.memory == c.memory, c.layout.label()


def test_memoised_profiles_by_identity():
    """Two profiles never share an entry (they are keyed by identity and kept alive)."""
    calls = []

    @memoised(maxsize=2)
    def f(x, profile):
        calls.append(x)
        return (x, profile.name)

    a, b = load_profile("a800-80gb"), load_profile("h100-sxm5-80gb")
    assert f(1, a) == (1, "a800-80gb") and f(1, b) == (1, "h100-sxm5-80gb") and f(1, a) == (1, "a800-80gb")
    assert calls == [1, 1]
    f(2, a)  # the cache was full: emptied, then refilled
    assert f(1, a) == (1, "a800-80gb") and calls == [1, 1, 2, 1]


@pytest.mark.parametrize("policy,alpha,layout", [
    ("store_all", None, Layout(tp=8)),  # no copy: kernels run as plain timeouts (64K tokens fit)
    ("memo", 0.4, Layout(tp=4, cp=2, zero=3)),  # copies slow the kernels of their device
    ("full_offload", None, Layout(tp=2, cp=4, dp=1)),
])
def test_engine_fast_paths_keep_the_link_accounting(policy, alpha, layout):
    """Each link carries exactly the bytes its ops move, and no link is ever over capacity, with
    kernels outside the link computation and rates recomputed per connected component."""
    seq = 64 * K if policy == "store_all" else 256 * K
    r = simulate(get_model("gpt-7b"), layout, 1, seq, get_policy(policy, alpha), load_profile("a800-80gb"),
                 keep_timeline=False, record=True)
    assert r.ok
    for t, load in r.link_log:
        for name, rate in load.items():
            assert rate <= r.link_capacity[name] * (1 + 1e-9), (t, name)
    copies = sum(o.nbytes for o in r.ops if o.kind == "copy")
    pcie = sum(v for k, v in r.link_carried.items() if k.startswith("pcie."))
    assert pcie == pytest.approx(copies, rel=1e-9)


def test_parallel_tier2_equals_serial_in_order():
    """simulate_candidates with jobs=2 returns the serial summaries (less wall seconds), in order."""
    code = r'''
import json, sys
from memo_sim.model.config import get_model
from memo_sim.profile import load_profile
from memo_sim.search.whatif import candidates_for, simulate_candidates
res = candidates_for(get_model("gpt-7b"), 131072, 8, load_profile("a800-80gb"),
                     policies=("store_all", "full_recompute", "full_offload", "memo"))
cands = res.candidates[:6]
serial = simulate_candidates(cands, jobs=1)
order = []
parallel = simulate_candidates(cands, jobs=2, progress=lambda d, t: order.append(d))
strip = lambda d: {k: v for k, v in d.items() if k != "sim_wall_s"}
print(json.dumps({"same": [strip(a) == strip(b) for a, b in zip(serial, parallel)], "n": len(parallel),
                  "order": order, "stored": [c.simulated is p for c, p in zip(cands, parallel)]}))
'''
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["n"] == 6 and all(got["same"]) and all(got["stored"])
    # progress comes per finished task (a chunk of candidates): increasing, up to all of them
    assert got["order"] == sorted(set(got["order"])) and got["order"][-1] == 6


def test_jobs_must_be_positive():
    from memo_sim.errors import MemoError

    with pytest.raises(MemoError, match="--jobs"):
        simulate_candidates([], jobs=0)


def test_pool_tasks_hold_every_candidate_once_pipelines_first():
    """`_chunks`: SPPO candidates one per task, first; the rest in runs of consecutive (shape-
    sorted) candidates, one run per process, cut in chunks of at most CHUNK and handed out in
    turn; every candidate in exactly one task."""
    from memo_sim.search import whatif

    prof = load_profile("a800-80gb")
    cands = candidates_for(get_model("gpt-7b"), 131072, 8, prof, policies=("store_all", "full_recompute", "sppo")
                           ).candidates
    heavy = [i for i, c in enumerate(cands) if c.schedule != "single_stage"]
    assert heavy and len(cands) - len(heavy) > 3 * whatif.CHUNK
    for jobs in (1, 2, 3):
        tasks = whatif._chunks(cands, jobs)
        flat = [i for t in tasks for i in t]
        assert sorted(flat) == list(range(len(cands)))
        assert sorted(i for t in tasks[:len(heavy)] for i in t) == heavy and all(len(t) == 1 for t in tasks[:len(heavy)])
        light = tasks[len(heavy):]
        assert all(1 <= len(t) <= whatif.CHUNK for t in light)
        by_shape = sorted((i for i in range(len(cands)) if i not in heavy), key=lambda i: whatif._locality(cands[i]))
        assert ([i for t in light for i in t] == by_shape) == (jobs == 1)  # runs interleaved
        key = [whatif._locality(cands[i]) for t in light[::jobs] for i in t]
        assert key == sorted(key)  # the first run's chunks, in shape order
    only_pipelines = [cands[i] for i in heavy]
    assert sorted(whatif._chunks(only_pipelines, 2)) == [[i] for i in range(len(heavy))]


def test_serial_tier2_restores_the_collector_thresholds():
    """Tier 2 collects less often while it runs (`GC_THRESHOLDS`) and gives the caller's
    thresholds back, also when a simulation raises."""
    import gc

    from memo_sim.search import whatif

    cands = candidates_for(get_model("gpt-7b"), 65536, 8, load_profile("a800-80gb"), policies=("store_all",)
                           ).candidates[:2]
    session = gc.get_threshold()  # the test session's (tests/conftest.py: GC_THRESHOLDS itself)
    before = (700, 10, 10)  # a caller's thresholds other than tier 2's, so that giving them back shows
    gc.set_threshold(*before)
    seen = []
    real = whatif._simulate_summary

    def spy(w):
        seen.append(gc.get_threshold())
        return real(w)

    try:
        whatif._simulate_summary = spy
        whatif.simulate_candidates(cands, jobs=1)
        assert seen == [whatif.GC_THRESHOLDS] * 2 and gc.get_threshold() == before

        def boom(w):
            raise RuntimeError("x")

        whatif._simulate_summary = boom
        with pytest.raises(RuntimeError):
            whatif.simulate_candidates(cands, jobs=1)
        assert gc.get_threshold() == before
    finally:
        whatif._simulate_summary = real
        gc.set_threshold(*session)
