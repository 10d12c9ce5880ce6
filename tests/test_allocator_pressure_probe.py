"""benchmarks/gpu/probe_allocator_pressure.py (a GPU lease's probe: a store-all plan under a capped
caching allocator against memo-sim's replay at the same capacity) runs on the CPU as its own test:
the plan is written, run uncapped and at one cap, and each row carries the measured and predicted
sides; no cap applies on the CPU, and the predicted side reads the capped profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_allocator_pressure_probe_on_the_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "probe_allocator_pressure.py"),
                        "--out", str(tmp_path), "--profile", "h200-141gb", "--device", "cpu", "--steps", "2",
                        "--caps", "1.2", "--of", "allocated"], cwd=REPO, capture_output=True, text=True,
                       timeout=400, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "allocator_pressure.json").read_text())
    runs = [x for x in rows if x["case"] == "run"]
    assert [x["cap"] for x in runs] == ["none", 1.2]
    for x in runs:
        m, p = x["measured"], x["predicted"]
        assert m["iteration_s"] > 0 and len(m["step_times_s"]) == 2 and m["allocator"]["measured"] is False
        assert p["status"] == "OK" and p["allocator"]["memory_stats"]["num_alloc_retries"] == 0
    capped = runs[1]
    peak = runs[0]["predicted"]["allocator"]["memory_stats"]["allocated_bytes.all.peak"]
    assert capped["predicted_cap_bytes"] == pytest.approx(1.2 * peak)  # the same headroom over memo's own peak
    assert capped["cap_bytes"] == pytest.approx(1.2 * runs[0]["measured"]["peak_allocated_bytes"])
