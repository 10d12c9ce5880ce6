"""The MoE probes of the GPU lease (benchmarks/gpu/probe_moe_host.py, probe_moe_block.py) run on the
CPU in their dry runs, write their JSON, and the experts' three implementations agree there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"


def _run(script: str, *args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GPU / script), "--dry-run", "--out", str(out), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=240)


def test_probe_moe_host_dry_run(tmp_path):
    r = _run("probe_moe_host.py", "--reps", "1", out=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "moe_host.json").read_text())
    cases = {row["case"] for row in rows}
    assert {"env", "launch", "sync", "experts"} <= cases
    (ex,) = [row for row in rows if row["case"] == "experts"]
    assert "error" not in ex, ex
    assert ex["loop_wall_ms"] > 0 and ex["loop_select_wall_ms"] > 0
    assert ex["loop_select_max_rel_diff"] <= 1e-6
    if ex.get("grouped_impl"):
        assert ex["grouped_max_rel_diff"] <= 1e-5
    bad = _run("probe_moe_host.py", "--reps", "0", out=tmp_path / "bad")
    assert bad.returncode == 2 and "--reps (0)" in bad.stderr and not (tmp_path / "bad").exists()


def test_probe_moe_block_dry_run_and_its_bad_model(tmp_path):
    r = _run("probe_moe_block.py", "--model", "mixtral-8x7b", out=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "moe_block-mixtral-8x7b.json").read_text())
    assert doc["wall_ms_per_fwd_bwd"] > 0 and doc["rows"]
    # memo-exec's block keeps at least what the simulator counts (today more: reports/gpu-h200-2026-11-26-moe.md)
    assert doc["saved_rows_per_token"] >= doc["sim_saved_rows_per_token"] > 0
    bad = _run("probe_moe_block.py", "--model", "gpt-7b", out=tmp_path / "bad")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--model 'gpt-7b'" in bad.stderr
    assert not (tmp_path / "bad").exists()
