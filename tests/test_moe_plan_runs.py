"""[moe] A MoE plan memo-sim writes runs in memo-exec on the CPU, MEMO's static memory plan included:
the MoE block's transients are listed as unplaced (the executor's block allocates them through the
caching allocator), so the executor accepts the plan instead of refusing a name it does not place."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_sim.cli import cli as sim_cli
from memo_sim.model.config import ModelConfig

TOY = {"name": "toy-moe", "layers": 3, "hidden": 128, "heads": 4, "ffn": 256, "vocab": 512, "ffn_type": "swiglu",
       "norm": "rmsnorm", "bias": "none", "tied_embeddings": False, "dtype": "fp32", "experts": 4, "top_k": 2,
       "expert_ffn": 128, "dense_layers": 1}


@pytest.mark.parametrize("policy", [["memo", "--alpha", "0.5"], ["full_recompute"]])
def test_a_moe_plan_with_its_memory_plan_runs_on_the_cpu(tmp_path, policy):
    (tmp_path / "toy-moe.json").write_text(json.dumps(TOY))
    r = CliRunner().invoke(sim_cli, ["whatif", "--model", str(tmp_path / "toy-moe.json"), "--seq", "512", "--gpus", "1",
                                     "--policy", *policy, "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    if policy[0] == "memo":  # MEMO's static plan: the MoE block's transients beside the arena
        fwd = plan["memory_plan"]["phases"]["fwd"]
        assert "combine_recv" in fwd.get("unplaced", {}) and "combine_recv" not in fwd["offsets"]
    out = tmp_path / "run"
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--steps", "1",
                                      "--out", str(out)])
    assert r.exit_code == 0, r.output
    measured = json.loads((out / "measured.json").read_text())
    assert measured["meta"]["params"] == ModelConfig.from_dict(plan["model"]).params()
