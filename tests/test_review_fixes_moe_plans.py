"""MoE plans a review found the what-if wrote and nothing could read, or priced where Megatron-LM refuses them."""

from __future__ import annotations

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS

MIXTRAL = PRESETS["mixtral-8x7b"]


def test_a_deepep_plan_over_two_nodes_reads_back(tmp_path):
    """The what-if wrote a 16-GPU DeepEP plan on 8-GPU nodes; check-plan (and explain, simulate, export) refused it
    with 'this profile's nodes hold 16': the plan check widens the node to the plan's GPUs for TP, and the
    dispatcher's limit was checked on that widened node, not the profile's."""
    lay = Layout(tp=2, dp=8, ep=8, zero=3, moe_dispatcher="deepep")
    assert "nodes of at most 8 GPUs" in check_layout(lay, MIXTRAL, 16, 16, 16384)
    assert check_layout(lay, MIXTRAL, 16, 16, 16384, node_gpus=8) is None
    out = tmp_path / "dp2"
    args = ["whatif", "--model", "mixtral-8x7b", "--layers", "2", "--gpus", "16", "--profile", "h100-sxm5-80gb",
            "--tp", "2", "--ep", "8", "--seq", "16K", "--policy", "full_recompute", "--moe-dispatcher", "deepep",
            "--jobs", "1", "--out", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["check-plan", str(out / "plan.json")])
    assert r.exit_code == 0 and "valid" in r.output, r.output


def test_deepep_with_capacity_padding_is_refused_as_megatron_refuses_it():
    """Megatron-LM (TransformerConfig at d98e8a64) raises on the flex dispatcher's deepep backend with
    --moe-pad-expert-input-to-capacity; memo priced the pair and exported it as fully expressed."""
    lay = Layout(tp=2, dp=4, ep=4, zero=1, moe_dispatcher="deepep", moe_balance="capacity:1.25")
    why = check_layout(lay, MIXTRAL, 8, 8, 16384)
    assert why and "does not pad expert inputs" in why and "--moe-balance dropless" in why
    assert check_layout(Layout(tp=2, dp=4, ep=4, zero=1, moe_balance="capacity:1.25"), MIXTRAL, 8, 8, 16384) is None
    r = CliRunner().invoke(cli, ["whatif", "--model", "mixtral-8x7b", "--layers", "2", "--gpus", "8", "--profile",
                                 "h100-sxm5-80gb", "--tp", "2", "--ep", "4", "--seq", "16K", "--policy",
                                 "full_recompute", "--moe-dispatcher", "deepep", "--moe-balance", "capacity:1.25",
                                 "--framework", "megatron", "--no-plan", "--jobs", "1"])
    assert r.exit_code == 2 and "does not pad expert inputs" in r.output
    assert len(r.output.strip().splitlines()) == 1
