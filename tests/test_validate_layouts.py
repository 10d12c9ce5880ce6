"""[exec-complete] item 4: `memo-exec validate` predicts and runs 2-rank tensor- and context-parallel
plans and a pipelined plan (2 stages, 4 micro-batches of one sequence, 1F1B) beside the
single-process ones, so the CPU loop (`benchmarks/cpu_loop.py --layouts`) covers them; a
layout the model or the batch split cannot take is one line before anything runs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

import memo_exec.validate as V  # noqa: E402
from memo_exec.cli import cli  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.profile.loader import load_profile  # noqa: E402
from tests.exec_helpers import time_limit  # noqa: E402

TOY = ModelConfig("toy", 4, 64, 4, 256, vocab=128, dtype="fp32")


# the pipeline case in the slow selection (19 s in CI, 2026-11-30), to balance CI's two processes
@pytest.mark.parametrize("layout, micro", [(Layout(tp=2, sp=True), 1), (Layout(cp=2), 1),
                                          pytest.param(Layout(pp=2), 4, marks=pytest.mark.slow)],
                         ids=["tp2", "cp2", "pp2x4"])
def test_validate_runs_a_distributed_plan_and_compares_it(tmp_path, layout, micro):
    with time_limit(240):
        path, summary = V.validate(TOY, load_profile("h100-sxm5-80gb"), V.plan_set([128], ["store_all"], [0.5]),
                                   device="cpu", steps=2, out_dir=tmp_path / "val", report_path=None,
                                   command="test", record=False, speed_retries=0, budget_s=200, layout=layout,
                                   micro_batches=micro)
    doc = json.loads((tmp_path / "val" / "validation.json").read_text())
    (row,) = doc["rows"]
    assert row["status"] == "ran", row["status"]
    step = row["quantities"]["step_s"]
    # an H100 profile's times beside a CPU run: "not comparable", as the run's report.md says (times_comparable)
    assert step["predicted"] > 0 and step["measured"] > 0 and step["error_pct"] is None and step["not_comparable"]
    plan = json.loads((tmp_path / "val" / "plans" / "plan-00.json").read_text())
    assert plan["layout"] == {**plan["layout"], **{k: v for k, v in layout.to_dict().items() if k in ("tp", "cp", "pp")}}
    if layout.pp > 1:
        assert plan["schedule"] == "1f1b" and plan["batch"] == 4 and plan["micro_batch"] == 1
    assert f"{layout.label()} on {layout.gpus} processes" in path.read_text()


@pytest.mark.parametrize("args, needle", [(["--tp", "3"], "--tp/--cp/--pp/--dp"),
                                          # the split validate cannot make, with the options it has (a review: it
                                          # suggested --decoder-first-pipeline-num-layers, which it does not have)
                                          (["--pp", "2", "--micro-batches", "1", "--layers", "1"],
                                           "give --layers a multiple of 2, or --pp 1")])
def test_bad_layouts_are_one_line(tmp_path, args, needle):
    r = CliRunner().invoke(cli, ["validate", "--profile", "h100-sxm5-80gb", "--device", "cpu", "--out",
                                 str(tmp_path), "--seqs", "128", "--policies", "store_all", *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output


def test_a_pipelines_predicted_stream_rows_are_rank_0s_stage_not_every_stages_union():
    """The predicted compute-busy row of a pp 2 plan read the whole iteration (both stages' compute spans merged,
    the bubble hidden), beside rank 0's measured busy time: it is now stage 0's, the simulator's first GPU."""
    import dataclasses

    from memo_sim.policy import get_policy

    prof = load_profile("tests/data/profiles/cpu-quick-vm.yaml")
    m = dataclasses.replace(V.TOY_MODEL, dtype="fp32")
    one = V.predict(m, 1024, get_policy("store_all"), prof, Layout(), 1)
    assert V.predicted_quantities(one)["compute_busy_s"] == pytest.approx(one.iteration_s)  # one GPU: no bubble
    sim = V.predict(m, 1024, get_policy("store_all"), prof, Layout(pp=2), 4)
    q = V.predicted_quantities(sim)
    assert q["compute_busy_s"] == pytest.approx(sim.timeline.busy_time("compute", 0))
    assert q["compute_busy_s"] < 0.9 * sim.iteration_s  # stage 0 waits in the 1F1B bubble
