"""[modern-training] / [exec-complete]: optimizer offload in the executor (`memo_exec.optim_offload`).

The fp32 master weights, AdamW's moments and the step live on the host; the update must be the
device optimizer's element for element: a 2-rank ZeRO-1 run (gloo, fp64) with the optimizer on the
host follows the same loss curve and ends at the same weights as the same plan with it on the
device, and a single-process bf16 model (fp32 main gradients under Megatron's recipe) matches too.
A non-finite gradient stops the step before any weight changes. The what-if's optimizer-offload
plan runs under `memo-exec run --nproc 2`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memo_exec.device import DeviceSpec
from memo_exec.distributed.context import build_context
from memo_exec.distributed.runner import DistExecutor
from memo_exec.optim import AdamW, NonFiniteGradient
from memo_exec.optim_offload import HostAdamW, make_adamw
from memo_exec.runner import Executor, RunOptions
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from tests.dist_harness import spawn
from tests.exec_helpers import make_plan, time_limit

ROOT = Path(__file__).resolve().parents[1]
MODEL = ModelConfig("offload", 2, 32, 4, 64, vocab=64, dtype="fp32")


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


def test_host_adamw_is_the_device_update():
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.bfloat16)) for _ in range(2)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    mains_p = {p: torch.randn(p.shape) for p in ps}
    mains_q = {q: mains_p[p].clone() for p, q in zip(ps, qs)}
    dev, host = AdamW(ps, lr=1e-2, main_grads=mains_p), HostAdamW(qs, lr=1e-2, main_grads=mains_q)
    for _ in range(3):
        dev.step()
        host.step()
        for p, q in zip(ps, qs):
            assert torch.equal(p, q)
    assert host.state_bytes() == 0 and host.host_state_bytes() == 16 * sum(p.numel() for p in ps)
    assert isinstance(make_adamw(qs, True, lr=1e-3), HostAdamW) and isinstance(make_adamw(qs, False, lr=1e-3), AdamW)
    mains_q[qs[0]][0, 0] = float("nan")
    before = [q.detach().clone() for q in qs]
    with pytest.raises(NonFiniteGradient):
        host.step()
    assert all(torch.equal(a, q) for a, q in zip(before, qs))  # refused before any weight changed


def _plan(offload: bool, dtype: str = "fp32"):
    plan = make_plan(dataclasses.replace(MODEL, dtype=dtype), 64, get_policy("store_all"), batch=2, chunk=48)
    plan.layout = Layout(dp=2, zero=1, optimizer_offload=offload)
    plan.gpus = 2
    return plan


def rank_run(rank: int, world: int, offload: bool) -> dict:
    plan = _plan(offload)
    ctx = build_context(plan.layout, torch.device("cpu"))
    ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=3), ctx, DeviceSpec("cpu"))
    ex.allocate()
    losses = [ex.step(k).loss for k in range(3)]
    params = ex.sync.full_params()
    ex.close()
    return {"losses": losses, "params": params if rank == 0 else None,
            "host": type(ex.sync.optimizer).__name__}


def test_zero1_with_the_optimizer_on_the_host_is_the_same_training():
    on_device = spawn(rank_run, 2, False, timeout=240)
    on_host = spawn(rank_run, 2, True, timeout=240)
    assert on_host[0]["host"] == "HostAdamW" and on_device[0]["host"] == "AdamW"
    assert on_host[0]["losses"] == on_device[0]["losses"] and on_host[1]["losses"] == on_device[1]["losses"]
    for a, b in zip(on_host[0]["params"], on_device[0]["params"]):
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_single_process_bf16_with_main_grads_matches():
    runs = []
    for offload in (False, True):
        plan = make_plan(dataclasses.replace(MODEL, dtype="bf16"), 64, get_policy("store_all"), chunk=48)
        plan.layout = Layout(optimizer_offload=offload, zero=1)
        ex = Executor(plan, RunOptions(device="cpu", dtype="bf16", steps=3))
        try:
            runs.append([s["loss"] for s in ex.run().summaries])
            assert type(ex.optimizer).__name__ == ("HostAdamW" if offload else "AdamW")
        finally:
            ex.close()
    assert runs[0] == runs[1] and all(math.isfinite(x) for x in runs[0])


def test_whatif_optimizer_offload_plan_runs_under_nproc(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from memo_sim.cli import cli as sim_cli

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    monkeypatch.chdir(tmp_path)  # the what-if in this process (it only writes the plan), from the folder as before
    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256",
                                     "--vocab", "128", "--dtype", "fp32", "--seq", "256", "--gpus", "2", "--dp", "2",
                                     "--zero", "1", "--optimizer-offload", "--policy", "store_all", "--jobs", "1",
                                     "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "plan.json").read_text())["layout"]["optimizer_offload"] is True
    r = subprocess.run([sys.executable, "-m", "memo_exec", "run", str(tmp_path / "plan.json"), "--nproc", "2",
                        "--device", "cpu", "--steps", "2", "--out", str(tmp_path / "run"), "--json"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert len(doc["losses"]) == 2 and all(math.isfinite(x) for x in doc["losses"])
