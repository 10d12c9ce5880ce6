"""Review fixes (Dec 1, c): memo-exec validate's stopped runs and its --out as one set, its Kendall tau of times it
calls not comparable, one CPU thread rule for every `memo-exec run` path, the steady state's words, --layers below a
MoE model's dense layers."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import memo_exec.validate as V
from memo_exec.cli import cli as exec_cli

REPO = Path(__file__).resolve().parents[1]
CPU_PROFILE = REPO / "tests" / "data" / "profiles" / "cpu-quick-vm.yaml"


# ------------------------------------------------------------------ 1. validate: stopped runs, --out as one set
def _child(monkeypatch, code: str) -> None:
    """Make `run_plan` start ``code`` (a Python program given the run folder as argv[1]) instead of memo-exec run."""
    monkeypatch.setattr(V, "run_argv", lambda plan_file, run_dir, device, steps: [sys.executable, "-c", code,
                                                                                   str(run_dir)])


STAGED_CHILD = """
import os, signal, sys, time
run = sys.argv[1]
stage = os.path.join(run, "." + os.path.basename(run) + ".abcd.partial")
os.mkdir(stage)
def term(*_):
    os.rmdir(stage)  # what memo-exec run's Terminated clean-up does (memo_sim.fileio.output_folder)
    open(os.path.join(run, "got-sigterm"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, term if "{handle}" == "yes" else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_timed_out_run_is_stopped_with_sigterm_first_and_leaves_no_stage(tmp_path, monkeypatch):
    """subprocess.run's time-out killed the run with SIGKILL, so it never removed its ``.plan-00.*.partial``."""
    _child(monkeypatch, STAGED_CHILD.replace("{handle}", "yes"))
    run_dir = tmp_path / "runs" / "plan-00"
    status, doc = V.run_plan(tmp_path / "p.json", run_dir, "cpu", 1, timeout=1.5)
    assert status == "timed out after 2 s" and doc == {}
    assert (run_dir / "got-sigterm").exists()  # SIGTERM came first: the run cleaned up itself
    assert not list(run_dir.glob(".*.partial")), list(run_dir.iterdir())


def test_a_run_that_ignores_sigterm_is_killed_after_the_grace_and_its_stage_removed(tmp_path, monkeypatch):
    _child(monkeypatch, STAGED_CHILD.replace("{handle}", "no"))
    monkeypatch.setattr(V, "STOP_GRACE_S", 0.5, raising=False)
    run_dir = tmp_path / "runs" / "plan-00"
    t0 = time.monotonic()
    status, _ = V.run_plan(tmp_path / "p.json", run_dir, "cpu", 1, timeout=1.0)
    assert status.startswith("timed out") and time.monotonic() - t0 < 10
    assert not list(run_dir.glob(".*.partial")) and not (run_dir / "got-sigterm").exists()


COMPLETED_CHILD = """
import json, os, signal, sys, time
run = sys.argv[1]
json.dump({"command": "memo-exec run", "complete": True, "files": []}, open(os.path.join(run, "manifest.json"), "w"))
print(json.dumps({"totals": [{"quantity": "iteration time", "predicted": 1.0, "measured": 1.1}]}), flush=True)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck while it exits (a rank's teardown)
time.sleep(60)
"""


def test_a_run_that_completed_before_the_timeout_is_not_reported_as_timed_out(tmp_path, monkeypatch):
    """--dp 2 --budget 30: runs/plan-00 held a complete run (manifest complete, every step) and the row said
    "timed out after 29 s"."""
    _child(monkeypatch, COMPLETED_CHILD)
    monkeypatch.setattr(V, "STOP_GRACE_S", 0.5, raising=False)
    status, doc = V.run_plan(tmp_path / "p.json", tmp_path / "runs" / "plan-00", "cpu", 1, timeout=1.5)
    assert status == "ran" and doc["totals"][0]["measured"] == 1.1


def _toy():
    from memo_sim.model.config import with_overrides

    return with_overrides(V.TOY_MODEL, rename=False, layers=2, hidden=128, heads=4, ffn=512, vocab=512, dtype="fp32")


def _plans():
    from memo_sim.policy import get_policy

    return [V.PlanSpec(256, get_policy("store_all")), V.PlanSpec(512, get_policy("store_all"))]


def test_an_interrupted_validation_leaves_the_old_out_as_it_was(tmp_path):
    """SIGTERM during the second plan left a new plans/ and a finished runs/plan-00 next to the old
    validation.md."""
    from memo_sim.profile.loader import load_profile

    out = tmp_path / "val"
    out.mkdir()
    (out / "validation.md").write_text("old\n")
    calls = []

    def runner(plan_file, run_dir, device, steps, timeout, threads=None):
        calls.append(run_dir)
        (run_dir / "measured.json").parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "measured.json").write_text("{}")
        if len(calls) == 2:
            raise KeyboardInterrupt  # `memo_sim.errors.Terminated` is one
        return "failed (exit 1): no", {}

    with pytest.raises(KeyboardInterrupt):
        V.validate(_toy(), load_profile(str(CPU_PROFILE)), _plans(), device="cpu", steps=1, out_dir=out,
                   report_path=None, command="t", runner=runner, record=False, speed_retries=0)
    assert sorted(p.name for p in out.iterdir()) == ["validation.md"]
    assert (out / "validation.md").read_text() == "old\n"
    assert all(out not in Path(c).parents or ".partial" in str(c) for c in calls)  # the runs went to the stage


def test_a_validation_is_moved_into_out_as_one_set_and_its_rows_name_the_final_paths(tmp_path):
    from memo_sim.profile.loader import load_profile

    out = tmp_path / "val"

    def runner(plan_file, run_dir, device, steps, timeout, threads=None):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "stdout.txt").write_text("{}")
        return "failed (exit 1): no", {}

    with pytest.raises(Exception, match="no plan ran"):
        V.validate(_toy(), load_profile(str(CPU_PROFILE)), _plans(), device="cpu", steps=1, out_dir=out,
                   report_path=None, command="t", runner=runner, record=False, speed_retries=0)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "plans", "runs", "validation.json", "validation.md"], names
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    rows = json.loads((out / "validation.json").read_text())["rows"]
    assert [r["run_dir"] for r in rows] == [str(out / "runs" / "plan-00"), str(out / "runs" / "plan-01")]
    assert all(Path(r["plan_file"]).exists() and Path(r["run_dir"], "stdout.txt").exists() for r in rows)


