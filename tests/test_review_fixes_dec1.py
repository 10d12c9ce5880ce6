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


def test_a_pipeline_stage_is_charged_no_host_block_for_units_it_never_offloads():
    """MEMO on a pipeline rank offloads every (layer, micro-batch) unit but its last KEPT_LAYERS (2): the last stage of
    pp 2 with a layer a stage and 2 micro-batches offloads nothing, yet the analytic tier charged it a host block for
    the one it holds in flight (a review of memo-exec's pool, which holds none there). Where the rank holds more
    units over the iteration than in flight, the count is unchanged."""
    from memo_sim.layout.parallel import Layout
    from memo_sim.search.pipeline import _host_units_of

    assert _host_units_of(2, Layout(pp=2), (2, 1), 2, 8) == (0, (2, 1), (0, 0), 0)
    assert _host_units_of(4, Layout(pp=2), (4, 1), 4, 8) == (4, (8, 2), (6, 2), 8)


def test_an_uneven_split_with_no_pipeline_to_split_is_refused():
    """--decoder-first-pipeline-num-layers on one GPU: no pipeline is valid, and the what-if answered a single-stage
    plan without a word (with --pp 1 the same flag was refused in one line) (a review)."""
    args = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq",
            "2K", "--gpus", "1", "--decoder-first-pipeline-num-layers", "2", "--no-plan", "--jobs", "1"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--decoder-first/last-pipeline-num-layers: no pipeline layout is valid" in r.output
    assert "no layout of pp >= 2 over 1 GPU)" in r.output
