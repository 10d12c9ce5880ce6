"""An out-of-memory found by the caching-allocator replay names the reserved bytes that explain it (a review: 'needs
3.50 GiB with 44.61 GiB of 78.00 GiB in use' named the allocated bytes alone, which leave room)."""

from __future__ import annotations

from click.testing import CliRunner

from memo_sim.cli import cli


def test_a_fragmentation_oom_names_the_reserved_bytes(tmp_path):
    plan = tmp_path / "p"
    res = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "512K", "--profile",
                                   "h100-sxm5-80gb", "--policy", "full_recompute", "--tp", "1", "--ulysses", "8",
                                   "--zero", "3", "--jobs", "1", "--simulate-top", "1", "--out", str(plan)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["simulate", str(plan / "plan.json"), "--out", str(tmp_path / "s"),
                                   "--allocator-lag", "16"])
    assert res.exit_code == 3, res.output
    line = next(x for x in res.output.splitlines() if "caching-allocator fragmentation" in x)
    assert " reserved, " in line and "free in pieces of segments still in use" in line, line
