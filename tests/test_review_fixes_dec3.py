"""Review fixes of 2026-12-03: a plan's policy is checked against its model and layout by every command that reads the
plan, before anything runs (`memo_sim.search.plan_check.layout_problem`), as the what-if leaves such a pair out: a
hand-made plan of selective recompute on METP was refused by memo-exec only after its ranks had started."""

import json

from click.testing import CliRunner

from memo_exec.cli import cli as exec_cli
from memo_sim.cli import cli


def _metp_plan(tmp_path, policy: str):
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "4", "--gpus", "2", "--seq", "4K", "--tp",
                                 "2", "--tp-mode", "metp_ffn", "--policy", "full_recompute", "--out",
                                 str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    d["policy"]["policy"] = policy
    f = tmp_path / f"{policy}.json"
    f.write_text(json.dumps(d))
    return f


def _one_line(r):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def test_selective_recompute_on_metp_is_refused_before_the_ranks_start(tmp_path):
    f = _metp_plan(tmp_path, "selective_recompute")
    line = _one_line(CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--nproc", "2"]))
    assert "policy: selective recompute" in line and "tp_mode megatron" in line and "launcher.log" not in line
    line = _one_line(CliRunner().invoke(cli, ["check-plan", str(f)]))
    assert "tp_mode metp_ffn does not have" in line
    line = _one_line(CliRunner().invoke(cli, ["simulate", str(f), "--out", str(tmp_path / "sim")]))
    assert "selective recompute" in line


def test_megatrons_module_offload_on_metp_is_refused_in_one_line(tmp_path):
    f = _metp_plan(tmp_path, "offload_attn")
    line = _one_line(CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--nproc", "2"]))
    assert "--offload-modules" in line and "tp_mode megatron" in line


def test_a_plan_without_its_schedule_runs_the_schedule_its_virtual_stages_name(tmp_path):
    """A plan of earlier releases has no ``schedule``: with virtual stages (vpp > 1) it is the interleaved 1F1B's
    (a review: such a plan, its schedule deleted, was refused as '1f1b' by every command)."""
    from memo_sim.layout.schedule import default_schedule
    from memo_sim.plan.schema import read_plan

    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "8", "--gpus", "2", "--seq", "4K", "--pp",
                                 "2", "--vpp", "2", "--schedule", "interleaved_1f1b", "--global-batch", "4",
                                 "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert d.pop("schedule") == "interleaved_1f1b"
    f = tmp_path / "old.json"
    f.write_text(json.dumps(d))
    assert read_plan(f).schedule == "interleaved_1f1b"
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 0, r.output
    assert default_schedule(2, "memo") == "1f1b" and default_schedule(1, "memo", 1) == "single_stage"
