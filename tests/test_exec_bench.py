"""benchmarks/exec_gpu_batch.py runs end to end at tiny sizes on CPU (--smoke): one budget, a
scratch folder, three result files, per-run timeouts inside the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "exec_gpu_batch.py"), "--smoke", "--out",
                           str(out), *extra], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


@pytest.mark.slow
def test_gpu_batch_script_smoke(tmp_path):
    p = _run(tmp_path, "--seqs", "128", "--budget", "240")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["results.json", "results.md", "runs.tar.gz"]
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {r["policy"]: r for r in res["results"]}
    assert set(rows) == {"store_all", "full_recompute", "memo"}
    assert all(r["started_s"] + r["timeout_s"] <= 240 for r in rows.values())  # no run may outlast the budget
    assert res["wall_s"] < 240
    for r in rows.values():
        assert r["rc"] == 0, r
        assert r["steady_state"]["iteration_s"] > 0 and len(r["losses"]) == 2
        assert r["predicted"]["iteration_s"] > 0 and r["predicted"]["status"] in ("OK", "OOM", "OOHM")
        assert {s["stream"] for s in r["streams"]} == {"compute", "d2h", "h2d"} and r["ops"] and r["memory"]
    assert rows["memo"]["arena_bytes"] > 0
    assert "| config |" in (tmp_path / "results.md").read_text()
    with tarfile.open(tmp_path / "runs.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("smoke-4l-64-128-memo/report.md") for n in names)
    assert any(n.endswith("plans/smoke-4l-64-128-memo.json") for n in names)


def test_gpu_batch_script_without_simpy_says_so(tmp_path):
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "simpy.py").write_text("raise ImportError('simpy is not installed here')\n")
    env = dict(os.environ, PYTHONPATH=str(stub))
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "exec_gpu_batch.py"), "--smoke", "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "simpy is not installed" in p.stderr
