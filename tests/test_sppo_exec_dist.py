"""SPPO through the distributed executor (`memo_exec.sppo.plugin`: the ``sppo`` step schedule, run
for plans whose ``schedule`` is sppo): loss, every gradient and a short training curve against the single-process
executor on the same seed, and `memo-exec run --nproc` of a planned SPPO plan with its pipeline
Gantt charts (`memo_exec.sppo.report`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memo_exec.device import DeviceSpec
from memo_exec.distributed.context import build_context
from memo_exec.distributed.runner import DistExecutor
from memo_exec.runner import Executor, RunOptions
from memo_sim.cost.sppo import partition_bounds
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig
from memo_sim.policy.sppo import Sppo
from tests.dist_harness import spawn
from tests.exec_helpers import make_plan, one_process_run, policy

MODEL = ModelConfig("sppo-dist", 4, 64, 4, 128, vocab=128, dtype="fp32")
SEQ = 96
STEPS = 3


def sppo_plan(pp: int, n: int, mux: bool, partition: str = "flops", alphas=None):
    pol = Sppo(None, subseqs=n, bounds=partition_bounds(MODEL, 1, SEQ, n, partition),
               alphas=tuple(alphas or [0.5 / (1 + i) for i in range(n)]), partition=partition, multiplex=mux)
    plan = make_plan(MODEL, SEQ, pol, chunk=40)
    plan.layout = Layout(pp=pp)
    plan.gpus = pp
    return plan


def rank_fn(rank: int, world: int, cases: list) -> list:
    out = []
    for n, mux, partition in cases:
        plan = sppo_plan(world, n, mux, partition)
        lay = plan.layout
        ctx = build_context(lay, torch.device("cpu"))
        ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp64", steps=STEPS), ctx, DeviceSpec("cpu"))
        ex.allocate()
        rec = ex.step(0, optimizer=False)
        grads = {k: v.numpy() for k, v in ex.full_gradients().items()}
        ex.sync.zero_grads()
        losses = [ex.step(k).loss for k in range(STEPS)]
        offloaded = ex.schedule.last.units
        ex.close()
        out.append({"loss": rec.loss, "grads": grads, "losses": losses, "stage": ctx.coord("pp"),
                    "offload_bytes": sum(u.offload_bytes for u in offloaded),
                    "ops": sorted({e.op for e in rec.events})})
    return out


def _reference():
    return one_process_run(make_plan(MODEL, SEQ, policy("store_all"), chunk=40), STEPS)


@pytest.mark.parametrize("cases", [pytest.param([(4, True, "flops")], id="N4-mux"),
                                   pytest.param([(8, False, "length"), (2, True, "length")], id="N8-N2",
                                                marks=pytest.mark.slow)])
def test_distributed_executor_runs_sppo_plans(cases):
    """PP = 2, N = 4 multiplexed (FLOPs-balanced), N = 8 and N = 2 (length-balanced): the executor's
    own schedule plug-in gives the single-process executor's loss, gradients and 3-step loss curve."""
    results = spawn(rank_fn, 2, cases, timeout=240)
    loss, want, losses = _reference()
    for c, case in enumerate(cases):
        per_rank = [results[r][c] for r in range(2)]
        last = max(per_rank, key=lambda r: r["stage"])
        assert abs(last["loss"] - loss) <= 1e-10 * abs(loss), (case, last["loss"], loss)
        got = {}
        for r in sorted(per_rank, key=lambda r: r["stage"]):  # the last stage's embedding/final norm win
            for k, g in r["grads"].items():
                if k.startswith("layers.") or r is last:
                    got[k] = torch.from_numpy(g)
        assert set(got) == set(want)
        for k in want:
            err = float((got[k] - want[k]).norm() / want[k].norm())
            assert err < 1e-10, (case, k, err)
        for a, b in zip(last["losses"], losses):
            assert abs(a - b) <= 1e-9 * abs(b), (case, last["losses"], losses)
        first = min(per_rank, key=lambda r: r["stage"])
        assert first["offload_bytes"] > 0
        assert any(op.startswith("stage_fwd@s") for op in first["ops"])
        assert any(op.startswith("offload@s") for op in first["ops"])


