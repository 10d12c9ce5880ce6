"""The CPU loop of [calibrate]: calibrate a cpu profile, plan with it, run the plans, compare."""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from memo_exec.cli import cli as exec_cli  # noqa: E402
from memo_exec.validate import kendall_tau  # noqa: E402
from memo_sim.cli import cli as sim_cli  # noqa: E402


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([1], [2]) is None


def test_cpu_calibrate_plan_run_compare(tmp_path, cpu_calibration):
    prof = cpu_calibration[0] / "cpu-test.yaml"  # memo-exec calibrate --device cpu --quick (conftest)
    # plan with the calibrated profile
    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "3", "--hidden", "128", "--heads", "4", "--ffn", "512",
                                     "--vocab", "500", "--dtype", "fp32", "--seq", "512", "--gpus", "1",
                                     "--profile", str(prof), "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["candidates"][0]["status"] == "OK"
    assert (tmp_path / "plan.json").exists()
    # run several plans and compare with the simulator's predictions
    out = tmp_path / "val"
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(prof), "--layers", "3", "--hidden", "128",
                                      "--heads", "4", "--ffn", "512", "--vocab", "500", "--seqs", "256,512",
                                      "--policies", "store_all,full_recompute,memo", "--alphas", "0.5",
                                      "--device", "cpu", "--steps", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "validating" not in r.output  # off a terminal: no progress bar unless --progress
    report = (out / "validation.md").read_text()
    assert "| 512 memo(a=0.500) | ran |" in report and "Kendall tau" in report
    data = json.loads((out / "validation.json").read_text())
    assert data["summary"]["ran"] == 6 and data["profile_path"] == str(prof)
    for row in data["rows"]:
        q = row["quantities"]
        assert q["step_s"]["predicted"] > 0 and q["step_s"]["measured"] > 0
        assert q["compute_busy_s"]["measured"] > 0 and q["compute_exposed_s"]["measured"] is not None
        plan = json.loads(open(row["plan_file"]).read())
        assert plan["profile"] == str(prof.resolve())  # the calibrated file, not a name
        assert (plan.get("memory_plan") is not None) == row["plan"].endswith("memo(a=0.500)")
    assert (out / "worst-gantt.png").stat().st_size > 1000


def test_validate_bad_profile_is_one_line():
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", "no-such-profile", "--device", "cpu"])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output


def test_validate_progress_flag():
    r = CliRunner().invoke(exec_cli, ["validate", "--help"])
    assert r.exit_code == 0 and "--progress / --no-progress" in r.output
