"""Issue 47 item 3: remove each wait of the executor in turn -- every call site `tests/wait_sites.py`
finds in the code -- and the race detector (`memo_exec.happens_before`) must refuse the run with a
`RaceError` at issue time, on every rank, within `CATCH_S` seconds.

First a coverage pass: each scenario (single-device MEMO offload, SPPO on one and on two ranks,
ring CP, METP's ring attention and a whole METP layer with the W_proj ring, the pipeline's 1F1B
under store all and under MEMO (its rank-level rounding blocks), MoE with expert parallelism, ZeRO 3 (its
all-gathers issued a layer ahead); tiny
models, fp64) runs once unmutated, counting the sites it calls (`memo_exec.wait_switch`), and must
run clean. A site no scenario reaches fails. Then each site is removed
(`memo_exec.wait_switch.switched`) in the first scenario that reaches it, in one fresh gloo spawn
per removal (`tests.dist_harness.spawn`: ranks killed at its timeout, a hung rank fails
on gloo's timeout), so no mutation inherits another's unmatched transfers.

A wait whose removal nothing can observe is redundant: it is listed in `REDUNDANT` with why, and
its test asserts that it is still reached and still not caught (so the entry goes when either
changes). The scenarios reuse the runs of the other mutation tests (`tests/test_race_mutations.py`
and the suites it draws on).
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from tests.dist_harness import spawn
from tests.exec_helpers import time_limit
from tests.wait_scenarios import SCENARIOS, run
from tests.wait_sites import ROOT, scan

CATCH_S = 10.0  # a removed wait must be refused this soon after its run starts
SPAWN_S = 30.0  # gloo's timeout per run: a rank left waiting on a refused peer fails there
SCAN = scan()
SITES = {str(s): s for s in SCAN.sites}

# (path, function) of a wait site -> why removing it cannot be caught
REDUNDANT = {
    ("memo_exec/sppo/pipeline.py", "StageRunner._send"):
        "with a test delay, the earlier sends are waited before a send is posted, but p2p's delayed "
        "sender is one FIFO thread that already posts and completes them in order",
}


def _redundant(site) -> str | None:
    return REDUNDANT.get((site.path, site.function))


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(600):
        yield


def _spawn(scenario: str, site: str | None) -> list[dict]:
    res = spawn(run, SCENARIOS[scenario][0], scenario, site, timeout=SPAWN_S)
    assert not multiprocessing.active_children(), "a rank outlived its spawn"
    return res


# -- the coverage pass -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def coverage() -> dict[str, list[dict]]:
    """Per scenario, per rank: its unmutated run."""
    return {name: _spawn(name, None) for name in SCENARIOS}


def _reaching(coverage, site: str) -> list[str]:
    return [n for n, ranks in coverage.items() if any(r["counts"].get(site) for r in ranks)]


def test_the_scan_tells_sites_from_implementations_and_unclassified_waits(tmp_path):
    pkg = tmp_path / "memo_exec"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from memo_exec.wait_switch import wait_primitive\n"
        "class T:\n"
        "    @wait_primitive\n"
        "    def wait(self):\n"
        "        self.work.wait()\n"  # the primitive's implementation: no site
        "def use(t, s):\n"
        "    t.wait()\n"  # a site
        "    (t\n"
        "     .wait())\n"  # a site on the line of the method's name
        "    s.wait_stream(t)\n")  # a raw wait outside any primitive: unclassified
    got = scan(tmp_path)
    assert [(str(x), x.function) for x in got.sites] == [("memo_exec/m.py:7", "use"), ("memo_exec/m.py:9", "use")]
    assert got.primitives == ("memo_exec/m.py:T.wait",)
    assert got.unclassified == ("memo_exec/m.py:10 use: .wait_stream()",)


def test_the_env_switch_is_read_at_import():
    import subprocess
    import sys

    code = "import memo_exec.wait_switch as w; print(w._ACTIVE.file, w._ACTIVE.line)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "MEMO_EXEC_SKIP_WAIT": "memo_exec/metp/ffn.py:121"}).stdout.split()
    assert out == [str(ROOT / "memo_exec/metp/ffn.py"), "121"]


def test_the_scan_classifies_every_wait_like_call():
    names = {p.rsplit(".", 1)[-1] for p in SCAN.primitives}
    assert SCAN.sites and names == {s.callee for s in SCAN.sites}, "a primitive no site calls, or vice versa"
    assert not SCAN.unclassified, f"wait-like calls neither sites nor in NOT_SITES: {SCAN.unclassified}"
    assert not SCAN.stale, f"NOT_SITES entries that match no call: {SCAN.stale}"
    assert set(REDUNDANT) <= {(s.path, s.function) for s in SCAN.sites}, "a REDUNDANT entry matches no site"


def test_every_scenario_runs_clean(coverage):
    bad = {n: [r["outcome"] for r in ranks] for n, ranks in coverage.items()
           if any(r["outcome"] != "ok" for r in ranks)}
    assert not bad, bad


def test_every_wait_site_is_reached(coverage):
    missing = [f"{s} ({SITES[s].function})" for s in SITES if not _reaching(coverage, s)]
    assert not missing, f"wait sites no scenario reaches: {missing}"


# -- one removal per site ----------------------------------------------------------------------------
def _removal(coverage, site: str) -> tuple[str, list[dict]]:
    reach = _reaching(coverage, site)
    assert reach, f"{site} ({SITES[site].function}): no scenario reaches it"
    return reach[0], _spawn(reach[0], site)


@pytest.mark.parametrize("site", [s for s in SITES if not _redundant(SITES[s])])
def test_a_removed_wait_is_caught_at_issue_time(coverage, site):
    scenario, ranks = _removal(coverage, site)
    where = f"{site} ({SITES[site].function}) in {scenario!r}"
    assert any(r["skipped"] for r in ranks), f"{where}: no call removed"
    for rank, r in enumerate(ranks):
        assert r["race"], f"{where}, rank {rank}: {r['outcome']}"
        assert r["seconds"] < CATCH_S, f"{where}, rank {rank}: caught after {r['seconds']:.1f} s"


@pytest.mark.parametrize("site", [s for s in SITES if _redundant(SITES[s])])
def test_a_redundant_wait_stays_redundant(coverage, site):
    scenario, ranks = _removal(coverage, site)
    assert any(r["skipped"] for r in ranks), f"{site}: no call removed"
    assert all(r["outcome"] == "ok" for r in ranks), (
        f"{site} is caught now: drop its REDUNDANT entry ({[r['outcome'] for r in ranks]})")
