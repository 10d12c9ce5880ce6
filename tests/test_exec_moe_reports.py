"""memo-exec's reports of MoE and multi-rank CPU runs (a review of memo-exec on CPU MoE plans):

- a pipeline stage's MoE all-to-alls carry the model layer (not the chunk's own index), so they pair
  with the simulator's ops, whose names carry a micro-batch tag (``...@m1``);
- the ep_comm stream rows and the per-rank table leave out the all-to-alls the simulator does not
  price (the counts' and the router weights'), and show them apart;
- a multi-rank run's --json holds the slowest rank's machine-speed probe (what validate's speed guard
  reads) and whether the ranks oversubscribed the cores; a hand-edited plan is compared with its
  re-simulation, said in one line;
- `memo-exec run ... | head -1` leaves a complete output folder;
- the per-rank table has pp (and ep) columns; validation.md carries the oversubscription and a MoE
  all-to-all that could not be compared (no pipeline offload note: the executor offloads the simulator's
  units); validate --ep without --dp
  names the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from memo_exec import validate as V  # noqa: E402
from memo_exec.compare import alltoall_rows, alltoall_times, resimulate, stream_stats  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.plan.schema import read_plan  # noqa: E402
from memo_sim.profile.loader import load_profile  # noqa: E402
from memo_sim.timeline import Timeline, TimelineEvent  # noqa: E402
from tests.dist_harness import spawn  # noqa: E402
from tests.exec_helpers import time_limit  # noqa: E402
from tests.test_exec_moe import MOE, plan_for  # noqa: E402  (4 layers, the first dense, 4 experts, top 2)

REPO = Path(__file__).resolve().parents[1]
PP_EP = dict(lay=dict(pp=2, dp=2, ep=2, vpp=2), pol="store_all", batch=2, schedule="interleaved_1f1b", micro=1)


# ------------------------------------------------------------------------------- 1. pipeline x EP layers
def rank_moe_spans(rank: int, world: int, case: dict) -> list:
    """One step of ``case`` on this rank: its ``moe`` compute spans and ``ep_comm`` spans."""
    import torch

    from memo_exec.device import DeviceSpec
    from memo_exec.distributed.context import build_context
    from memo_exec.distributed.runner import DistExecutor
    from memo_exec.runner import RunOptions

    plan = plan_for(case["lay"], case["pol"], case["batch"], case["schedule"], case["micro"])
    ctx = build_context(plan.layout, torch.device("cpu"))
    ex = DistExecutor(plan, RunOptions(device="cpu", dtype="fp32", steps=1), ctx, DeviceSpec("cpu"))
    ex.allocate()
    rec = ex.step(0, optimizer=False)
    ex.close()
    return [e for e in rec.events if e.stream == "ep_comm" or e.op == "moe"]


def test_pipeline_stage_alltoalls_carry_the_model_layer_and_pair_with_the_simulator():
    """pp 2 x dp 2 x ep 2, interleaved (one layer a chunk): every chunk's layer is the chunk's layer 0, which the
    dispatcher's spans once carried (``moe L2`` beside ``moe_dispatch_alltoall_ep L0``); they now carry the model
    layer, and rank 0's per-layer rows have the simulator's count on both sides."""
    with time_limit(60):
        events = spawn(rank_moe_spans, 4, PP_EP, timeout=50)
    from memo_sim.layout.rank_order import stage_of_rank

    holds = {0: {2}, 1: {1, 3}}  # pp rank -> its MoE layers (chunks c * pp + s; layer 0 is dense)
    for rank, ev in enumerate(events):
        moe = {e.layer for e in ev if e.op == "moe"}
        a2a = {e.layer for e in ev if e.stream == "ep_comm"}
        stage = stage_of_rank(Layout(**PP_EP["lay"]), rank)  # ranks 0, 1 stage 0 (stages outermost)
        assert moe == holds[stage] and a2a == moe, (rank, sorted(moe), sorted(a2a))
    plan = plan_for(PP_EP["lay"], PP_EP["pol"], PP_EP["batch"], PP_EP["schedule"], PP_EP["micro"])
    sim, note = resimulate(plan, plan.model.layers)
    assert sim is not None, note
    rows = {r["layer"]: r for r in alltoall_rows([Timeline(events=events[0])], sim.timeline.of_device(0))}
    # 2 micro-batches x (dispatch + combine) x (forward + backward)
    assert rows[2]["measured_count"] == rows[2]["predicted_count"] == 8, rows
    assert rows[2]["predicted_s"] > 0 and rows[2]["ratio"] is not None
    # the dense layer 0 runs no all-to-all, in the executor and in the simulator, which priced it as a MoE layer
    # until 2026-12-06 (its row then showed 8 predicted, 0 measured; `memo_sim.model.layer_kinds`)
    assert set(rows) == {2}, rows


def test_simulated_alltoalls_tagged_by_micro_batch_are_counted():
    """The simulator names a pipeline's ops per micro-batch (``moe_dispatch_alltoall_ep@m1``); validate's predicted
    all-to-all time per layer of a pp 2 x ep 2 plan is there (it read — on every row)."""
    ev = [TimelineEvent("moe_dispatch_alltoall_ep@m0", 2, "fwd", "ep_comm", 0, 0.0, 0.1),
          TimelineEvent("moe_combine_alltoall_ep@m1", 2, "bwd", "ep_comm", 0, 0.2, 0.4)]
    assert alltoall_times(Timeline(events=ev)) == {2: (pytest.approx(0.3), 2)}
    sim = V.predict(MOE, 64, V.get_policy("store_all"), load_profile("h100-sxm5-80gb"), Layout(pp=2, dp=2, ep=2),
                    micro_batches=2)
    q = V.predicted_quantities(sim)
    assert q["alltoall_layer_s"] is not None and q["alltoall_layer_s"] > 0


# ------------------------------------------------------------------------------- 3. unpriced ep_comm spans
def test_ep_comm_rows_leave_out_the_collectives_the_simulator_does_not_price():
    from memo_exec.compare import UNPRICED_EP_OPS, unpriced_ep_seconds

    ev = [TimelineEvent("moe", 1, "fwd", "compute", 0, 0.0, 1.0),
          TimelineEvent(UNPRICED_EP_OPS[0], 1, "fwd", "ep_comm", 0, 0.05, 0.15),
          TimelineEvent("moe_dispatch_alltoall_ep", 1, "fwd", "ep_comm", 0, 0.2, 0.5),
          TimelineEvent(UNPRICED_EP_OPS[1], 1, "fwd", "ep_comm", 0, 0.5, 0.55),
          TimelineEvent("moe_combine_alltoall_ep", 1, "fwd", "ep_comm", 0, 0.6, 0.7)]
    tl = Timeline(events=ev)
    st = stream_stats(tl, ("ep_comm",))
    assert st["ep_comm"]["busy_s"] == pytest.approx(0.4)  # the priced all-to-alls, as the per-layer rows
    assert alltoall_times(tl) == {1: (pytest.approx(0.4), 2)}
    assert unpriced_ep_seconds(tl) == pytest.approx(0.15)
    assert st["compute"]["busy_s"] == pytest.approx(0.45)  # every blocking collective is waiting, not compute
    from memo_exec.report import ep_unpriced_note, per_rank_markdown, rank_rows

    assert "0.150 ms" not in ep_unpriced_note(0.15) and "150.000 ms" in ep_unpriced_note(0.15)
    payload = {"rank": 0, "coords": {"dp": 0, "pp": 0, "cp": 0, "ulysses": 0, "tp": 0, "ep": 0},
               "steady": {"iteration_s": 1.0}, "local_tokens": 64, "events": [], "losses": [1.0],
               "summaries": [{"step": 0, "stream_busy_s": {"ep_comm": 0.55}}], "ep_unpriced_s": 0.15}
    (row,) = rank_rows([payload], 1.0)
    assert row["busy_s"]["ep_comm"] == pytest.approx(0.4) and row["ep_unpriced_s"] == pytest.approx(0.15)
    assert "ep unpriced s" in per_rank_markdown([row], 1.0, "memory")


# ------------------------------------------------------------------------------- 7. pp / ep columns
def test_per_rank_table_names_the_pipeline_and_expert_coordinates():
    from memo_exec.report import per_rank_markdown

    rows = [{"rank": r, "dp": r // 2, "pp": r % 2, "cp": 0, "ulysses": 0, "tp": 0, "ep": r // 2, "local_tokens": 64,
             "iteration_s": 1.0, "iteration_rel_error": 0.0, "layer_forward_s": 0.1, "layer_backward_s": 0.2,
             "busy_s": {"compute": 0.5}, "peak_memory_bytes": None, "ring_stall_s": None, "last_loss": 1.0}
            for r in range(4)]
    text = per_rank_markdown(rows, 1.0, "memory")
    head = next(ln for ln in text.splitlines() if ln.startswith("| rank"))
    assert head.startswith("| rank | dp | pp | cp | uly | tp | ep | tokens |"), head
    assert "| 1 | 0 | 1 | 0 | 0 | 0 | 0 | 64 |" in text and "| 2 | 1 | 0 | 0 | 0 | 0 | 1 | 64 |" in text
    widths = {ln.count("|") for ln in text.splitlines() if ln.startswith("|")}
    assert len(widths) == 1, widths  # header, rule and rows of one width


# ------------------------------------------------------------------------------- 2. oversubscription
def test_oversubscription_counts_the_ranks_threads_and_the_other_processes():
    from memo_exec.distributed.launch import oversubscription, slowest_probe

    busy = lambda other: [{"wall_s": 10.0, "busy_core_s": 20.0 + 10 * other, "own_core_s": 10.0},  # noqa: E731
                          {"wall_s": 10.0, "busy_core_s": 20.0, "own_core_s": 10.0}]
    assert oversubscription(2, 1, busy(0.3), cores=2)["line"] is None
    over = oversubscription(2, 1, busy(0.8), cores=2)
    assert over["oversubscribed"] and over["other_cores"] == pytest.approx(0.8)
    assert "2 ranks x 1 torch thread + 0.80 cores" in over["line"] and "\n" not in over["line"]
    assert oversubscription(4, 1, busy(0.0), cores=2)["oversubscribed"]  # more ranks than cores
    assert oversubscription(2, 1, [None, None], cores=2, load=0.9)["other_cores_from"].startswith("the 1-minute")
    probe = slowest_probe([{"median_gflops": 80.0}, None, {"median_gflops": 60.0}])
    assert probe["rank"] == 2 and probe["median_gflops"] == 60.0 and probe["ranks_median_gflops"] == {"0": 80.0,
                                                                                                      "2": 60.0}


# ------------------------------------------------------------------------------- 2, 4, 5: one multi-rank run
def _stored_plan(tmp_path: Path, pol: str) -> Path:
    """An ep 2 x dp 2 plan of the tiny MoE model with the simulator's stored prediction."""
    from memo_sim.plan.schema import write_plan

    prof, lay = load_profile("h100-sxm5-80gb"), Layout(dp=2, ep=2)
    policy = V.get_policy(pol, 0.5) if pol == "memo" else V.get_policy(pol)
    sim = V.predict(MOE, 64, policy, prof, lay)
    return write_plan(V.plan_for(MOE, 64, policy, prof, sim, lay), tmp_path / "plan.json")


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "memo_exec", "run", *argv], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO, **kw)