def test_report_refuses_a_plan_without_a_pipeline(tmp_path):
    plan = make_plan(MODEL, SEQ, policy("store_all"))
    from memo_sim.plan.schema import write_plan

    write_plan(plan, tmp_path / "plan.json")
    r = subprocess.run([sys.executable, "-m", "memo_exec.sppo.report", str(tmp_path), str(tmp_path / "plan.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not an SPPO pipeline plan" in r.stderr


def test_memo_exec_run_nproc2_reports_the_pipeline(tmp_path):
    """`memo-exec run --nproc 2` of an SPPO plan (PP = 2, N = 4 multiplexed, alpha_i > 0) writes,
    from the run itself (the schedule's write_outputs hook), both Gantt charts and the per-stage and
    per-subsequence comparison in its report; the multiplexed pieces run on both stages. (A what-if's
    SPPO plan through the same command: README's tour, tests/test_readme_tour.py.)"""
    from memo_sim.plan.schema import write_plan

    plan = sppo_plan(2, 4, True)
    plan.profile = "a100-sxm4-80gb"
    write_plan(plan, tmp_path / "plan.json")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "memo_exec.cli", "run", str(tmp_path / "plan.json"), "--nproc", "2",
                        "--device", "cpu", "--steps", "2", "--out", str(out)], capture_output=True, text=True,
                       timeout=300)
    log = (out / "launcher.log").read_text()[-3000:] if (out / "launcher.log").exists() else ""
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:], log)
    for f in ("measured_pipeline/pipeline_gantt.png", "simulated_pipeline/pipeline_gantt.png", "sppo_pipeline.md"):
        assert (out / f).stat().st_size > 0
    assert "sppo schedule" in r.stdout
    # the printed paths are where the files are (a review: both charts printed as out/pipeline_gantt.png)
    printed = [p.strip(" ,") for p in r.stdout.split("wrote ")[-1].split(" (sppo schedule)")[0].split(", ")]
    assert str(out / "measured_pipeline" / "pipeline_gantt.png") in printed, r.stdout
    assert all(Path(p).exists() for p in printed), (printed, r.stdout)
    report = (out / "report.md").read_text()
    assert "## Offload per subsequence" in report and "## Per rank" in report
    assert "SPPO pipeline: measured against simulated" in report and "| stage |" in report
    # the stage keeps its activations through autograd: its estimate does not size them (they read -100% as 0 B)
    for term in ("skeletal_resident", "lse"):
        row = next(ln for ln in report.splitlines() if ln.startswith(f"| {term} |"))
        assert row.split("|")[3].strip() == "—" and row.split("|")[4].strip() == "—", row
    assert "Under this plan's policy (sppo) the activations (skeletal_resident, lse, norm_stats)" in report
    cmp = json.loads((out / "sppo_pipeline.json").read_text())
    assert [st["stage"] for st in cmp["stages"]] == [0, 1]
    for st in cmp["stages"]:
        assert 0 < st["bubble_fraction"] < 1 and 0 <= st["simulated"]["bubble_fraction"] < 1
    measured = json.loads((out / "measured.json").read_text())
    tags = {(e["device"], e["op"]) for e in measured["events"] if e["op"].startswith("stage_")}
    assert (0, "stage_fwd@s0.0") in tags and (1, "stage_bwd@s3.1") in tags  # multiplexed pieces on both stages
    subs = {(r["stage"], r["subsequence"]): r for r in cmp["subsequences"]}
    assert set(subs) == {(s, k) for s in (0, 1) for k in range(4)}
    for s in (0, 1):  # alpha_i decreasing: subsequence 0 offloads the most, measured and simulated
        assert subs[(s, 0)]["offload_bytes"] > subs[(s, 3)]["offload_bytes"] >= 0
        assert subs[(s, 0)]["simulated"]["offload_bytes"] > 0
        for k in range(4):
            r = subs[(s, k)]
            assert 0 <= r["copy_exposed_s"] <= r["copy_busy_s"] and r["prefetch_stall_s"] is not None
            # the executor offloads what the simulator's policy offloads (the GEMM inputs F.linear
            # saves flattened included): the same bytes per subsequence
            assert r["offload_bytes"] == r["simulated"]["offload_bytes"]
        assert cmp["stages"][s]["simulated"]["peak_gpu_bytes"] > 0
    assert cmp["measured_peak"] == "process RSS" and "different quantities" in (out / "sppo_pipeline.md").read_text()


def test_a_one_stage_sppo_plan_goes_to_the_sppo_schedule():
    """pp = 1 with policy sppo: the sppo schedule claims it; the single-device loop refuses it
    before allocation with the command that runs it."""
    from memo_exec.distributed.schedule import schedule_for
    from memo_exec.sppo.plugin import SppoSchedule

    plan = sppo_plan(1, 4, False)
    assert plan.schedule == "sppo" and schedule_for(plan) is SppoSchedule
    assert schedule_for(make_plan(MODEL, SEQ, policy("store_all"))).name == "single_stage"
    with pytest.raises(Exception, match="--nproc 1"):
        Executor(plan, RunOptions(device="cpu"))


@pytest.mark.slow
def test_memo_exec_run_of_a_one_stage_sppo_plan(tmp_path):
    """`memo-sim whatif --policy sppo --pp 1` writes a one-stage SPPO plan; `memo-exec run` runs it
    through the sppo schedule (in its own process, a group of one), not the single-stage loop that cannot."""
    plan_dir, out = tmp_path / "plan", tmp_path / "run"
    subprocess.run([sys.executable, "-m", "memo_sim.cli", "whatif", "--model", "gpt-7b", "--layers", "2", "--hidden",
                    "64", "--heads", "4", "--ffn", "256", "--vocab", "256", "--seq", "256", "--gpus", "1", "--policy",
                    "sppo", "--pp", "1", "--tp", "1", "--subseqs", "4", "--profile", "a100-sxm4-80gb",
                    "--out", str(plan_dir)], check=True, capture_output=True, timeout=300)
    from memo_sim.plan.schema import read_plan

    plan = read_plan(plan_dir / "plan.json")
    assert plan.layout.pp == 1 and plan.policy.name == "sppo"
    with pytest.raises(Exception, match="--nproc 1"):  # the single-device loop refuses before allocation
        Executor(plan, RunOptions(device="cpu"))
    r = subprocess.run([sys.executable, "-m", "memo_exec.cli", "run", str(plan_dir / "plan.json"), "--device", "cpu",
                        "--steps", "2", "--out", str(out), "--json"], capture_output=True, text=True, timeout=300)
    log = (out / "launcher.log").read_text()[-3000:] if (out / "launcher.log").exists() else ""
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:], log)
    doc = json.loads(r.stdout)
    assert len(doc["losses"]) == 2 and all(x == x and x > 0 for x in doc["losses"])
    measured = json.loads((out / "measured.json").read_text())
    assert any(e["op"].startswith("stage_fwd@s3") for e in measured["events"])  # the 4 subsequences ran
