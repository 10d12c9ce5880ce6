"""`memo-exec validate`: one process per plan (a failing or out-of-memory plan is its row and the
others go on), the per-plan rows and the summary, and profiles found by path."""

import json
import sys

from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from memo_exec import validate as V  # noqa: E402
from memo_exec.cli import cli as exec_cli  # noqa: E402

TOY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32"]


def _run_doc(step_m, step_p, mem_m=None, mem_p=None, d2h=(0.002, 0.001, 0.0005, 0.0)):
    busy_m, busy_p, exp_m, exp_p = d2h
    return {"totals": [{"quantity": "iteration time", "measured": step_m, "predicted": step_p},
                       {"quantity": "peak device memory (allocated)", "measured": mem_m, "predicted": mem_p}],
            "streams": [{"stream": "d2h", "quantity": "busy", "measured_s": busy_m, "predicted_s": busy_p},
                        {"stream": "d2h", "quantity": "exposed", "measured_s": exp_m, "predicted_s": exp_p},
                        {"stream": "compute", "quantity": "busy", "measured_s": step_m, "predicted_s": step_p},
                        {"stream": "d2h", "quantity": "overlapped", "measured_s": 1.0, "predicted_s": 1.0}]}


def test_rows_from_a_run_and_the_summary():
    fallback = {k: None for k, _, _ in V.QUANTITIES}
    fallback["h2d_busy_s"] = 0.25  # the simulator's own number where the run's comparison has none
    q = V.quantities_from_run(_run_doc(1.2, 1.0, 110.0, 100.0), fallback)
    assert q["step_s"] == {"predicted": 1.0, "measured": 1.2, "error_pct": pytest.approx(20.0)}
    assert q["peak_memory_bytes"]["error_pct"] == pytest.approx(10.0)
    assert q["d2h_busy_s"]["error_pct"] == pytest.approx(100.0)
    assert q["d2h_exposed_s"] == {"predicted": 0.0, "measured": 0.0005, "error_pct": None}  # predicted 0: no ratio
    assert q["h2d_busy_s"] == {"predicted": 0.25, "measured": None, "error_pct": None}
    assert set(q) == {k for k, _, _ in V.QUANTITIES}

    def row(label, step_p, step_m, status="ran"):
        qq = V.quantities_from_run(_run_doc(step_m, step_p), fallback)
        return V.ValidationRow(label, status, qq)

    rows = [row("a", 1.0, 1.1), row("b", 2.0, 1.0), row("c", 3.0, 3.3), row("d", 4.0, None, "OOM: CUDA out of memory"),
            V.ValidationRow("e", "predicted OOM", V._empty())]
    s = V.summarize(rows)
    assert (s["plans"], s["ran"], s["failed"], s["oom"]) == (5, 3, 1, 1)
    e = s["errors"]["step_s"]
    assert e["plans"] == 3 and e["max_abs_error_pct"] == pytest.approx(50.0)
    assert e["mean_abs_error_pct"] == pytest.approx((10 + 50 + 10) / 3)
    assert e["median_abs_error_pct"] == pytest.approx(10.0)
    # predicted order a < b < c, measured b < a < c: pairs (a,b) discordant, (a,c) and (b,c) concordant
    assert s["kendall_tau_step_time"] == pytest.approx(1 / 3)
    assert s["errors"]["peak_memory_bytes"] == {"median_abs_error_pct": None, "mean_abs_error_pct": None,
                                                "max_abs_error_pct": None, "plans": 0}
    md = V.render_report(rows, s, _model(), _profile(), "cpu", "memo-exec validate", None)
    assert "| d | OOM: CUDA out of memory |" in md and "| step time | 3 | 10.0% | 23.3% | 50.0% |" in md
    line = V.summary_line(s)  # percentages only, no raw ratio
    assert "median 10.0%, mean 23.3%, max 50.0%" in line and "Kendall tau 0.33" in line


def test_failure_status_lines():
    oom = "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 GiB"
    assert V.failure_status(1, oom).startswith("OOM: torch.OutOfMemoryError: CUDA out of memory")
    assert V.failure_status(2, "error: the device ran out of memory while running the plan (x)").startswith("OOM: ")
    assert V.failure_status(2, "error: does not fit: ...") == "failed (exit 2): error: does not fit: ..."
    assert V.failure_status(124, "", timeout=30.0) == "timed out after 30 s"


