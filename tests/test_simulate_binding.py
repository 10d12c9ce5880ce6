"""[answers #30 item 2] `memo-sim simulate` says what binds (the words of `memo-sim explain`), not
only the peak, and counts its micro-batches in words ("1 micro-batch")."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--gpus", "1", "--jobs", "1"]


def test_simulate_prints_the_binding_limit_of_explain(tmp_path):
    for policy in ("full_offload", "memo"):
        out = tmp_path / policy
        assert CliRunner().invoke(cli, [*TOY, "--policy", policy, "--out", str(out)]).exit_code == 0
        plan = str(out / "plan.json")
        why = json.loads(CliRunner().invoke(cli, ["explain", plan, "--json"]).output)["binding"]
        r = CliRunner().invoke(cli, ["simulate", plan, "--out", str(tmp_path / f"sim-{policy}")])
        assert r.exit_code == 0, r.output
        assert f"binding: {why} (memo-sim explain PLAN" in r.output
        assert "(1 micro-batch of 1)" in r.output.splitlines()[0]