# ------------------------------------------------------------------ 2. Kendall tau of times not comparable
def test_kendall_tau_reads_not_comparable_where_the_step_times_do(tmp_path):
    """An A800 profile validated on a CPU: "Kendall tau ...: -1.0" beside "step time | 0 plans compared | not
    comparable"."""
    from memo_sim.profile.loader import load_profile

    times = iter([(1e-4, 0.9), (2e-4, 0.5)])  # predicted and measured in opposite orders: a tau of -1

    def gpu_times_on_a_cpu(plan_file, run_dir, device, steps, timeout, threads=None):
        p, m = next(times)
        return "ran", {"times_comparable": False, "totals": [{"quantity": "iteration time", "predicted": p,
                                                              "measured": m}]}

    path, summary = V.validate(_toy(), load_profile("a800-80gb"), _plans(), device="cpu", steps=1,
                               out_dir=tmp_path / "v", report_path=None, command="t", runner=gpu_times_on_a_cpu,
                               record=False, speed_retries=0)
    assert summary["kendall_tau_step_time"] is None
    text = Path(path).read_text()
    assert "- Kendall tau, predicted vs measured ordering of step times: not comparable" in text, text
    assert "-1.0" not in text


# ------------------------------------------------------------------ 3. one CPU thread rule
def _profile_without_threads(tmp_path) -> Path:
    text = "".join(ln for ln in CPU_PROFILE.read_text().splitlines(keepends=True) if "torch_threads" not in ln)
    p = tmp_path / "nothreads.yaml"
    p.write_text(text)
    return p


def test_a_single_process_run_takes_the_launchers_thread_rule(monkeypatch):
    """Without --nproc a CPU run took torch's default (2 threads on the 2-core machine: 2.88 s an iteration when
    loaded) where --nproc 1 took one; the in-process paths now set what the launcher sets its ranks."""
    import torch

    from memo_exec.device import LAUNCHER_THREADS_ENV, use_calibrated_threads
    from memo_exec.host_share import default_threads, default_threads_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(LAUNCHER_THREADS_ENV, raising=False)
    env: dict = {}
    assert default_threads_env(env) and env == {"OMP_NUM_THREADS": "1", LAUNCHER_THREADS_ENV: "1"}
    assert not default_threads_env({"OMP_NUM_THREADS": "3"})  # the user's count wins
    before = torch.get_num_threads()
    with default_threads(cpu=True):
        got = use_calibrated_threads("h100-sxm5-80gb")  # no calibration's threads: the default, one
        assert got["threads"] == 1 and got["set_by"].startswith("the launcher's default"), got
        cal = use_calibrated_threads(str(CPU_PROFILE))  # a CPU calibration: its count
        assert cal["set_by"] == "the profile's calibration" and cal["threads"] == 1
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ
    with default_threads(cpu=False):  # a GPU run: nothing set
        assert "OMP_NUM_THREADS" not in os.environ


