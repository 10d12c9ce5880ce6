"""Review of the exports against the frameworks' own parsers (2026-12-02): what a script writes is the run memo
prices. Each test fails on the code before it: an fp8-rowwise plan exported to Megatron-LM as fp8-tensorwise (its
nearest) was written with no --fp8-* option (bf16); an export whose gap has no nearest settings refused where the
help promises the framework's best plan; an SPPO plan written for torchtitan as 1F1B kept one micro-batch over four
stages (PyTorch's Schedule1F1B raises); a changed batch compared per iteration read +693.8%."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.export import export_plan
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan, read_plan
from memo_sim.policy import get_policy
from tests.cli_run import one_error_line, run_sim


def _fp8_rowwise_plan() -> Plan:
    return Plan(model=replace(get_model("llama-3.1-8b"), gemm_format="fp8-rowwise"), batch=2, seq_tokens=8192, gpus=8,
                layout=Layout(tp=2, sp=True, dp=4, zero=1), policy=get_policy("store_all"), profile="h100-sxm5-80gb",
                predicted={"status": "OK", "iteration_s": 1.5, "mfu": 0.4},
                layer_timings_s={"forward": 0.01, "backward": 0.02}, micro_batch=1, schedule="single_stage")


def test_megatron_writes_the_fp8_format_its_nearest_plan_is_priced_in():
    ex = export_plan(_fp8_rowwise_plan(), "megatron", price=False, nearest=True)
    script = ex.files["megatron.sh"]
    assert "--fp8-format hybrid" in script and "--fp8-recipe tensorwise" in script
    assert "fp8-tensorwise GEMMs" in script.split("# written (the nearest Megatron-LM runs, gaps above):")[1]
    assert any("fp8-rowwise GEMMs" in g.what for g in ex.gaps)


@pytest.fixture(scope="module")
def ring_cp_export(tmp_path_factory):
    """(folder, the export's run) of GPT-OSS-20B (a 128-token sliding window) with ring CP 8 on 16 H100s, its plan in
    ``P`` and its Megatron-LM export in ``X``: one what-if and one export for the two tests that read them (each ran
    its own, 16-17 s a test inside CI's default selection, 2026-12-05)."""
    tmp = tmp_path_factory.mktemp("ring-cp-export")
    run_sim(["whatif", "--model", "gpt-oss-20b", "--gpus", "16", "--seq", "128K", "--profile", "h100-sxm5-80gb",
             "--tp", "2", "--cp", "8", "--ep", "8", "--batch", "1", "--out", tmp / "P"])
    return tmp, run_sim(["export", tmp / "P" / "plan.json", "--to", "megatron", "--out", tmp / "X"])


def test_a_gap_without_nearest_settings_exports_the_frameworks_best_plan(ring_cp_export, tmp_path):
    """GPT-OSS-20B (a 128-token sliding window) with ring CP 8: no Megatron-LM setting runs the ring, and TP 2 x CP 8
    does not split the heads for an all-to-all CP; Megatron's best plan is written (the constrained what-if finds
    one), and --nearest, which writes memo's plan's nearest settings, refuses in one line."""
    folder, r = ring_cp_export
    assert "is not expressible in Megatron-LM (ring context parallelism over 8 GPUs" in r.output
    assert "written instead: the best plan memo predicts Megatron-LM (megatron) runs" in r.output
    assert "; export a plan" not in r.output.split("written instead")[0]
    assert (folder / "X" / "megatron.sh").exists()
    one_error_line(run_sim(["export", folder / "P" / "plan.json", "--to", "megatron", "--nearest", "--out",
                            tmp_path / "Y"], code=2))
    assert not (tmp_path / "Y" / "megatron.sh").exists()


def test_an_sppo_plan_written_as_torchtitan_1f1b_runs_a_micro_batch_per_stage(tmp_path):
    run_sim(["whatif", "--model", "llama-3.1-8b", "--gpus", "16", "--seq", "256K", "--profile", "h100-sxm5-80gb",
             "--policy", "sppo", "--pp", "4", "--tp", "4", "--out", tmp_path / "P"])
    plan = read_plan(tmp_path / "P" / "plan.json")
    assert plan.schedule == "sppo" and plan.layout.pp == 4 and plan.batch == 1
    ex = export_plan(plan, "torchtitan", nearest=True)
    src = next(v for k, v in ex.files.items() if k.endswith(".py"))
    assert "pipeline_parallel_schedule = '1F1B'" in src and "num_pp_microbatches = 4" in src
    assert any("1F1B with 1 micro-batch over 4 pipeline stages" in g.what for g in ex.gaps)
    # the nearest runs 4 sequences a step where the plan runs 1: compared per sequence
    line = [ln for ln in run_sim(["export", tmp_path / "P" / "plan.json", "--to", "torchtitan", "--nearest",
                                  "--out", tmp_path / "X"]).output.splitlines() if "memo predicts" in ln][0]
    assert "for 4 sequences a step against" in line and "for the plan's 1 (" in line and " a sequence against " in line


def test_a_plan_without_nearest_settings_says_nearest_refuses_and_other_errors_pass_through(ring_cp_export):
    """The export written in its place does not advise --nearest (which refuses it); an error that is not the
    exporter's 'no nearest settings' (an unknown profile, through the API) is raised as it is, not blamed on the
    framework's search."""
    from memo_sim.errors import MemoError

    folder, r = ring_cp_export
    assert "`--nearest` writes" not in r.output and "has no nearest settings there (`--nearest` refuses it)" in r.output
    bad = replace(read_plan(folder / "P" / "plan.json"), profile="no-such-gpu")
    with pytest.raises(MemoError) as e:
        export_plan(bad, "megatron")
    assert "no-such-gpu" in str(e.value) and "constrained" not in str(e.value)
