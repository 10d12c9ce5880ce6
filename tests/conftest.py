"""Shared fixtures: one quick CPU calibration per test session (90 s on the idle 2-core VM, 150-190 s
beside the slow selection in CI, measured 2026-11-27)."""

from __future__ import annotations

import gc
import json

import pytest

from memo_sim.search.whatif import GC_THRESHOLDS

# The test process collects as seldom as memo's own tier 2 does (`memo_sim.search.whatif.GC_THRESHOLDS`): it holds
# torch, pytest's modules and every memoised cost of the tests before, and the collector's default thresholds walked
# that heap thousands of times (2026-12-05, this 2-core VM, five files of what-if tests: test_cli_whatif,
# test_frameworks_maxseq, test_moe_sim, test_pipeline_schedules, test_frameworks: 11.6-13.8 s of collections in
# 155-158 s at the defaults, 1.1-1.3 s in 130-148 s at these, peak RSS 1.14 -> 1.28 GB). Refcounting frees what the
# tests make; cycles wait for the next pass, as in a what-if.
gc.set_threshold(*GC_THRESHOLDS)

# CI's slow selection collects only the test files whose text holds this mark (.ci/run: `grep -l 'mark\.slow'`,
# 5.7 s against 13.2 s for collecting every file, 2026-12-05), so a test marked slow some other way would never run
SLOW_MARK_TEXT = "mark.slow"


@pytest.hookimpl(tryfirst=True)  # before -m deselects them
def pytest_collection_modifyitems(config, items):
    texts: dict = {}
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        path = item.path
        if path not in texts:
            texts[path] = SLOW_MARK_TEXT in path.read_text(encoding="utf-8")
        if not texts[path]:
            raise pytest.UsageError(f"{item.nodeid} is marked slow but its file does not say '{SLOW_MARK_TEXT}': "
                                    f"CI's slow selection (.ci/run) would not collect it; mark it with "
                                    f"pytest.{SLOW_MARK_TEXT}")


@pytest.fixture(scope="session")
def cpu_calibration(tmp_path_factory):
    """(folder, CliRunner result, raw measurements) of `memo-exec calibrate --device cpu --quick
    --threads 1`; the profile is ``folder / "cpu-test.yaml"``.

    One torch thread: `validate` runs the plans with the calibration's count, and a one-thread
    profile's timings hold while any other process takes the other core, where an N-thread
    kernel waits for its slowest thread (2026-11-23, the test's plans: median |step error| 15.3%
    with one thread; with two threads calibrated on quiet cores and run while another process
    took one core, +73% to +133%, median 101%)."""
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from memo_exec.calibrate.command import calibrate_cmd

    out = tmp_path_factory.mktemp("calib")
    raw = out / "raw.json"
    r = CliRunner().invoke(calibrate_cmd, ["--device", "cpu", "--quick", "--threads", "1", "--name", "cpu-test",
                                           "--out-dir", str(out), "--raw-out", str(raw)])
    assert r.exit_code == 0, r.output
    return out, r, json.loads(raw.read_text())