def test_multi_rank_json_has_the_speed_probe_and_an_edited_plan_is_compared_with_its_resimulation(tmp_path):
    from memo_exec.compare import stale_prediction

    plan_file = _stored_plan(tmp_path, "memo")
    doc = json.loads(plan_file.read_text())
    doc["model"]["hidden"] = 128  # edited by hand: the stored prediction is the 64-wide model's
    # a CPU calibration's profile: the runs' speed samples are compared with its own (`probe_for_profile`)
    from tests.calibration_fixtures import COMMITTED_CPU_PROFILE

    doc["profile"] = str(COMMITTED_CPU_PROFILE)
    plan_file.write_text(json.dumps(doc))
    # its memory plan is the 64-wide model's too: run without it
    r = _run([str(plan_file), "--nproc", "2", "--device", "cpu", "--steps", "2", "--json", "--no-progress",
              "--no-memory-plan", "--out", str(tmp_path / "run")])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    probe = out["speed_probe"]  # what validate's speed guard compares with the calibration's
    assert probe["median_gflops"] > 0 and probe["rank"] in (0, 1) and len(probe["ranks_median_gflops"]) == 2
    assert set(out["cores"]) >= {"ranks", "threads", "cores", "oversubscribed"} and out["cores"]["ranks"] == 2
    assert (out["oversubscribed"] is not None) == out["cores"]["oversubscribed"]
    assert out["stale_prediction"] and "re-simulated now" in out["stale_prediction"]
    it = next(t for t in out["totals"] if t["quantity"] == "iteration time")
    sim, _ = resimulate(read_plan(plan_file), 4)
    assert it["predicted"] == pytest.approx(sim.iteration_s) and "stale" in it["predicted_from"]
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:") and "stored prediction" in ln]
    assert len(warnings) == 1, r.stderr[-2000:]
    assert {"ep", "pp"} <= set(out["per_rank"][0])
    report = (tmp_path / "run" / "report.md").read_text()
    assert "stored prediction" in report and "MoE block under memo: memo-exec" in report
    # the estimate row reads — on a multi-rank run, and the note says so (it said the row was the static sum)
    est = next(ln for ln in report.splitlines() if ln.startswith("| executor's memory estimate |"))
    assert est.split("|")[3].strip() == "—" and "the row `executor's memory estimate` above read —" in report
    assert "re-simulated now" in stale_prediction(read_plan(plan_file), sim)


