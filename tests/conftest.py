"""Shared fixtures: one quick CPU calibration per test session (it takes about 10 s)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def cpu_calibration(tmp_path_factory):
    """(folder, CliRunner result, raw measurements) of `memo-exec calibrate --device cpu --quick`;
    the profile is ``folder / "cpu-test.yaml"``."""
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from memo_exec.calibrate.command import calibrate_cmd

    out = tmp_path_factory.mktemp("calib")
    raw = out / "raw.json"
    r = CliRunner().invoke(calibrate_cmd, ["--device", "cpu", "--quick", "--name", "cpu-test", "--out-dir",
                                           str(out), "--raw-out", str(raw)])
    assert r.exit_code == 0, r.output
    return out, r, json.loads(raw.read_text())
