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


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen2-moe-a2.7b"])
def test_probe_moe_block_dry_run_keeps_what_the_simulator_counts(tmp_path, model):
    """memo-exec's block keeps the simulator's count of h-wide rows per token and only small index
    tensors beside it (the experts' outputs, k rows, were kept until the weights moved into the activation;
    Qwen2-MoE's shared gate keeps the shared output in both): reports/gpu-h200-2026-11-26-moe.md."""
    r = _run("probe_moe_block.py", "--model", model, out=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / f"moe_block-{model}.json").read_text())
    assert doc["wall_ms_per_fwd_bwd"] > 0 and doc["rows"]
    # the routing's int64 indices and permutations: k * 8 bytes a token each, 1/16 row apiece at the probe's h=64
    assert doc["sim_saved_rows_per_token"] > 0
    assert doc["sim_saved_rows_per_token"] <= doc["saved_rows_per_token"] <= doc["sim_saved_rows_per_token"] + 0.25


def test_probe_moe_block_bad_model(tmp_path):
    bad = _run("probe_moe_block.py", "--model", "gpt-7b", out=tmp_path / "bad")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--model 'gpt-7b'" in bad.stderr
    assert not (tmp_path / "bad").exists()
