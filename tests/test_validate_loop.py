"""The CPU loop of [calibrate]: calibrate a cpu profile, plan with it, run the plans, compare.

The loop's accuracy is asserted only on an idle machine (`memo_exec.host_share.busy_reason`:
other processes took at most 0.25 cores on average while the calibration and the runs measured,
read from /proc/stat and getrusage, and the machine ran at the speed it was calibrated at, read
from a reference GEMM timed between the calibration's parts and after every step of every run,
`memo_exec.speed_probe`): a median |step-time error| under `LOOP_CI_BAR_PCT` (50%; issue #30's 30% target is measured by the
benchmark, see the bar's comment). On the shared 2-core machine
under load the runs measured +40% to +400% against their predictions (time-sharing: every op
longer than a scheduler slice waits its turn, and the calibration and the runs see different
shares), and with no other process on the machine the reference GEMM still moved between 50 and
87 GFLOP/s within a minute (other virtual machines on the same physical cores), which says
nothing about the model; `benchmarks/cpu_loop.py` records the number with the share and the
speed it was measured at.
"""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from memo_exec.cli import cli as exec_cli  # noqa: E402
from memo_exec.host_share import busy_reason  # noqa: E402
from memo_exec.validate import kendall_tau  # noqa: E402
from memo_sim.cli import cli as sim_cli  # noqa: E402


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([1], [2]) is None




@pytest.fixture(scope="module")
def cpu_validation(tmp_path_factory, cpu_calibration):
    """(profile, validation folder, CliRunner result) of `memo-exec validate --device cpu` with the
    calibrated cpu profile: 3 layers, 512 tokens, store all, full recompute, MEMO at 0.5 (each plan a
    process of about 20 s in CI: with 256 tokens beside them this was the default selection's longest
    setup, 133 s on 2026-11-27)."""
    prof = cpu_calibration[0] / "cpu-test.yaml"  # memo-exec calibrate --device cpu --quick (conftest)
    out = tmp_path_factory.mktemp("val")
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(prof), "--layers", "3", "--hidden", "128",
                                      "--heads", "4", "--ffn", "512", "--vocab", "500", "--seqs", "512",
                                      "--policies", "store_all,full_recompute,memo", "--alphas", "0.5",
                                      "--device", "cpu", "--steps", "5", "--out", str(out)])
    return prof, out, r


def test_cpu_calibrate_plan_run_compare(tmp_path, cpu_validation):
    prof, out, val = cpu_validation
    # plan with the calibrated profile
    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "3", "--hidden", "128", "--heads", "4", "--ffn", "512",
                                     "--vocab", "500", "--dtype", "fp32", "--seq", "512", "--gpus", "1",
                                     "--profile", str(prof), "--json", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["candidates"][0]["status"] == "OK"
    assert (tmp_path / "plan.json").exists()
    # several plans run and compared with the simulator's predictions (the fixture)
    assert val.exit_code == 0, val.output
    assert "%" in val.output and "median" in val.output  # the summary line reads in percent
    assert "validating" not in val.output  # off a terminal: no progress bar unless --progress
    report = (out / "validation.md").read_text()
    assert "| 512 memo(a=0.500) | ran |" in report and "Kendall tau" in report
    data = json.loads((out / "validation.json").read_text())
    assert data["summary"]["ran"] == 3 and data["profile_path"] == str(prof)
    import yaml

    threads = yaml.safe_load(prof.read_text())["provenance"]["torch_threads"]
    assert data["summary"]["cpu_threads"] == threads  # the runs used the calibration's thread count
    assert f"each CPU run used {threads} torch threads" in report
    for row in data["rows"]:
        q = row["quantities"]
        assert q["step_s"]["predicted"] > 0 and q["step_s"]["measured"] > 0
        assert q["compute_busy_s"]["measured"] > 0 and q["compute_exposed_s"]["measured"] is not None
        plan = json.loads(open(row["plan_file"]).read())
        assert plan["profile"] == str(prof.resolve())  # the calibrated file, not a name
        assert (plan.get("memory_plan") is not None) == row["plan"].endswith("memo(a=0.500)")
    assert (out / "worst-gantt.png").stat().st_size > 1000
    assert "![](worst-gantt.png)" in report  # relative to the report beside it (it read ![](OUT/worst-gantt.png))


