"""GPU: a single-rank plan through the distributed path (torchrun, NCCL) gives the loss of the
single-GPU path. Skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.plan.schema import write_plan  # noqa: E402
from tests.dist_cases import plan_for  # noqa: E402
from tests.test_dist_cli import _env  # noqa: E402


def _losses(cmd, cwd) -> list[float]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)["losses"]


def test_torchrun_one_rank_nccl_matches_the_single_gpu_path(tmp_path):
    plan = write_plan(plan_for(Layout(), 1024, "memo"), tmp_path / "plan.json")
    common = ["run", str(plan), "--device", "cuda", "--dtype", "fp32", "--steps", "3", "--json"]
    single = _losses([sys.executable, "-m", "memo_exec", *common, "--out", str(tmp_path / "single")], tmp_path)
    dist = _losses([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m",
                    "memo_exec", *common, "--out", str(tmp_path / "dist")], tmp_path)
    for a, b in zip(dist, single):
        assert abs(a - b) <= 1e-5 * abs(b), (dist, single)


def test_tp2_cp2_shapes_on_one_gpu_are_refused_cleanly(tmp_path):
    """A 4-rank plan on one GPU node with one device: every rank refuses (LOCAL_RANK has no GPU)."""
    if torch.cuda.device_count() >= 4:
        pytest.skip("this node has 4 GPUs")
    plan = write_plan(plan_for(Layout(tp=2, cp=2), 256, "memo"), tmp_path / "plan.json")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m",
                        "memo_exec", "run", str(plan), "--device", "cuda", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path)
    assert r.returncode != 0
    errors = {ln for ln in r.stderr.splitlines() if ln.startswith("error:")}
    assert errors and all("LOCAL_RANK" in e for e in errors), r.stderr[-2000:]
