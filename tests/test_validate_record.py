"""[answers #30 item 1] `memo-exec validate` writes what it measured into the profile it validated
(the ``validation`` block: date, device, plans, median / mean / max |step-time error|, Kendall tau,
the validation.json), atomically and keeping the rest of the file; `--no-record` leaves the file
alone; a profile of another kind of device than the one the plans ran on is not written; the
what-if header and JSON then show the recorded error."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from click.testing import CliRunner

from memo_sim.errors import ProfileError
from memo_sim.profile.loader import REPO_PROFILES, load_profile
from memo_sim.profile.record import record_validation, validation_block

BLOCK = dict(median=0.25, mean=0.3, worst=0.5, plans=2, device="cpu", date="2026-11-23T16:00:00+00:00",
             kendall_tau=1.0, report="/x/validation.json")


def _cpu_profile(tmp_path, name="my-cpu", comment=True):
    """A built-in profile's numbers under a calibrated CPU profile's provenance, with a comment."""
    raw = yaml.safe_load((REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text())
    raw.update(name=name, provenance={"method": "calibrated", "tool": "memo-exec calibrate", "device": "cpu",
                                      "device_kind": "cpu", "date": "2026-11-23"})
    path = tmp_path / f"{name}.yaml"
    path.write_text(("# measured on this machine\n" if comment else "") + yaml.safe_dump(raw, sort_keys=False))
    return path


def test_record_replaces_the_block_and_keeps_the_file(tmp_path):
    path = _cpu_profile(tmp_path)
    record_validation(load_profile(str(path)), validation_block(**BLOCK))
    record_validation(load_profile(str(path)), validation_block(**{**BLOCK, "median": 0.125, "plans": 3}))
    text = path.read_text()
    assert text.startswith("# measured on this machine\n") and text.count("validation:") == 1
    p = load_profile(str(path))
    v = p.validation
    assert (v["median_abs_iteration_error"], v["plans"], v["kendall_tau"], v["report"]) == \
        (0.125, 3, 1.0, "/x/validation.json")
    assert p.provenance_line() == ("calibrated on cpu (2026-11-23); validated on cpu (2026-11-23T16:00:00+00:00): "
                                   "median |iteration error| 12.5% over 3 plans, Kendall tau 1.00")
    js = tmp_path / "my-cpu.json"  # a JSON profile: the key is set
    js.write_text(json.dumps(yaml.safe_load(_cpu_profile(tmp_path, "j", comment=False).read_text())))
    record_validation(load_profile(str(js)), validation_block(**BLOCK))
    assert json.loads(js.read_text())["validation"]["plans"] == 2


def test_a_block_the_loader_refuses_is_not_written(tmp_path):
    path = _cpu_profile(tmp_path)
    before = path.read_text()
    with pytest.raises(ProfileError, match="validation"):
        record_validation(load_profile(str(path)), validation_block(**{**BLOCK, "plans": 0}))
    assert path.read_text() == before


def _fake_runs(monkeypatch, step_measured: float):
    """Every plan's process prints a run document measuring ``step_measured`` s (no torch, fast)."""
    from memo_exec import validate as V

    doc = {"totals": [{"quantity": "iteration time", "measured": step_measured}], "streams": []}
    monkeypatch.setattr(V, "run_argv", lambda *a: [sys.executable, "-c", f"print({json.dumps(json.dumps(doc))})"])


TOY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32",
       "--seqs", "256,512", "--policies", "store_all", "--device", "cpu", "--steps", "1"]


def test_validate_records_into_the_profile_and_whatif_shows_it(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from memo_exec.cli import cli as exec_cli
    from memo_sim.cli import cli as sim_cli

    _fake_runs(monkeypatch, 1e-3)
    path = _cpu_profile(tmp_path)
    before = path.read_text()
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(path), *TOY, "--out", str(tmp_path / "a"),
                                      "--no-record"])
    assert r.exit_code == 0, r.output
    assert "not recorded in the profile (--no-record)" in r.output and path.read_text() == before
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(path), *TOY, "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert f"recorded in {path}" in r.output
    summary = json.loads((tmp_path / "b" / "validation.json").read_text())["summary"]
    v = load_profile(str(path)).validation
    e = summary["errors"]["step_s"]
    assert v["median_abs_iteration_error"] == pytest.approx(e["median_abs_error_pct"] / 100, rel=1e-5)
    assert v["max_abs_iteration_error"] == pytest.approx(e["max_abs_error_pct"] / 100, rel=1e-5)
    assert v["plans"] == 2 and v["device"] == "cpu" and v["kendall_tau"] == summary["kendall_tau_step_time"]
    assert v["report"] == str((tmp_path / "b" / "validation.json").resolve())
    words = f"validated on cpu ({v['date']}): median |iteration error| {100 * v['median_abs_iteration_error']:.1f}%"
    ask = ["whatif", "--layers", "2", "--seq", "16K", "--gpus", "1", "--profile", str(path), "--no-plan",
           "--simulate-top", "1", "--jobs", "1"]
    text = CliRunner().invoke(sim_cli, ask).output
    assert words in text
    d = json.loads(CliRunner().invoke(sim_cli, [*ask, "--json"]).output)
    assert words in d["profile_provenance"]["line"] and d["profile_provenance"]["validation"]["plans"] == 2


def test_a_gpu_profile_validated_on_a_cpu_is_not_written(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from memo_exec.cli import cli as exec_cli

    _fake_runs(monkeypatch, 1e-3)
    path = tmp_path / "h100.yaml"
    path.write_text((REPO_PROFILES / "h100-sxm5-80gb.yaml").read_text())
    before = path.read_text()
    r = CliRunner().invoke(exec_cli, ["validate", "--profile", str(path), *TOY, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "not recorded in the profile: it describes a cuda device and this ran on cpu" in r.output
    assert path.read_text() == before