def test_busy_reason():
    idle = {"other_cores": 0.05, "cores": 2, "steal_cores": 0.0}
    busy = {"other_cores": 1.2, "cores": 2, "steal_cores": 0.0}
    assert busy_reason({"cpu_share": idle}, {"cpu_share": idle}) is None
    assert "1.2" in busy_reason({"cpu_share": idle}, {"cpu_share": busy})
    assert busy_reason({"load_average_1min": [0.1, 0.2]}, {"load_average_1min": [0.2, 0.3]}) is None
    assert "load" in busy_reason({"load_average_1min": [3.0, 3.0]}, {"load_average_1min": [0.2, 0.3]})


# The bar a test run must clear, above issue #30's target (`LOOP_TARGET_MEDIAN_PCT`, 30%), which
# `benchmarks/cpu_loop.py` measures and reports. Measured 2026-11-25 (03:20-03:45 UTC) on the 2-core
# VM, idle by `busy_reason` (other processes 0.005 cores, speed probe within 2.2%), this fixture's
# loop (then 3 layers, h=128, 256 and 512 tokens; 512 only since 2026-11-27) in 12 fresh
# calibrate + validate pairs: median
# |step-time error| 22.3% to 34.9% (median of the twelve 28.7%), and 38.5% in one CI run; every
# row under-predicted. Where it goes, from the runs' traces: the same plan in another process
# measured 59 to 74 ms a step (512 tokens, store all) with the GEMM probe steady, the math
# attention kernel at 256 tokens lies between the quick calibration's sampled lengths (128, 512)
# and costs 1.8-2.4 ms against 1.4 ms interpolated, and 1.3-2.5 ms a step pass between the
# executor's ops (layer boundaries, the optimizer) where the simulator prices none. So the 30%
# target is not met reliably on this machine at these shapes, and a test that asserted it would
# fail every second run; this bar catches what breaks the loop (a missing op, a unit slip, a
# prediction off by 2x) and never the machine's own spread.
LOOP_CI_BAR_PCT = 50.0


def test_cpu_loop_median_error_on_an_idle_machine(cpu_validation):
    """calibrate --quick then validate --device cpu: median |step-time error| under `LOOP_CI_BAR_PCT`
    when the machine was idle and ran at the speed it was calibrated at (`busy_reason`); skipped
    otherwise, with why. Issue #30's 30% target is the benchmark's (`benchmarks/cpu_loop.py`)."""
    import yaml

    prof, out, r = cpu_validation
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "validation.json").read_text())["summary"]
    why = busy_reason(yaml.safe_load(prof.read_text())["provenance"], summary)
    if why:
        pytest.skip(f"machine not idle: {why}")
    med = summary["errors"]["step_s"]["median_abs_error_pct"]
    assert med is not None and med < LOOP_CI_BAR_PCT, summary


def test_readme_validate_line_on_a_cpu_profile(tmp_path, monkeypatch, cpu_calibration):
    """The README's validate line with a CPU-calibrated profile either validates at least one plan
    or exits non-zero with one line saying why (here: GPT-7B's 8 layers do not fit the CPU budget)."""
    prof = cpu_calibration[0] / "cpu-test.yaml"
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(prof), "--model", "gpt-7b", "--layers", "8",
                                      "--seqs", "16K,32K,64K", "--report", "reports/validation-my-gpu.md",
                                      "--device", "cpu"])
    if r.exit_code == 0:
        assert json.loads((tmp_path / "validation_out" / "validation.json").read_text())["summary"]["ran"] >= 1
    else:
        assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("error: no plan ran"), r.output
        assert "predicted OOM" in r.output and "Traceback" not in r.output
    assert (tmp_path / "reports" / "validation-my-gpu.md").exists()


def test_validate_bad_profile_is_one_line():
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", "no-such-profile", "--device", "cpu"])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output


def test_validate_progress_flag():
    r = CliRunner().invoke(exec_cli, ["validate", "--help"])
    assert r.exit_code == 0 and "--progress / --no-progress" in r.output
