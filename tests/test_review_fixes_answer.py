"""A MoE user review (2026-12-01): with --framework, memo's own best beside the framework's keeps the --policy the
user asked for, as it keeps the fixed degrees (it compared Megatron-LM's full recompute with memo's store_all)."""

import json

from click.testing import CliRunner

from memo_sim.cli import cli


def test_memo_best_keeps_the_asked_policy():
    args = ["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "8K", "--profile", "h100-sxm5-80gb",
            "--framework", "megatron", "--no-plan", "--json"]
    for policy in ("full_recompute", "store_all"):
        out = CliRunner().invoke(cli, args + ["--policy", policy])
        assert out.exit_code == 0, out.output
        d = json.loads(out.output)
        assert d["memo_best"]["policy"] == policy
    out = CliRunner().invoke(cli, args)  # no --policy: memo's side searches its own policies
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["memo_best"] is not None
