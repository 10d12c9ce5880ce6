"""`memo-sim sweep-seq` of a mixture-of-experts plan sweeps the policies that price the model among those the plan's
framework offers (`Plan.framework`: memo's own search, or torchtitan's; a policy that priced dense blocks only used to
abort the whole sweep with exit 2); a policy asked for by name that does not price the model is still refused."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memo_sim.cli import cli


def test_sweep_seq_of_a_moe_plan_skips_the_policies_that_do_not_price_it(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "32K", "--profile",
                                 "h100-sxm5-80gb", "--tp", "1", "--ep", "8", "--dp", "16", "--policy", "memo",
                                 "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    s = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "s"),
                                 "--seqs", "32K", "--json"])
    assert s.exit_code == 0, s.output
    doc = json.loads((tmp_path / "s" / "mfu_vs_seq.json").read_text())
    swept = {r["policy"]["policy"] for r in doc}
    assert swept == {"store_all", "full_recompute", "full_offload", "memo", "recompute_moe",  # memo's own search's
                     "recompute_norm_act", "checkpoint_offload", "offload_attn"}, swept
    bad = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "b"),
                                   "--seqs", "32K", "--policy", "recompute_mlp"])
    assert bad.exit_code == 2 and "recompute_mlp" in bad.output and not (tmp_path / "b").exists()


def test_sweep_seq_of_a_torchtitan_moe_plan_sweeps_its_policies(tmp_path):
    """torchtitan offers op_sac, which prices its MoE blocks (`memo_sim.cost.op_sac_saves`): its sweep takes all three."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--layers", "4", "--gpus", "16", "--seq", "32K",
                                 "--profile", "h100-sxm5-80gb", "--tp", "1", "--ep", "8", "--dp", "16", "--framework",
                                 "torchtitan", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    s = CliRunner().invoke(cli, ["sweep-seq", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "s"),
                                 "--seqs", "32K", "--json"])
    assert s.exit_code == 0, s.output
    doc = json.loads((tmp_path / "s" / "mfu_vs_seq.json").read_text())
    assert {r["policy"]["policy"] for r in doc} == {"store_all", "full_recompute", "op_sac"}
