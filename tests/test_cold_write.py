"""The cold-cache write a CPU calibration measures (`memo_exec.calibrate.microbench.measure_cold_write`) and the
speed probe a CPU run samples only where a calibration's speed is there to compare it with
(`memo_exec.speed_probe.probe_for_profile`): on a VM whose sysfs reports its host's whole L3 (300 MiB on the
2-core Xeon VM), twice that written before every timed repeat took longer than the kernels themselves."""

import pytest

pytest.importorskip("torch")

from memo_exec.calibrate import microbench as mb  # noqa: E402
from memo_exec.speed_probe import probe_for_profile  # noqa: E402

MiB = 2**20


def test_the_smallest_write_from_which_every_larger_one_is_as_slow():
    full = 600 * MiB
    # measured on the Xeon VM (ms): slow from 64 MiB on, within 10% of the full write
    med = {4 * MiB: 0.27, 8 * MiB: 0.26, 16 * MiB: 0.297, 32 * MiB: 0.296, 64 * MiB: 0.354, 128 * MiB: 0.351,
           256 * MiB: 0.347, 512 * MiB: 0.361, full: 0.353}
    assert mb.smallest_cold_write(med) == 64 * MiB
    # a fast size above a slow one: the write must be as slow from there on, so the answer is above it
    assert mb.smallest_cold_write({**med, 256 * MiB: 0.30}) == 512 * MiB
    assert mb.smallest_cold_write({**med, 512 * MiB: 0.30}) == full
    assert mb.smallest_cold_write({full: 0.35}) == full


def test_measured_write_is_recorded_and_used(monkeypatch):
    monkeypatch.setattr(mb, "last_level_cache_bytes", lambda: 8 * MiB)  # full write 16 MiB: a quick measurement
    cold = mb.measure_cold_write(rounds=3)
    assert cold["full_bytes"] == 16 * MiB and cold["llc_bytes"] == 8 * MiB
    assert cold["bytes"] in (4 * MiB, 8 * MiB, 16 * MiB) and set(cold["probe_ms"]) == {"4", "8", "16"}
    assert "cold caches:" in mb.cold_write_text(cold)
    import torch

    assert mb.Bench(torch.device("cpu"), flush_bytes=cold["bytes"]).flush_bytes == cold["bytes"]
    assert mb.Bench(torch.device("cpu")).flush_bytes == 16 * MiB  # without a measurement: the full write
    assert mb.Bench(torch.device("cpu"), cold=False).flush_bytes == 0


def test_a_run_probes_only_against_a_cpu_calibration():
    assert probe_for_profile(None) is None
    assert probe_for_profile({"method": "datasheet"}) is None  # a GPU profile: nothing to compare a sample with
    p = probe_for_profile({"speed_probe": {"median_gflops": 80.0}, "cold_write": {"bytes": 4 * MiB}})
    assert p is not None and p.flush_bytes == 4 * MiB  # the calibration's write, so the two samples compare
    old = probe_for_profile({"speed_probe": {"median_gflops": 80.0}})  # calibrated before the write was measured
    assert old is not None and old.flush_bytes == mb.full_cold_write_bytes()
