"""[robust-runs] item 4: the DSA planner honours --time-limit with its best plan and the gap, and
`memo-sim memplan` on a large CSV shows its stages and ends in bounded time (measured as CPU time of
this process, which a loaded machine does not inflate the way it inflates wall time)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from memo_sim.cli import cli as sim_cli
from memo_sim.memplan.solve import solve_dsa
from memo_sim.request_trace import Buffer, RequestTrace


def _random_trace(n: int, seed: int) -> RequestTrace:
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, 2 * n, n)
    up = lo + rng.integers(1, 500, n)
    size = rng.integers(1, 64, n) * 4096
    return RequestTrace([Buffer(f"b{i}", int(size[i]), int(lo[i]), int(up[i])) for i in range(n)])


def _csv(path, trace: RequestTrace) -> None:
    path.write_text("id,lower,upper,size\n" + "".join(f"{b.id},{b.lower},{b.upper},{b.size}\n" for b in trace.buffers))


def test_no_search_is_set_up_once_the_greedy_has_spent_the_time_limit():
    """The search's set-up alone costs seconds on a large trace: past the deadline it is not run,
    and the answer says so and keeps the greedy's plan with its gap."""
    sol = solve_dsa(_random_trace(600, 1), time_limit_s=1e-6, solver="search")
    notes = {p.phase: p.detail for p in sol.phases}
    assert notes["search"].startswith("not run: the time limit was reached")
    assert sol.method.startswith("greedy:") and sol.gap == sol.peak_bytes / sol.lower_bound_bytes - 1 > 0


@pytest.mark.slow
def test_memplan_of_10k_rows_with_highs_stops_at_its_time_limit(tmp_path):
    """The issue's `memplan --solver mip-highs --time-limit 5` on 10k rows (still running at 60 s
    before): the solve stops at the limit with the greedy's plan and its gap, the figure of 10k
    rectangles is one collection; about 6 s of CPU in all at load 8 (was 20 s, 14 of them drawing)."""
    _csv(tmp_path / "big.csv", _random_trace(10_000, 0))
    cpu0 = time.process_time()
    r = CliRunner().invoke(sim_cli, ["memplan", "--csv", str(tmp_path / "big.csv"), "--solver",
                                                     "mip-highs", "--time-limit", "2", "--progress", "--json",
                                                     "--out", str(tmp_path / "mp")])
    cpu = time.process_time() - cpu0
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["gap"] > 0 and res["peak_bytes"] >= res["lower_bound_bytes"], res["phases"]
    assert res["solve_time_s"] < 60, res["phases"]  # wall time: 2 s + the first greedy ordering and the MIP's set-up
    assert any(p["phase"] == "mip-highs" for p in res["phases"])
    for stage in ("conflicts and sections", "greedy: placing", "checking the plan", "replaying the caching",
                  "drawing memplan.png"):
        assert stage in r.stderr, r.stderr
    assert (tmp_path / "mp" / "memplan.png").stat().st_size > 0
    assert cpu < 30, (cpu, res["phases"])


@pytest.mark.slow
def test_memplan_of_100k_rows_ends_with_its_plan_and_gap(tmp_path):
    """The issue's `memplan --csv` of 100k rows (past 60 s before): the default time limit, its
    stages shown, the greedy's plan with its gap; 19.5 s of CPU at load 7.6 (75 s wall)."""
    _csv(tmp_path / "big.csv", _random_trace(100_000, 0))
    cpu0 = time.process_time()
    r = CliRunner().invoke(sim_cli, ["memplan", "--csv", str(tmp_path / "big.csv"), "--json", "--progress"])
    cpu = time.process_time() - cpu0
    assert r.exit_code == 0, r.output[-2000:]
    res = json.loads(r.stdout)
    assert res["buffers"] == 100_000 and res["gap"] >= 0 and res["peak_bytes"] >= res["lower_bound_bytes"]
    assert "greedy: placing 100000 buffers" in r.stderr
    assert cpu < 90, (cpu, res["phases"])
