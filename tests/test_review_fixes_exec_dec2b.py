"""Review fixes of 2026-12-02 (every plan the simulator writes through the executor, and hand-edited ones): memo-exec
run refuses the layouts memo-sim check-plan refuses, with its line, before anything runs (a METP plan edited to
sp false ran into a shape error on its ranks; one edited to materialised attention ran METP's ring attention)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_exec.errors import ExecError
from memo_exec.plan_check import check_plan_contract
from memo_sim.cli import cli
from memo_sim.plan.schema import Plan

TINY = ["--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32", "--seq", "512",
        "--layers", "4", "--jobs", "1"]


@pytest.fixture(scope="module")
def metp_plan(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("metp")
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", *TINY, "--tp", "2", "--tp-mode", "metp",
                                 "--policy", "memo", "--alpha", "0.5", "--gpus", "2",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads((out / "plan.json").read_text())


@pytest.mark.parametrize("edit, words", [
    ({"sp": False}, "sp must be on"),
    ({"attention": "materialised"}, "materialised attention"),
    ({"zero": 3}, "ZeRO needs a data/context-parallel group larger than 1"),
])
def test_exec_refuses_a_layout_check_plan_refuses(metp_plan, edit, words, tmp_path):
    d = json.loads(json.dumps(metp_plan))
    d["layout"].update(edit)
    d["memory_plan"] = None  # the layout's line, not the memory plan's
    with pytest.raises(ExecError) as e:
        check_plan_contract(Plan.from_dict(d), "plan.json", use_memory_plan=False, device="cpu")
    assert str(e.value).startswith("plan.json: layout: ") and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 2 and words in r.output, r.output


def test_exec_still_accepts_the_plan_as_written(metp_plan):
    check_plan_contract(Plan.from_dict(metp_plan), "plan.json", device="cpu")


# ---- a rank's own failure is not a collective's ------------------------------------------------------------------

def test_a_ranks_own_error_is_not_blamed_on_a_peer(tmp_path, capsys):
    """A shape error on a rank 4 s into a run was said to be a collective's, with another rank exited or the 600 s
    timeout passed (a review); a process group's own errors still are."""
    from memo_exec.distributed import launch

    own = launch.comm_failure_line(0, RuntimeError("shape '[512, 64]' is invalid for input of size 16384"), 600,
                                   collective=False)
    assert launch.RUN_FAILED in own and launch.COMM_FAILED not in own and "timeout" not in own, own
    peer = launch.comm_failure_line(1, RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
                                    600, collective=False)
    assert launch.COMM_FAILED in peer, peer
    assert launch.COMM_FAILED in launch.comm_failure_line(0, RuntimeError("x"), 600)  # a collective's call site
    log = tmp_path / ".o.x.partial" / "launcher.log"
    log.parent.mkdir()
    log.write_text("torchrun's log\n")
    assert launch._launch_status(1, 2, log, own, {own}, began=True) == 1  # a crash: exit 1, the stage named
    err = capsys.readouterr().err.strip()
    assert err.startswith(own) and str(log) in err and len(err.splitlines()) == 1, err
