"""`memo-sim sweep-seq`'s header counts the policies it runs (a QA review: a METP plan's header read "6 policies x
3 lengths x 1 layouts" above 15 rows of 5 policies: recompute_mlp, counted, is left out of METP by
`Policy.layout_why_not`), and one line names each policy left out of a layout and why (recompute_mlp and, since
2026-12-03, offload_attn: Megatron's parts of its own TP layer)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.policy import policy_class

TINY = ["--layers", "2", "--hidden", "256", "--heads", "8", "--vocab", "512", "--seq", "4K", "--gpus", "2",
        "--tp", "2", "--pp", "1", "--policy", "store_all", "--jobs", "1"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for mode in ("metp", "megatron"):
        r = CliRunner().invoke(cli, ["whatif", *TINY, "--tp-mode", mode, "--out", str(d / mode)])
        assert r.exit_code == 0, r.output
        out[mode] = str(d / mode / "plan.json")
    return out


def _sweep(plan, out, *args):
    r = CliRunner().invoke(cli, ["sweep-seq", plan, "--out", str(out), "--jobs", "1", "--no-progress", *args])
    assert r.exit_code == 0, r.output
    return r.output


def _rows(output: str) -> list[list[str]]:
    lines = output.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("---")) + 1
    rows = []
    for ln in lines[start:]:
        if not re.match(r"\s*\d", ln):
            break
        rows.append(ln.split())
    return rows


def test_header_counts_the_policies_run_and_names_the_one_left_out(plans, tmp_path):
    out = _sweep(plans["metp"], tmp_path / "s", "--seqs", "4K,8K")
    head = re.search(r"(\d+) policies x (\d+) lengths x (\d+) layouts", out.splitlines()[0])
    assert head, out
    rows = _rows(out)
    policies = {r[2] for r in rows}
    assert int(head.group(1)) == len(policies) and int(head.group(2)) == 2 and int(head.group(3)) == 1, out
    assert len(rows) == int(head.group(1)) * 2, out
    # Megatron's module recompute and module offload: parts of its own TP layer, left out of METP's
    for pol in ("recompute_mlp", "offload_attn"):
        assert pol not in policies
        why = policy_class(pol).layout_why_not(_layout(plans["metp"]))
        assert why and f"  left out: {pol} on tp2+metp: {why}" in out.splitlines(), out
    assert sum("left out:" in ln for ln in out.splitlines()) == 2, out


def test_a_layout_that_runs_every_policy_names_none(plans, tmp_path):
    out = _sweep(plans["megatron"], tmp_path / "s", "--seqs", "4K")
    head = re.search(r"(\d+) policies x 1 lengths x 1 layouts", out.splitlines()[0])
    rows = _rows(out)
    assert head and int(head.group(1)) == len(rows) and "recompute_mlp" in {r[2] for r in rows}, out
    assert "left out:" not in out


def test_flavours_that_run_different_policies_count_the_runs(plans, tmp_path):
    """Over --tp-mode megatron,metp recompute_mlp and offload_attn run on Megatron's layout only: the header counts
    the rows."""
    out = _sweep(plans["megatron"], tmp_path / "s", "--seqs", "4K", "--tp-mode", "megatron,metp")
    head = re.search(r"(\d+) runs \((\d+) policies x 1 lengths x 2 layouts, less the ones left out below\)",
                     out.splitlines()[0])
    rows = _rows(out)
    assert head and int(head.group(1)) == len(rows), out
    assert int(head.group(2)) == len({r[2] for r in rows}), out
    left = [ln for ln in out.splitlines() if "left out:" in ln]
    assert len(left) == 2 and {ln.split(" on ")[0] for ln in left} == {"  left out: recompute_mlp",
                                                                          "  left out: offload_attn"}, out
    assert all(" on tp2+metp: " in ln for ln in left), out


def _layout(plan_file):
    from memo_sim.plan.schema import read_plan

    return read_plan(plan_file).layout