# ------------------------------------------------------------------------------- 6. | head -1
def test_a_reader_that_leaves_early_gets_a_complete_output_folder(tmp_path):
    """``memo-exec run ... | head -1``: the ranks' summary is printed once the folder is in place, and the closed
    pipe ends the run quietly (it once left the outputs in a hidden ``.run.XXXX.partial``)."""
    plan_file = _stored_plan(tmp_path, "store_all")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "memo_exec", "run", str(plan_file), "--nproc", "2", "--device",
                          "cpu", "--steps", "1", "--no-progress", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    first = p.stdout.readline()
    p.stdout.close()  # as head -1 does
    err = p.stderr.read()
    rc = p.wait(timeout=120)
    assert "s/iteration" in first, (first, err[-2000:])
    assert rc == 0 and "Traceback" not in err and "BrokenPipe" not in err, (rc, err[-2000:])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest.get("complete", True) and (out / "report.md").exists() and (out / "measured.json").exists()
    assert not [d for d in os.listdir(tmp_path) if d.endswith(".partial")]


# ------------------------------------------------------------------------------- validation.md
def test_validation_report_carries_the_oversubscription_and_uncompared_alltoall(tmp_path):
    """A pp 2 x ep 2 MEMO validation (runs faked): validation.md names the oversubscribed runs and says in one line
    why the MoE all-to-all was not compared (and no pipeline offload note: the executor offloads the simulator's
    units since 2026-11-29)."""
    def fake_runner(plan_file, run_dir, device, steps, timeout, threads=None):
        return "ran", {"totals": [{"quantity": "iteration time", "measured": 1.0, "predicted": 1.0}],
                       "moe_alltoall": [], "speed_probe": None,
                       "oversubscribed": "cores oversubscribed: 4 ranks x 1 torch thread = 4.0 on 2 cores"}

    lay = Layout(pp=2, dp=2, ep=2)
    with time_limit(60):
        path, summary = V.validate(MOE, load_profile("h100-sxm5-80gb"), V.plan_set([64], ["memo"], [0.5]),
                                   device="cpu", steps=2, out_dir=tmp_path / "val", report_path=None, command="test",
                                   record=False, speed_retries=0, layout=lay, micro_batches=2, runner=fake_runner)
    text = path.read_text()
    assert "pipeline_offload_notes" not in summary and "- pipeline under memo" not in text  # the two agree now
    assert "cores oversubscribed** in the runs of 64 memo(a=0.500)" in text
    assert "| MoE all-to-all per layer | 0 | not compared: no run reported an all-to-all" in text
    assert "MoE all-to-all per layer not compared" in V.summary_line(summary)


