"""[exec-complete] selective recompute in the executor (`memo_exec.activations.selective_recompute`):
store all's tensors without the attention core's state, the core re-run from the kept q, k, v
before each layer's backward. The gradients are store all's (fp64), each layer's backward is
preceded by one attention recompute in the trace, the lse is not kept between a layer's forward and
its backward, and the what-if's Megatron plan with it runs on one process and with TP 2 under
--nproc 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from memo_exec.runner import Executor, RunOptions  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402
from tests.exec_helpers import executor_grads, make_plan, time_limit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ModelConfig("sel", 3, 64, 4, 256, vocab=128, dtype="fp32")


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


def test_gradients_are_store_alls_and_the_attention_is_rerun():
    l0, g0, _ = executor_grads(make_plan(MODEL, 256, get_policy("store_all")), dtype="fp64")
    plan = make_plan(MODEL, 256, get_policy("selective_recompute"))
    seen = []

    def watch(ex):
        orig = ex.policy.recompute

        def recompute(compute, weights, storage, i):
            seen.append((i, storage.aux is None))  # the lse was dropped after the forward
            orig(compute, weights, storage, i)
            assert storage.aux is not None
        ex.policy.recompute = recompute

    l1, g1, ex = executor_grads(plan, dtype="fp64", setup=watch)
    assert l1 == l0 and set(g1) == set(g0)
    assert max(float((g0[k] - g1[k]).norm() / g0[k].norm()) for k in g0) == 0.0
    assert seen == [(2, True), (1, True), (0, True)]


def test_trace_has_one_attention_recompute_per_layer():
    ex = Executor(make_plan(MODEL, 256, get_policy("selective_recompute")), RunOptions(device="cpu", steps=2))
    try:
        res = ex.run()
    finally:
        ex.close()
    ev = res.steps[-1].events if hasattr(res.steps[-1], "events") else None
    if ev is None:
        pytest.skip("this run's records keep no events")
    rec = [(e.op, e.layer) for e in ev if e.phase == "recompute"]
    assert sorted(rec) == [("attention", i) for i in range(3)], rec


# the two-rank twin in the slow selection (28 s), to balance CI's two processes
@pytest.mark.parametrize("extra,nproc", [([], 1), pytest.param(["--tp", "2"], 2, marks=pytest.mark.slow)],
                         ids=["one-gpu", "tp2"])
def test_whatif_megatron_selective_plan_runs(tmp_path, extra, nproc):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "memo_sim.cli", "whatif", "--layers", "2", "--hidden", "64", "--heads",
                        "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32", "--seq", "256", "--gpus", str(nproc),
                        *extra, "--policy", "selective_recompute", "--framework", "megatron", "--jobs", "1", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["policy"]["policy"] == "selective_recompute"
    cmd = [sys.executable, "-m", "memo_exec", "run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "2",
           "--out", str(tmp_path / "run"), "--json"] + (["--nproc", str(nproc)] if nproc > 1 else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    losses = doc["losses"] if "losses" in doc else [s["loss"] for s in doc.get("steps", [])]
    assert losses and all(math.isfinite(x) for x in losses)
