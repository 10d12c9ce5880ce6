"""``memo-exec run`` on multi-device plans: --nproc and torchrun launches, refusals before any
allocation (one line, exit 2, every rank), a killed rank stopping the others within the
process-group timeout, the merged per-rank trace and report, and ``memo-exec trace`` on a
TP/CP plan."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from memo_exec.cli import cli  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.plan.schema import write_plan  # noqa: E402
from tests.cli_run import run_sim  # noqa: E402
from tests.dist_cases import plan_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _plan(tmp_path, layout: Layout, seq: int = 128, pol: str = "memo", name: str = "plan.json") -> Path:
    return write_plan(plan_for(layout, seq, pol), tmp_path / name)


def _error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


def _one_error(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


# ---------------------------------------------------------------------------------- refusals
def test_nproc_different_from_the_plan_is_refused_before_launch(tmp_path):
    p = _plan(tmp_path, Layout(tp=2, cp=2))
    line = _one_error(CliRunner().invoke(cli, ["run", str(p), "--nproc", "3", "--device", "cpu",
                                               "--out", str(tmp_path / "o")]))
    assert "needs 4 processes" in line and "world size is 3" in line and "--nproc 4" in line
    assert not (tmp_path / "o").exists()


def test_group_that_does_not_divide_is_refused(tmp_path):
    p = _plan(tmp_path, Layout(cp=2), seq=130)
    line = _one_error(CliRunner().invoke(cli, ["run", str(p), "--nproc", "2", "--device", "cpu"]))
    # check-plan's line, before anything launches (memo_sim.search.plan_check.runnable_problems' layout check)
    assert "layout: sequence length 130 not divisible" in line and "seq_tokens 132 (or 128) divides" in line, line


def test_multi_device_plan_without_a_launcher_is_refused(tmp_path):
    p = _plan(tmp_path, Layout(dp=2, zero=1))
    line = _one_error(CliRunner().invoke(cli, ["run", str(p), "--device", "cpu"]))
    assert "--nproc 2" in line and "torchrun" in line


def test_unregistered_tp_mode_and_pipeline_are_refused(tmp_path):
    from memo_exec.distributed import schedule, tp

    if "metp" not in tp.registered():
        p = _plan(tmp_path, Layout(tp=2, tp_mode="metp"), name="metp.json")
        line = _one_error(CliRunner().invoke(cli, ["run", str(p), "--nproc", "2", "--device", "cpu"]))
        assert "layout.tp_mode 'metp'" in line
    plan = plan_for(Layout(pp=2), 128, "memo")  # the layout set after the schedule: single_stage with pp 2
    line = _one_error(CliRunner().invoke(cli, ["run", str(write_plan(plan, tmp_path / "pp.json")), "--nproc", "2",
                                               "--device", "cpu"]))
    assert "single_stage runs one pipeline stage, but pp is 2" in line
    plan.schedule = "1f1b"
    assert schedule.schedule_for(plan).name == "1f1b"
    saved = schedule.SCHEDULES._items.pop("1f1b")
    try:  # a schedule name with no registered class: refused with the ones this executor runs
        with pytest.raises(Exception, match=r"schedule '1f1b': the executor runs interleaved_1f1b, single_stage, "
                                            r"sppo"):
            schedule.schedule_for(plan)
    finally:
        schedule.SCHEDULES._items["1f1b"] = saved


@pytest.mark.slow
def test_torchrun_with_the_wrong_world_refuses_on_every_rank(tmp_path):
    p = _plan(tmp_path, Layout(tp=2, cp=2))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "memo_exec", "run", str(p), "--device", "cpu", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=180, env=_env(), cwd=tmp_path)
    assert r.returncode != 0
    errors = _error_lines(r.stderr)
    # every rank checks before joining the group and refuses with the same line (torchrun stops the
    # other ranks as soon as the first exits, so a rank may be stopped before it prints)
    assert 1 <= len(errors) <= 2 and len(set(errors)) == 1, r.stderr[-3000:]
    assert "world size is 2" in errors[0]
    assert "memo_exec/" not in r.stderr  # no rank traceback (torchrun reports the exit codes in its own)


# ---------------------------------------------------------------------------------- failures
@pytest.mark.slow
def test_a_killed_rank_stops_the_others_with_one_message(tmp_path):
    p = _plan(tmp_path, Layout(tp=2), seq=128)
    timeout = 60
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "memo_exec", "run", str(p), "--nproc", "2", "--device", "cpu",
                        "--steps", "3", "--pg-timeout", str(timeout), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300, env=_env(MEMO_EXEC_TEST_KILL="1:1"),
                       cwd=tmp_path)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    # torchrun may stop rank 0 before it reports its failed collective: the launcher names the dead rank
    assert len(lines) == 1 and lines[0].startswith("error: rank 1 died (SIGKILL)"), r.stderr[-2000:]
    assert elapsed < timeout + 60, elapsed  # launch and two steps, then down within the group timeout


# ---------------------------------------------------------------------------------- outputs
def _run_nproc(plan: Path, out: Path, nproc: int, steps: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "memo_exec", "run", str(plan), "--nproc", str(nproc), "--device", "cpu",
                        "--steps", str(steps), "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=900, env=_env(), cwd=out.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _check_outputs(doc: dict, out: Path, world: int) -> None:
    assert len(doc["per_rank"]) == world
    trace = json.loads((out / "trace.json").read_text())
    pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert pids == set(range(world))  # one process per rank, its streams as threads
    threads = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert all((r, "compute") in threads for r in range(world))
    report = (out / "report.md").read_text()
    assert "## Per rank" in report and "CPU memory" in report
    rows = [ln for ln in report.split("## Per rank")[1].splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == world


@pytest.mark.slow  # 21 s in CI (2026-11-30): in the slow selection, to balance CI's two processes
def test_nproc_run_writes_a_merged_trace_and_per_rank_report(tmp_path):
    p = _plan(tmp_path, Layout(cp=2, zero=1), seq=128)
    doc = _run_nproc(p, tmp_path / "o", 2, 2)
    _check_outputs(doc, tmp_path / "o", 2)
    assert all(abs(r["last_loss"] - doc["losses"][-1]) < 1e-9 for r in doc["per_rank"])
    report = (tmp_path / "o" / "report.md").read_text()  # the figures redrawn with both ranks (#30 item 7)
    assert "The figures draw all 2 ranks" in report and "shows rank 0 only" not in report


# (four ranks, tp2+cp2, under --nproc and under torchrun with the same losses: README's tour, whose
# commands run that plan both ways, tests/test_readme_tour.py)


@pytest.mark.slow
def test_torchrun_one_rank_gloo_matches_the_single_device_path(tmp_path):
    """The CPU twin of the GPU item: a single-rank plan through torchrun and the distributed path."""
    p = _plan(tmp_path, Layout(), seq=256)
    common = ["run", str(p), "--device", "cpu", "--steps", "3", "--json"]
    runs = []
    for launcher, out in (([sys.executable, "-m", "memo_exec"], "single"),
                          ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                            "-m", "memo_exec"], "dist")):
        r = subprocess.run([*launcher, *common, "--out", str(tmp_path / out)], capture_output=True, text=True,
                           timeout=600, env=_env(), cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout)["losses"])
    for a, b in zip(*runs):
        assert abs(a - b) <= 1e-5 * abs(b), runs


# ---------------------------------------------------------------------------------- trace
def test_trace_of_a_tp_cp_plan_records_one_ranks_layer(tmp_path):
    whole = _plan(tmp_path, Layout(), seq=256, name="one.json")
    tp = _plan(tmp_path, Layout(tp=2, sp=True), seq=256, name="tp.json")
    cp = _plan(tmp_path, Layout(cp=2), seq=256, name="cp.json")
    docs = {}
    for name, p in (("one", whole), ("tp", tp), ("cp", cp)):
        out = tmp_path / f"{name}_trace.json"
        r = CliRunner().invoke(cli, ["trace", str(p), "--device", "meta", "--out", str(out)])
        assert r.exit_code == 0, r.output
        docs[name] = json.loads(out.read_text())
    assert docs["one"]["meta"]["tokens"] == 256
    assert docs["tp"]["meta"]["tokens"] == 128 and docs["tp"]["meta"]["layout"] == "tp2+sp"
    assert docs["cp"]["meta"]["tokens"] == 128 and docs["cp"]["meta"]["attention_seq"] == 128
    names = {b.get("name") or b["id"] for b in docs["tp"]["buffers"]}
    assert {"ln1_gathered", "proj_partial", "d_ln1_partial"} <= names  # the collectives' buffers
    size = {(b.get("name") or b["id"]): b["size"] for b in docs["one"]["buffers"]}
    size_tp = {(b.get("name") or b["id"]): b["size"] for b in docs["tp"]["buffers"]}
    assert size_tp["d_q"] == size["d_q"] // 2  # half the heads, all the gathered tokens
    r = CliRunner().invoke(cli, ["trace", str(tp), "--device", "cpu", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--device meta" in r.output


@pytest.mark.slow
def test_whatif_pipelined_memo_plan_runs_its_memory_plan_under_nproc(tmp_path):
    """[exec-complete] item 2: the what-if's pp 2 x dp 2 MEMO plan carries its memory plan (level 2 per
    pipeline rank) and `memo-exec run --nproc 4 --device cpu` runs it with each stage's layer scratch at
    the plan's offsets (the gradients against one process: tests/test_pipeline_exec_dist.py)."""
    run_sim(["whatif", "--layers", "6", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype",
             "fp32", "--seq", "512", "--gpus", "4", "--pp", "2", "--dp", "2", "--schedule", "1f1b", "--policy", "memo",
             "--alpha", "0.5", "--jobs", "1", "--out", tmp_path])  # in process: a Python start-up fewer
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["layout"]["pp"] == 2 and [s["stage"] for s in plan["memory_plan"]["stages"]] == [0, 1]
    doc = _run_nproc(tmp_path / "plan.json", tmp_path / "run", 4, 2)
    assert len(doc["per_rank"]) == 4 and all(math.isfinite(x) for x in doc["losses"])
    meta = json.loads((tmp_path / "run" / "measured.json").read_text())["meta"]
    mp = meta["memory_plan"]  # rank 0's: its layer scratch in the arena the plan's level 1 sizes
    assert mp["arena_bytes"] > 0 and mp["placed"]["fwd"] and mp["placed"]["bwd"], mp