def test_validate_ep_without_dp_names_the_fix():
    from click.testing import CliRunner

    from memo_exec.cli import cli

    r = CliRunner().invoke(cli, ["validate", "--profile", "h100-sxm5-80gb", "--model", "mixtral-8x7b", "--layers",
                                 "1", "--ep", "2", "--device", "cpu", "--out", "/nonexistent/never-written"])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "give --dp 2" in line and "Traceback" not in line, line


# ------------------------------------------------------------------------------- 5, 8: what the others say
def test_memo_exec_and_check_plan_say_a_stale_prediction_alike():
    """One rule (`memo_sim.plan.stale`), so memo-exec's warning and check-plan's line read the same comparison."""
    from types import SimpleNamespace

    from memo_exec.compare import stale_prediction
    from memo_sim.plan.stale import stale_prediction as rule

    pred = SimpleNamespace(status="OK", iteration_s=0.2121, source="simulated")
    plan, sim = SimpleNamespace(predicted=pred), SimpleNamespace(status="OK", iteration_s=0.30495)
    words = rule(pred, "OK", 0.30495)
    assert words == "stored prediction 212.10 ms/iter, re-simulated now 304.95 ms/iter"
    assert stale_prediction(plan, sim).startswith(f"the plan's {words} (")
    assert stale_prediction(plan, SimpleNamespace(status="OK", iteration_s=0.2122)) is None