def _model():
    from memo_sim.model.config import ModelConfig

    return ModelConfig("toy", 2, 64, 4, 256, vocab=128, dtype="fp32")


def _profile():
    from memo_sim.profile.loader import load_profile

    return load_profile("h100-sxm5-80gb")


@pytest.fixture
def oom_on_plan_01(monkeypatch):
    """The second plan's process dies of a CUDA out-of-memory error (raised on a CPU)."""
    real = V.run_argv

    def argv(plan_file, run_dir, device, steps):
        if plan_file.name == "plan-01.json":
            return [sys.executable, "-c", "import torch; raise torch.OutOfMemoryError("
                    "'CUDA out of memory. Tried to allocate 96.00 GiB')"]
        return real(plan_file, run_dir, device, steps)

    monkeypatch.setattr(V, "run_argv", argv)


def test_validate_survives_an_out_of_memory_plan(tmp_path, oom_on_plan_01):
    out = tmp_path / "val"
    prof = tmp_path / "elsewhere" / "h100-sxm5-80gb.yaml"  # a profile written elsewhere, under a built-in's name
    prof.parent.mkdir()
    from memo_sim.profile.loader import REPO_PROFILES

    text = (REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text()
    prof.write_text(text)
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(prof), *TOY, "--seqs", "256",
                                      "--policies", "store_all,memo,full_recompute", "--alphas", "0.5",
                                      "--device", "cpu", "--steps", "1", "--budget", "240", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads((out / "validation.json").read_text())
    st = [row["status"] for row in data["rows"]]
    assert st[0] == "ran" and st[2] == "ran", st
    assert st[1].startswith("OOM: ") and "96.00 GiB" in st[1]
    assert data["summary"]["oom"] == 1 and data["summary"]["ran"] == 2
    assert "| 256 memo(a=0.500) | OOM: " in (out / "validation.md").read_text()
    memo_plan = json.loads((out / "plans" / "plan-01.json").read_text())
    assert memo_plan["memory_plan"] is not None and memo_plan["profile"] == str(prof.resolve())
    assert "1 out of memory" in r.output


def test_validate_exits_with_one_line_when_no_plan_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(V, "run_argv", lambda *a: [sys.executable, "-c", "import sys; sys.exit('boom')"])
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", "h100-sxm5-80gb", *TOY, "--seqs", "256",
                                      "--policies", "store_all", "--device", "cpu", "--steps", "1",
                                      "--out", str(tmp_path)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("error: no plan ran")
    assert "Traceback" not in r.output
    assert json.loads((tmp_path / "validation.json").read_text())["rows"][0]["status"] == "failed (exit 1): boom"


def test_run_profile_by_path(tmp_path):
    from memo_exec.runner import use_profile
    from memo_sim.errors import MemoError
    from memo_sim.profile.loader import REPO_PROFILES

    class P:
        profile = "h100-sxm5-80gb"

    prof = tmp_path / "h100-sxm5-80gb.yaml"
    prof.write_text((REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text())
    plan = P()
    use_profile(plan, str(prof))
    assert plan.profile == str(prof.resolve())  # the file, not the built-in of the same name
    use_profile(plan, "a800-80gb")
    assert plan.profile.endswith("a800-80gb.yaml")
    with pytest.raises(MemoError, match="no such profile file"):
        use_profile(plan, str(tmp_path / "missing.yaml"))
    from memo_sim.plan.schema import write_plan
    from memo_sim.policy import get_policy

    pol = get_policy("store_all")
    plan_file = write_plan(V.plan_for(_model(), 256, pol, _profile(), V.predict(_model(), 256, pol, _profile())),
                           tmp_path / "plan.json")
    r = CliRunner().invoke(exec_cli, ["run", str(plan_file), "--device", "cpu", "--profile",
                                      str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and r.output.startswith("error:") and "Traceback" not in r.output


def test_memo_exec_run_uses_the_calibration_thread_count_and_its_report_says_so(tmp_path, monkeypatch):
    """`memo-exec run` on a CPU ran at torch's default threads where its profile was calibrated at 1, 5.9x slower
    than predicted, and its report did not say why (a user's review): it now takes the calibration's count
    (unless OMP_NUM_THREADS is set), gives the process its own back at the end, and says both in report.md."""
    import torch

    from memo_exec.report import cpu_speed_lines
    from memo_exec.runner import Executor, RunOptions
    from memo_sim.plan.schema import write_plan
    from memo_sim.policy import get_policy

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    prof_file = Path(__file__).parent / "data" / "profiles" / "cpu-quick-vm.yaml"
    pol = get_policy("store_all")
    plan = V.plan_for(_model(), 256, pol, _profile(), V.predict(_model(), 256, pol, _profile()))
    plan.profile = str(prof_file)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ex = Executor(plan, RunOptions(device="cpu", steps=1))
        assert torch.get_num_threads() == 1
        meta = ex.describe()
        ex.close()
        assert torch.get_num_threads() == 2  # the process's own count again
        assert meta["cpu_threads"] == {"threads": 1, "calibrated": 1, "set_by": "the profile's calibration"}
        lines = cpu_speed_lines({**meta, "speed_probe": {"median_gflops": 10.0}})
        assert any("CPU threads: 1 (set by the profile's calibration; the profile was calibrated with 1)" in ln
                   for ln in lines), lines
        assert any("machine speed" in ln and "from the calibration's" in ln for ln in lines), lines
        off = cpu_speed_lines({**meta, "cpu_threads": {"threads": 2, "calibrated": 1, "set_by": "OMP_NUM_THREADS"}})
        assert off and off[0].startswith("- **CPU threads: 2") and "unset OMP_NUM_THREADS" in off[0], off
        # a set-up that fails leaves the process's count alone (a missing token file: refused after set-up)
        with pytest.raises(Exception, match="tokens"):
            Executor(plan, RunOptions(device="cpu", steps=1, tokens_file=str(tmp_path / "missing.bin")))
        assert torch.get_num_threads() == 2
        # under `memo-exec run --nproc` the launcher's own OMP_NUM_THREADS=1 is a default, not the user's choice:
        # the calibration's count applies (every rank reported 'set by OMP_NUM_THREADS' and blamed the user)
        from memo_exec.device import LAUNCHER_THREADS_ENV

        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setenv(LAUNCHER_THREADS_ENV, "1")
        ex = Executor(plan, RunOptions(device="cpu", steps=1))
        assert ex.describe()["cpu_threads"]["set_by"] == "the profile's calibration"
        ex.close()
        monkeypatch.delenv(LAUNCHER_THREADS_ENV)
        ex = Executor(plan, RunOptions(device="cpu", steps=1))
        assert ex.describe()["cpu_threads"]["set_by"] == "OMP_NUM_THREADS"  # the user's
        ex.close()
    finally:
        torch.set_num_threads(before)
    write_plan(plan, tmp_path / "plan.json")  # the plan stays a valid plan file with the calibrated profile


def test_the_default_validation_model_offloads_and_recomputes_some_layers():
    """A 2-layer default toy kept both layers on the device under every policy: MEMO offloaded nothing and
    the four default policies predicted one plan (a user's review)."""
    from memo_sim.policy.rounding_buffers import offloaded_layer_count

    assert offloaded_layer_count(V.TOY_MODEL.layers) >= 2
    r = CliRunner().invoke(exec_cli, ["validate", "--help"])
    assert "4-layer toy" in " ".join(r.output.split())


def test_cpu_runs_use_the_calibration_thread_count():
    import dataclasses

    prof = _profile()
    assert V.cpu_threads(prof) is None  # a datasheet profile: torch's default
    cal = dataclasses.replace(prof, provenance={**prof.provenance, "torch_threads": 1})
    assert V.cpu_threads(cal) == 1
    assert V.run_env("cpu", 1)["OMP_NUM_THREADS"] == "1"
    assert V.run_env("cuda", 1).get("OMP_NUM_THREADS") == __import__("os").environ.get("OMP_NUM_THREADS")



def test_a_plans_profile_missing_here_is_named_as_the_reason_for_torchs_thread_count(tmp_path, monkeypatch):
    """A plan whose profile file is absent on this machine ran at torch's default threads, and report.md said
    'the profile records no calibration's threads', as if the profile had been read: it says the file is missing."""
    import torch

    from memo_exec.device import use_calibrated_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        got = use_calibrated_threads(str(tmp_path / "gone.yaml"))
        assert got["calibrated"] is None and "not readable here" in got["set_by"] and "gone.yaml" in got["set_by"]
        got = use_calibrated_threads("h100-sxm5-80gb")  # read, and records none
        assert got["set_by"] == "torch's default (the profile records no calibration's threads)"
    finally:
        torch.set_num_threads(before)
