"""benchmarks/exec_gpu_batch.py runs end to end at tiny sizes on CPU (--smoke)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_batch_script_smoke(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "exec_gpu_batch.py"), "--smoke", "--seqs", "128",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    rows = {r["policy"]: r for r in res["results"]}
    assert set(rows) == {"store_all", "full_recompute", "memo", "memo+plan"}
    for r in rows.values():
        assert r["rc"] == 0, r
        assert r["steady_state"]["iteration_s"] > 0
        assert r["predicted"]["iteration_s"] > 0 and r["predicted"]["status"] in ("OK", "OOM", "OOHM")
        assert (tmp_path / "runs" / r["name"] / "report.md").exists()
    assert rows["memo+plan"]["arena_bytes"] > 0
    assert "| config |" in (tmp_path / "results.md").read_text()