def test_the_readme_says_the_whatif_writes_pipeline_plans(tmp_path):
    """README's pipeline paragraph once said the simulator wrote no 1F1B plans; `memo-sim whatif --pp 2` does."""
    from click.testing import CliRunner

    from memo_sim.cli import cli as sim_cli

    r = CliRunner().invoke(sim_cli, ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                     "--dtype", "fp32", "--seq", "512", "--gpus", "2", "--pp", "2", "--policy",
                                     "memo", "--jobs", "1", "--out", str(tmp_path / "pp2")])
    assert r.exit_code == 0, r.output[-2000:]
    plan = read_plan(tmp_path / "pp2" / "plan.json")
    assert plan.schedule in ("1f1b", "interleaved_1f1b") and plan.layout.pp == 2
    readme = (REPO / "README.md").read_text()
    assert "does not write these plans yet" not in readme and "`memo-sim whatif --pp N` writes these plans" in readme


def test_printing_stops_quietly_once_the_reader_is_gone(monkeypatch):
    """The `| head -1` test's summary fits the pipe before its reader closes, so it never reaches the broken pipe (a
    review): here stdout's writes raise BrokenPipeError, and the run's printers stop writing there, quietly, once,
    while stderr's errors still raise."""
    import io

    import pytest

    from memo_exec import cli as exec_cli
    from memo_exec.distributed import launch

    gone = []
    monkeypatch.setattr(launch, "stdout_gone", lambda: gone.append(1))
    written = []

    def echo(message=None, err=False, **kw):
        written.append((message, err))
        raise BrokenPipeError

    out = launch.quiet_echo(echo)
    out("first")
    out("second")  # after the reader left: not written at all
    assert written == [("first", False)] and gone == [1]
    with pytest.raises(BrokenPipeError):
        out("an error", err=True)

    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    monkeypatch.setattr(exec_cli.sys, "stdout", Closed())
    exec_cli._say("summary\n")  # no exception: the folder is complete by then
    assert gone == [1, 1]
