"""Fixes from the 2026-12-01 reviews that are not one part's own (plan files and their readers)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memo_sim.cli import cli


def test_a_pipeline_plans_peak_is_named_as_the_what_if_named_it(tmp_path):
    """A pipeline's simulated peak sums its allocations (no caching-allocator replay): the what-if said so, but
    check-plan and explain's per-stage table called the same number 'simulated, caching allocator' (a review)."""
    out = tmp_path / "pp"
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "8", "--gpus", "16", "--seq", "16K",
                                 "--profile", "h100-sxm5-80gb", "--pp", "4", "--tp", "4", "--jobs", "1",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "plan.json").read_text())["predicted"]["allocator"] == {"replayed": False}
    r = CliRunner().invoke(cli, ["check-plan", str(out / "plan.json")])
    assert r.exit_code == 0, r.output
    assert "(simulated, allocated: no caching-allocator replay)" in r.output.splitlines()[2]
    assert "peak (simulated, caching allocator)" not in r.output
    assert "peak (simulated, allocated: no caching-allocator replay)" in r.output
