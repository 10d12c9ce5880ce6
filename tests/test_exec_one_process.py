"""A one-device plan whose schedule lives in the distributed executor (SPPO with pp = 1) runs in
`memo-exec run`'s own process, as a process group of one: no torchrun, no launcher, the same
outputs; `Executor`'s single-device loop refuses it in one line that says so."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist
from click.testing import CliRunner

from memo_exec.cli import cli
from memo_exec.errors import ExecError
from memo_exec.runner import Executor, RunOptions, distributed_only
from memo_sim.cost.sppo import partition_bounds
from memo_sim.model.config import ModelConfig
from memo_sim.plan.schema import write_plan
from memo_sim.policy.sppo import Sppo
from tests.exec_helpers import make_plan, policy

MODEL = ModelConfig("sppo-one", 2, 64, 4, 128, vocab=128, dtype="fp32")
SEQ = 64


def _sppo_plan(n: int = 4):
    pol = Sppo(None, subseqs=n, bounds=partition_bounds(MODEL, 1, SEQ, n, "flops"), alphas=(0.5,) * n,
               partition="flops", multiplex=False)
    return make_plan(MODEL, SEQ, pol, chunk=32)


def test_which_one_device_plans_need_the_distributed_executor():
    assert distributed_only(_sppo_plan()) and "sppo schedule" in distributed_only(_sppo_plan())
    assert distributed_only(make_plan(MODEL, SEQ, policy("store_all"))) is None
    with pytest.raises(ExecError, match="runs it in one process"):
        Executor(_sppo_plan(), RunOptions(device="cpu"))


@pytest.mark.slow  # about a minute on the shared 2-core machine: the run's report re-predicts the SPPO plan
def test_memo_exec_run_runs_a_one_stage_sppo_plan_in_process(tmp_path):
    out = tmp_path / "run"
    plan_file = write_plan(_sppo_plan(), tmp_path / "plan.json")
    r = CliRunner().invoke(cli, ["run", str(plan_file), "--device", "cpu", "--steps", "2", "--out", str(out),
                                 "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["world"] == 1 and len(doc["losses"]) == 2 and all(x == x and x > 0 for x in doc["losses"])
    assert all(str(out) in p for p in doc["files"].values())  # the paths once moved in, not the stage
    assert not (out / "launcher.log").exists()  # no torchrun
    assert not dist.is_initialized()  # the group of one is torn down
    measured = json.loads((out / "measured.json").read_text())
    assert any(e["op"].startswith("stage_fwd@s3") for e in measured["events"])  # the 4 subsequences ran