def test_memo_exec_run_without_nproc_builds_its_executor_under_that_rule(tmp_path, monkeypatch):
    """The wiring: `memo-exec run` (no --nproc) on a CPU constructs its executor, which sets the threads
    (`memo_exec.runner.Executor.use_cpu_threads`), at one thread where the profile records none."""
    import torch

    import memo_exec.runner as runner
    from memo_exec.device import LAUNCHER_THREADS_ENV
    from memo_exec.errors import ExecError
    from memo_sim.cli import cli as sim_cli

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(LAUNCHER_THREADS_ENV, raising=False)
    prof = _profile_without_threads(tmp_path)
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "gpt-7b", "--layers", "2", "--hidden", "128", "--heads", "4",
                                     "--vocab", "512", "--dtype", "fp32", "--seq", "256", "--gpus", "1", "--policy",
                                     "store_all", "--profile", str(prof), "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    seen = []

    class Probe:
        def __init__(self, plan, opts):
            seen.append((torch.get_num_threads(), os.environ.get(LAUNCHER_THREADS_ENV)))
            raise ExecError("probe")

    monkeypatch.setattr(runner, "Executor", Probe)
    before = torch.get_num_threads()
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "p" / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "probe" in r.output, r.output
    assert seen == [(1, "1")] and torch.get_num_threads() == before


def test_a_single_process_cpu_run_says_cores_oversubscribed_as_the_ranks_do():
    from memo_exec.cli import _cores_of_one_process
    from memo_exec.host_share import CpuShare

    class Res:
        meta = {"device_kind": "cpu", "cpu_threads": {"threads": 2}}

    busy = CpuShare(wall_s=10.0, cores=2, busy_core_s=19.0, own_core_s=10.0, steal_core_s=0.0)  # others: 0.9 cores
    res = Res()
    _cores_of_one_process(res, busy)
    assert res.meta["oversubscribed"].startswith("cores oversubscribed: 1 rank x 2 torch threads + 0.90 cores")
    one = Res()
    one.meta = {"device_kind": "cpu", "cpu_threads": {"threads": 1}}
    _cores_of_one_process(one, busy)
    assert "oversubscribed" not in one.meta and one.meta["cores"]["demand_cores"] == 1.9


# ------------------------------------------------------------------ 4. the steady state's words
def test_steady_state_says_the_peak_memory_is_the_maximum():
    from memo_exec.measure import STEADY_STATE_WORDS, steady_state

    steps = [{"step": i, "iteration_s": t, "peak_allocated_bytes": b, "peak_reserved_bytes": b}
             for i, (t, b) in enumerate([(9.0, 1), (1.0, 10), (2.0, 30), (3.0, 20)])]
    st = steady_state(steps)
    assert st["iteration_s"] == 2.0 and st["peak_allocated_bytes"] == 30  # median of times, max of peaks
    assert (st["statistic"], st["peak_statistic"]) == ("median", "max")
    assert "median" in STEADY_STATE_WORDS and "maximum of the peak memory" in STEADY_STATE_WORDS


# ------------------------------------------------------------------ 5. --layers below a MoE model's dense layers
def test_layers_below_the_dense_layers_name_layers_and_the_fix(tmp_path):
    from memo_sim.cli import cli as sim_cli

    r = CliRunner().invoke(sim_cli, ["whatif", "--model", "glm-4.5-air", "--layers", "3", "--hidden", "256",
                                     "--heads", "8", "--kv-heads", "4", "--head-dim", "0", "--vocab", "512",
                                     "--dtype", "fp32", "--seq", "512", "--gpus", "2", "--ep", "2", "--dp", "2",
                                     "--policy", "store_all", "--profile", "h100-sxm5-80gb",
                                     "--out", str(tmp_path / "glm")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "glm" / "plan.json"), "--nproc", "2", "--device", "cpu",
                                      "--layers", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("error: --layers 1: ") and "give --layers 2 or more" in line and "(top)" not in line, line
    assert not (tmp_path / "o").exists()
