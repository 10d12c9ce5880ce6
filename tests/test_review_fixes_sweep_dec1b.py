"""Review fixes of 2026-12-01 (docs review): sweep-seq's --tp-mode offers the flavours the plan's framework runs, as
the what-if does (async_tp was swept under ``any``), and --best-policy without --tp-mode is refused, not ignored."""

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "512"]


@pytest.fixture(scope="module")
def tp2_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp2")
    r = CliRunner().invoke(cli, ["whatif", *TOY, "--seq", "2K", "--gpus", "2", "--tp", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out / "plan.json"


def test_sweep_seq_refuses_a_tp_flavour_the_plans_framework_does_not_run(tp2_plan, tmp_path):
    r = CliRunner().invoke(cli, ["sweep-seq", str(tp2_plan), "--out", str(tmp_path / "s"), "--seqs", "2K",
                                 "--tp-mode", "async_tp"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "--tp-mode" in r.output and "framework any runs (megatron, metp_ffn, metp)" in r.output
    ok = CliRunner().invoke(cli, ["sweep-seq", str(tp2_plan), "--out", str(tmp_path / "ok"), "--seqs", "2K",
                                  "--tp-mode", "megatron,metp_ffn", "--policy", "store_all"])
    assert ok.exit_code == 0, ok.output


def test_best_policy_without_tp_mode_is_refused(tp2_plan, tmp_path):
    r = CliRunner().invoke(cli, ["sweep-seq", str(tp2_plan), "--out", str(tmp_path / "s"), "--seqs", "2K",
                                 "--best-policy"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "add --tp-mode" in r.output, r.output
