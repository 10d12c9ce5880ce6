"""`memo-sim sweep-seq` takes --jobs and --progress/--no-progress as `whatif` and `maxseq` do (a user's review:
it had neither): --jobs N simulates the runs (and --tp-mode's points) in N forked processes with the serial run's
rows in the same order, a bad --jobs is one line and exit 2, and the progress bar goes to stderr, off a terminal
only when asked. Each sweep row names its pricing tier as a what-if row does: ``tier`` in the JSON ("simulated"
for the event simulator's runs; a mode's point "analytic" where it does not fit on paper and so was not simulated),
and a ``tier`` column (sim, analytic: the what-if's words) in the text and CSV tables."""

from __future__ import annotations

import csv
import json
import os
import time
from functools import partial

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

# 8K and 1M fit on 8 GPUs (tp8); 4M does not, on paper either, in either mode: the modes' table has analytic rows
SWEEP = ["--seqs", "8K,1M,4M", "--tp-mode", "megatron,metp", "--policy", "store_all", "--policy", "memo"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    r = CliRunner().invoke(cli, ["whatif", "--layers", "2", "--gpus", "8", "--tp", "8", "--sp", "--tp-mode", "megatron",
                                 "--policy", "store_all", "--seq", "16K", "--simulate-top", "1", "--jobs", "1",
                                 "--out", str(d)])
    assert r.exit_code == 0, r.output
    return str(d / "plan.json")


def _without_walls(obj):
    """A sweep's JSON without the simulator's wall times, which differ run to run (serial runs too)."""
    if isinstance(obj, dict):
        return {k: _without_walls(v) for k, v in obj.items() if k != "sim_wall_s"}
    if isinstance(obj, list):
        return [_without_walls(v) for v in obj]
    return obj


def _sweep(plan, out, *args):
    r = CliRunner().invoke(cli, ["sweep-seq", plan, "--out", str(out), *SWEEP, *args])
    assert r.exit_code == 0, r.output
    return r


def test_jobs_gives_the_serial_rows_in_the_same_order(plan, tmp_path):
    serial = _sweep(plan, tmp_path / "serial", "--jobs", "1", "--json")
    pooled = _sweep(plan, tmp_path / "pooled", "--jobs", "3", "--json")
    for name in ("mfu_vs_seq.json", "seq_by_tp_mode.json"):
        one = json.loads((tmp_path / "serial" / name).read_text())
        many = json.loads((tmp_path / "pooled" / name).read_text())
        assert _without_walls(many) == _without_walls(one), name
    assert _without_walls(json.loads(pooled.stdout)) == _without_walls(json.loads(serial.stdout))
    runs = json.loads((tmp_path / "serial" / "mfu_vs_seq.json").read_text())
    assert [(r["seq_tokens"], r["layout"]["tp_mode"], r["policy"]["policy"]) for r in runs] == [
        (s * 1024, m, p) for m in ("megatron", "metp") for s in (8, 1024, 4096) for p in ("store_all", "memo")]
    # every run is the event simulator's, the out-of-memory ones too
    assert {r["tier"] for r in runs} == {"simulated"} and {r["status"] for r in runs} == {"OK", "OOM"}
    points = json.loads((tmp_path / "serial" / "seq_by_tp_mode.json").read_text())["points"]
    assert [(p["seq"], p["tier"]) for p in points] == [(s * 1024, "simulated" if s < 4096 else "analytic")
                                                      for _series in range(4) for s in (8, 1024, 4096)]
    assert all(p["status"] == "OOM" for p in points if p["tier"] == "analytic")


def _slow_pid(delay: float, value: int) -> tuple[int, int]:
    time.sleep(delay)
    return value, os.getpid()


def _refuse(delay: float, value: int) -> int:
    from memo_sim.errors import MemoError

    time.sleep(delay)
    raise MemoError(f"refused {value}")


def test_in_order_runs_in_other_processes_and_keeps_the_calls_order():
    from memo_sim.errors import MemoError
    from memo_sim.search.seq_sweep import in_order

    ticks = []
    calls = [partial(_slow_pid, 0.3, 0), partial(_slow_pid, 0.0, 1), partial(_slow_pid, 0.0, 2)]
    out = in_order(calls, jobs=2, done=lambda: ticks.append(1))
    assert [v for v, _pid in out] == [0, 1, 2] and len(ticks) == 3  # the first finished last
    assert os.getpid() not in {pid for _v, pid in out}  # a pool of forked processes ran them
    assert {pid for _v, pid in in_order(calls, jobs=1)} == {os.getpid()}
    for jobs in (1, 3):  # the first refusal in the calls' order is raised, not the first to come in
        with pytest.raises(MemoError, match="refused 1"):
            in_order([partial(_slow_pid, 0.0, 0), partial(_refuse, 0.3, 1), partial(_refuse, 0.0, 2)], jobs)
    with pytest.raises(MemoError, match="--jobs must be at least 1"):
        in_order(calls, jobs=0)


def test_a_bad_jobs_is_one_line_and_exit_2(plan, tmp_path):
    r = CliRunner().invoke(cli, ["sweep-seq", plan, "--out", str(tmp_path / "s"), "--seqs", "8K", "--jobs", "0"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith("error: Invalid value for '--jobs'"), r.output
    assert not (tmp_path / "s").exists()


def test_progress_goes_to_stderr_off_a_terminal_only_when_asked(plan, tmp_path):
    args = ["--seqs", "8K", "--tp-mode", "megatron,metp", "--policy", "store_all", "--jobs", "1", "--json"]
    quiet = CliRunner().invoke(cli, ["sweep-seq", plan, "--out", str(tmp_path / "a"), *args])
    forced = CliRunner().invoke(cli, ["sweep-seq", plan, "--out", str(tmp_path / "b"), *args, "--progress"])
    off = CliRunner().invoke(cli, ["sweep-seq", plan, "--out", str(tmp_path / "c"), *args, "--no-progress"])
    assert quiet.exit_code == forced.exit_code == off.exit_code == 0, forced.output
    assert "sequence sweep" in forced.stderr and "tensor-parallel modes" in forced.stderr, forced.stderr
    assert "sweep" not in quiet.stderr and "sweep" not in off.stderr
    assert "runs" in json.loads(forced.stdout)  # the bar is not in the answer


def test_the_tables_name_each_rows_tier(plan, tmp_path):
    r = _sweep(plan, tmp_path / "s", "--jobs", "2", "--format", "csv")
    rows = [row for row in csv.reader(r.stdout.splitlines()) if row and not row[0].startswith("#")]
    runs_head = next(i for i, row in enumerate(rows) if row[:3] == ["seq", "layout", "policy"])
    modes_head = next(i for i, row in enumerate(rows) if row[:3] == ["seq", "series", "policy"])
    col, status = rows[runs_head].index("tier"), rows[runs_head].index("status")
    runs = rows[runs_head + 1:modes_head]  # every run simulated, the out-of-memory ones too
    assert len(runs) == 12 and {row[col] for row in runs} == {"sim"} and {row[status] for row in runs} == {"OK", "OOM"}
    col = rows[modes_head].index("tier")
    modes = rows[modes_head + 1:]
    assert [(row[0], row[col]) for row in modes] == [(s, "sim" if s != "4M" else "analytic")
                                                     for _series in range(4) for s in ("8K", "1M", "4M")], modes
    # sweep-alpha's runs table and JSON rows are the same runs' and say so the same way
    a = CliRunner().invoke(cli, ["sweep-alpha", plan, "--out", str(tmp_path / "a"), "--alphas", "0,1"])
    head = next(ln.split() for ln in a.output.splitlines() if ln.startswith("alpha"))
    assert a.exit_code == 0 and head[:3] == ["alpha", "status", "tier"], a.output
    assert {row["tier"] for row in json.loads((tmp_path / "a" / "alpha_sweep.json").read_text())} == {"simulated"}


def test_whatifs_alpha_sweep_rows_name_their_tier_in_json(tmp_path):
    """whatif --sweep-alpha --json wrote `SimResult.to_dict` rows without the tier sweep-seq's rows now carry."""
    r = CliRunner().invoke(cli, ["whatif", "--layers", "4", "--gpus", "1", "--seq", "8K", "--sweep-alpha", "--json",
                                 "--out", str(tmp_path / "w")])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["sweep"]
    assert rows and {row["tier"] for row in rows} == {"simulated"}
    assert len(r.stdout.strip().splitlines()) == 1  # compact, as README says of whatif --json (it was indented)