def test_killed_rank_reads_torchruns_root_cause():
    from memo_exec.distributed.launch import killed_rank

    log = ("Failures:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 1)\n"
           "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-22_17:09:08\n"
           "  host      : x\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 2)\n")
    assert killed_rank(log) == (1, -9)
    assert killed_rank(log.replace("-9 (pid: 2)", "1 (pid: 2)")) is None  # exited by itself: its own line
    assert killed_rank("no summary") is None


# both in the slow selection (29 s and 27 s in CI, 2026-11-30), to balance CI's two processes
@pytest.mark.slow
@pytest.mark.parametrize("group", [["--cp", "2"], ["--ulysses", "2"]], ids=["pp2-cp2", "pp2-ulysses2"])
def test_whatif_pipeline_plan_with_a_sequence_group_runs_under_nproc(tmp_path, group):
    """[exec-complete] the what-if's pp 2 x ring CP 2 and pp 2 x Ulysses 2 MEMO plans (1F1B, 2
    micro-batches, 3 layers a stage) run under `memo-exec run --nproc 4 --device cpu`: every rank
    reports the same losses, MEMO offloads (alpha 0.5), and the outputs merge the 4 ranks (the gradients against one
    process: tests/test_pipeline_exec_dist.py)."""
    run_sim(["whatif", "--layers", "6", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype",
             "fp32", "--seq", "512", "--gpus", "4", "--pp", "2", *group, "--schedule", "1f1b", "--policy", "memo",
             "--alpha", "0.5", "--jobs", "1", "--out", tmp_path])  # in process: a Python start-up fewer
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["layout"]["pp"] == 2 and plan["schedule"] == "1f1b"
    doc = _run_nproc(tmp_path / "plan.json", tmp_path / "run", 4, 3)
    assert len(doc["per_rank"]) == 4
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == set(range(4))
    ops = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert any(n.startswith("offload@") for n in ops) and any(n.startswith("recv_fwd@") for n in ops), sorted(ops)[:40]
    assert len(doc["losses"]) == 3 and all(math.isfinite(x) for x in doc["losses"])
    last = [r["last_loss"] for r in doc["per_rank"]]
    assert max(last) - min(last) < 1e-9, last  # the summed loss reaches every rank
