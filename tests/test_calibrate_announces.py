"""[answers #30 item 5] `memo-exec calibrate` says how long it will take before it measures
anything (the quick and the full suite), so a 400 s run is never a surprise."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("torch")


class _Stop(Exception):
    pass


@pytest.mark.parametrize("quick", [True, False])
def test_calibrate_announces_its_duration_first(tmp_path, monkeypatch, quick):
    from memo_exec.calibrate import command, suite
    from memo_exec.calibrate.microbench import Progress

    def stop(_opts, _prog):
        raise _Stop  # nothing measured: the announcement is all this test needs

    monkeypatch.setattr(suite, "run_suite", stop)
    out = io.StringIO()
    with pytest.raises(_Stop):
        command.calibrate("ann", device="cpu", quick=quick, out_dir=tmp_path, progress=Progress(True, out))
    first = out.getvalue().splitlines()[0]
    assert f"calibrating ({'quick' if quick else 'full'} suite) on" in first
    assert (command.DURATION_QUICK if quick else command.DURATION_FULL) in first
    assert not (tmp_path / "ann.yaml").exists()
