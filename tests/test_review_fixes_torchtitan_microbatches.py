"""torchtitan runs 1F1B with at least as many micro-batches as stages (PyTorch's Schedule1F1B raises below that): the
search under --framework torchtitan and the torchtitan export say so in one line (a review: 2 micro-batches over 4
stages were planned and written as expressed); Megatron-LM runs fewer."""

from __future__ import annotations

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.search.frameworks import get_framework

ARGS = ["whatif", "--model", "llama-3.1-70b", "--gpus", "64", "--seq", "32K", "--tp", "8", "--pp", "4", "--vpp", "1",
        "--dp", "2", "--batch", "2", "--micro-batch", "1", "--profile", "h100-sxm5-80gb", "--policy", "full_recompute",
        "--simulate-top", "1", "--jobs", "1"]


def test_the_rule_is_torchtitans():
    assert "Schedule1F1B" in get_framework("torchtitan").schedule_why_not("1f1b", 4, 2)
    assert get_framework("torchtitan").schedule_why_not("1f1b", 4, 4) is None
    assert get_framework("megatron").schedule_why_not("1f1b", 4, 2) is None


def test_torchtitan_refuses_fewer_micro_batches_than_stages_and_its_export_says_so(tmp_path):
    r = CliRunner().invoke(cli, ARGS + ["--framework", "torchtitan", "--out", str(tmp_path / "tt")])
    assert r.exit_code == 2 and "at least as many micro-batches as pipeline stages, got 2 for pp 4" in r.output, \
        r.output
    r = CliRunner().invoke(cli, ARGS + ["--framework", "megatron", "--out", str(tmp_path / "mg")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["export", str(tmp_path / "mg" / "plan.json"), "--to", "torchtitan", "--nearest",
                                 "--out", str(tmp_path / "exp")])
    assert r.exit_code == 0, r.output
    assert "1F1B with 2 micro-batches over 4 pipeline stages -> 4 micro-batches of 1" in r.output, r.output
