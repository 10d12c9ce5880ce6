"""[modern-training] item 2: uneven pipeline stages as data (`Layout.first_stage_layers` /
``last_stage_layers``, Megatron-LM's --decoder-first/last-pipeline-num-layers), searched where the
layers do not divide into the stages, priced stage by stage in both tiers (each stage's own layers,
parameters, optimizer step and activations in flight), bounded, exported, and run by the executor
(tests/test_pipeline_exec_dist.py: gradients against one process)."""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from tests.cli_run import text_and_json
from memo_sim.cost.sppo import stage_layer_count, stage_model_state_bytes, stage_params
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout, stage_layers, stage_split_why_not, uneven_split
from memo_sim.model.config import ModelConfig
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.bound import lower_bound
from memo_sim.search.pipeline import pipeline_candidate

H100 = load_profile("h100-sxm5-80gb")
TOY = ModelConfig("toy7", 7, 1024, 8, 4096, vocab=32000)


def test_the_split_rules():
    assert [len(r) for r in stage_layers(126, 16, 7, 7)] == [7] + [8] * 14 + [7]
    assert [len(r) for r in stage_layers(11, 2, 5)] == [5, 6] and [len(r) for r in stage_layers(11, 2, 0, 4)] == [7, 4]
    assert stage_layers(12, 4) == [range(0, 3), range(3, 6), range(6, 9), range(9, 12)]  # even, as before
    assert uneven_split(126, 16) == (7, 7) and uneven_split(80, 6) == (12, 12) and uneven_split(12, 4) is None
    assert uneven_split(10, 8) is None  # eight stages cannot hold ten layers with the ends lighter
    with pytest.raises(MemoError, match="do not split evenly into 4 pipeline stages; give the first and last"):
        stage_layers(126, 4)
    with pytest.raises(MemoError, match="do not split evenly into the other 2 pipeline stages"):
        stage_layers(12, 4, 3, 4)


def test_the_layout_field():
    lay = Layout(tp=2, pp=2, dp=2, first_stage_layers=3)
    assert lay.uneven and lay.label() == "tp2+sp-pp2f3-dp2" and lay.to_dict()["first_stage_layers"] == 3
    assert "first_stage_layers" not in Layout(pp=2).to_dict()  # older plans keep their shape
    assert Layout.from_dict(lay.to_dict()) == lay
    assert check_layout(lay, TOY, 8, 8, 4096) is None
    assert "divide over the 2 model chunks" in check_layout(Layout(pp=2, vpp=2, dp=4, first_stage_layers=3), TOY, 8, 8,
                                                            4096)
    assert Layout(dp=8, first_stage_layers=3).first_stage_layers == 0  # a stage's shard (pp 1) drops them
    assert "pp >= 2" in stage_split_why_not(7, 1, 3)
    assert "do not split evenly into 2" in check_layout(Layout(pp=2, dp=4), TOY, 8, 8, 4096)


def test_each_stage_holds_and_steps_its_own_layers():
    lay = Layout(pp=2, dp=4, zero=1, first_stage_layers=3)
    assert [stage_layer_count(TOY, lay, s) for s in (0, 1)] == [3, 4]
    assert stage_params(TOY, lay, 0) == 3 * TOY.layer_params() + TOY.vocab * TOY.hidden
    assert stage_model_state_bytes(TOY, lay, 1) > stage_model_state_bytes(TOY, Layout(pp=2, dp=4, zero=1,
                                                                                        first_stage_layers=4), 1)


@pytest.mark.parametrize("policy", ["store_all", "full_recompute", "memo"])
def test_uneven_1f1b_simulated_within_its_bound_and_estimate(policy):
    """Tier 2 runs the uneven pipeline whole (no fold) and the proved bound stays below it."""
    lay = Layout(tp=2, pp=2, dp=2, zero=1, first_stage_layers=3)
    c = pipeline_candidate(TOY, lay, policy, 4, 1, 4096, H100, "1f1b", alpha=0.5 if policy == "memo" else None)
    res = simulate(TOY, lay, 4, 4096, c.policy, H100, keep_timeline=False, schedule="1f1b", micro_batch=1)
    assert res.status == "OK"
    assert lower_bound(c) <= res.iteration_s * (1 + 1e-9)
    assert c.estimate.iteration_s == pytest.approx(res.iteration_s, rel=0.25)
    # the stage with more layers holds more: its model states and the activations in flight
    rows = c.pipeline["stages"]
    assert [r["model_states_bytes"] for r in rows] == [stage_model_state_bytes(TOY, lay, s) for s in (0, 1)]
    assert rows[0]["layers_in_flight"] == 2 * 3 and rows[1]["layers_in_flight"] == 1 * 4  # 1F1B: p - s in flight


def test_uneven_pipeline_is_searched_and_fixed_by_megatrons_options(tmp_path):
    base = ["whatif", "--model", "llama-3.1-8b", "--layers", "7", "--gpus", "8", "--seq", "8K", "--profile",
            "h100-sxm5-80gb", "--pp", "2", "--policy", "full_recompute", "--json", "--jobs", "1"]
    r = CliRunner().invoke(cli, [*base, "--no-plan"])
    assert r.exit_code == 0, r.output[-2000:]
    rows = json.loads(r.stdout)["candidates"]
    # 7 layers over 2 stages: 3 + 4 and, since a review (2026-11-30), 4 + 3 too
    assert rows and {c["layout_degrees"]["first_stage_layers"] for c in rows if c["pp"] == 2} == {3, 4}
    r = CliRunner().invoke(cli, [*base, "--decoder-first-pipeline-num-layers", "4", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output[-2000:]
    from memo_sim.export import export_plan
    from memo_sim.plan import read_plan

    plan = read_plan(tmp_path / "plan.json")
    assert plan.layout.first_stage_layers == 4
    script = export_plan(plan, "megatron", price=False).files["megatron.sh"]
    assert "--decoder-first-pipeline-num-layers 4" in script
    titan = export_plan(plan, "torchtitan", price=False, nearest=True)  # torchtitan's split says 4 + 3 (its
    src = titan.files["memo_torchtitan.py"]  # stages of 4, the last one less): no gap since 2026-11-27
    assert "pipeline_parallel_layers_per_stage = 4" in src and "pipeline_parallel_first_stage_less_layers = 0" in src
    assert "pipeline_parallel_last_stage_less_layers = 1" in src
    assert not any("uneven" in g.what for g in titan.gaps)
    r = CliRunner().invoke(cli, ["check-plan", str(tmp_path / "plan.json")])
    assert r.exit_code == 0, r.output


def test_llama_405b_pp16_on_16k_gpus_in_seconds():
    """The issue's query: 126 layers over 16 stages (7, 8 x 14, 7). Issue #46's Done-when is a plan in under 30 s
    on a 2-core machine: this query in-process on the idle 2-core VM took 9.8-11.4 s of wall time (16.4-19.6 CPU s,
    this process's and its search workers'), 19.6 s beside two busy loops (2026-11-30). This test is a regression
    guard that CI's load cannot fail: inside CI's two selections side by side the query took 24.7-31.2 s of wall
    time and 31.0 CPU s (CPU time grows too where the cores are shared), so it bounds the CPU time at 60 s, about
    three times the idle figure, which an unpruned or quadratic search would pass by far."""
    c0, t0 = _cpu_seconds(), time.perf_counter()
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-405b", "--gpus", "16384", "--seq", "128K", "--tp",
                                 "8", "--cp", "16", "--pp", "16", "--profile", "h100-sxm5-80gb", "--framework",
                                 "megatron", "--no-plan", "--json"])
    cpu, wall = _cpu_seconds() - c0, time.perf_counter() - t0
    assert r.exit_code == 0, r.output[-2000:]
    best = json.loads(r.stdout)["candidates"][0]
    # uneven stages: 1F1B with 7-layer end stages, or interleaved chunks with the embedding and loss slots
    assert best["status"] == "OK" and ("pp16f7l7" in best["layout"] or "el" in best["layout"].split("-")[2])
    assert best["simulated_status"] == "OK"
    assert cpu < 60, (cpu, wall)


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have exited (the what-if's worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def test_plans_and_programs_are_held_to_the_rules(tmp_path):
    """A layout read from a plan or passed to the simulator obeys the same rules as the search's."""
    from memo_sim.engine.simulate import simulate as sim
    twelve = ModelConfig("toy12", 12, 1024, 8, 4096, vocab=32000)
    with pytest.raises(MemoError, match="model chunks of a rank"):
        sim(twelve, Layout(pp=2, vpp=2, dp=4, first_stage_layers=3), 4, 4096, get_policy("store_all", None), H100,
            schedule="interleaved_1f1b", micro_batch=1)
    with pytest.raises(MemoError, match="single-stage"):
        sim(twelve, Layout(pp=2, dp=4, zero=1, optimizer_offload=True), 4, 4096, get_policy("store_all", None), H100,
            schedule="1f1b", micro_batch=1)
    with pytest.raises(MemoError, match="ZeRO 1 or more"):
        sim(twelve, Layout(dp=8, optimizer_offload=True), 1, 4096, get_policy("store_all", None), H100)
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "7", "--gpus", "8", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--pp", "2", "--framework", "megatron@2023",
                                 "--no-plan", "--json", "--jobs", "1"])
    assert r.exit_code != 0 or all("f3" not in c["layout"] for c in json.loads(r.stdout)["candidates"])
    # the flags alone ask for the pipeline (no --pp needed)
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "7", "--gpus", "8", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--decoder-first-pipeline-num-layers", "3",
                                 "--policy", "full_recompute", "--no-plan", "--json", "--jobs", "1"])
    assert r.exit_code == 0, r.output[-2000:]
    assert any(c["pp"] > 1 and c["layout_degrees"].get("first_stage_layers") == 3
               for c in json.loads(r.stdout)["candidates"])


def test_interleaved_pipelines_split_uneven_chunks():
    """Uneven model chunks (interleaved 1F1B): the end ranks' counts divided over their chunks, or the
    embedding and the loss each taking a layer's slot (Megatron-LM's --account-for-embedding/loss-in-
    pipeline-split); the engine lays out each virtual stage's layers, the bound stays below it."""
    from memo_sim.engine.simulate import simulate as sim
    from memo_sim.layout.parallel import virtual_stage_layers
    from memo_sim.search.bound import lower_bound
    from memo_sim.search.whatif import candidates_for, simulate_candidates

    assert [len(r) for r in virtual_stage_layers(94, 8, 4, account=True)] == [2] + [3] * 30 + [2]
    assert [len(r) for r in virtual_stage_layers(14, 2, 2, first=4, last=10)] == [2, 5, 2, 5]
    fourteen = ModelConfig("toy14", 14, 1024, 8, 4096, vocab=32000)  # 16 slots: pp2 x vpp4 chunks of 2 slots
    # one slot a chunk (the Model Zoo's Qwen3-235B at PP 32 x VPP 3): the first chunk runs the embedding alone,
    # the last the loss alone; simulated, its layer timings from the first chunk with a layer, under its bound
    one = Layout(pp=4, vpp=4, dp=2, account_embedding_loss=True)
    assert check_layout(one, fourteen, 8, 8, 4096) is None
    assert [len(r) for r in one.virtual_stage_ranges(14)] == [0] + [1] * 14 + [0]
    r1 = sim(fourteen, one, 4, 4096, get_policy("full_recompute", None), H100, schedule="interleaved_1f1b",
             micro_batch=1)
    assert r1.ok and r1.layer_timings["forward"] > 0 and r1.layer_timings["backward"] > 0
    res1 = candidates_for(fourteen, 4096, 8, H100, pp=4, vpp=4, batch=4, policies=("full_recompute",))
    ones = [c for c in res1.candidates if c.layout.account_embedding_loss and c.memory.status == "OK"]
    assert ones
    simulate_candidates(ones[:2], jobs=1)
    for c in ones[:2]:
        assert 0 < lower_bound(c) <= c.simulated["iteration_s"] * (1 + 1e-9)
    lay = Layout(pp=2, vpp=4, dp=4, account_embedding_loss=True)
    assert check_layout(lay, fourteen, 8, 8, 4096) is None and lay.stage_layer_counts(14) == [7, 7]
    r = sim(fourteen, lay, 4, 4096, get_policy("store_all", None), H100, schedule="interleaved_1f1b", micro_batch=1)
    assert r.ok
    # the search finds the slot split where 14 layers do not divide into pp x vpp chunks, and prices it under its bound
    res = candidates_for(fourteen, 4096, 8, H100, pp=2, vpp=4, batch=4, policies=("store_all", "full_recompute"))
    split = [c for c in res.candidates if c.layout.account_embedding_loss and c.memory.status == "OK"]
    assert split
    simulate_candidates(split[:3], jobs=1)
    for c in split[:3]:
        assert 0 < lower_bound(c) <= c.simulated["iteration_s"] * (1 + 1e-9)


def test_one_slot_chunks_are_planned_simulated_and_run(tmp_path):
    """Chunks of one slot (2 layers + the embedding's and the loss's slots over pp 2 x vpp 2): the what-if writes
    the plan, memo-sim simulate prints the chunk without a layer (it crashed on it: a reviewer's finding,
    2026-11-27), and memo-exec runs it under --nproc 2 (every rank crashed on it before; its gradients against one
    process: tests/test_pipeline_exec_dist.py)."""
    pytest.importorskip("torch")
    from memo_exec.cli import cli as exec_cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "2", "--hidden", "64", "--heads", "4",
                                 "--ffn", "128", "--vocab", "128", "--seq", "256", "--gpus", "2", "--pp", "2", "--vpp",
                                 "2", "--dtype", "fp32", "--profile", "h100-sxm5-80gb", "--global-batch", "4",
                                 "--micro-batch", "1", "--policy", "store_all", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["layout"]["account_embedding_loss"] and (plan["layout"]["pp"], plan["layout"]["vpp"]) == (2, 2)
    sim = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sim")])
    assert sim.exit_code == 0, sim.output
    assert "layers none (the embedding or the loss alone), 1-1" in sim.output
    for cmd in (["explain", str(tmp_path / "plan.json")], ["check-plan", str(tmp_path / "plan.json")]):
        assert CliRunner().invoke(cli, cmd).exit_code == 0
    run = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--nproc", "2",
                                        "--steps", "1", "--out", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    assert (tmp_path / "run" / "report.md").exists()


def test_a_rank_without_a_layer_runs_under_nproc(tmp_path):
    """'E|t*2L' over pp 2: rank 0 runs the embedding alone, no layer and no activation policy; describing its empty
    policy set crashed every rank (a reviewer's finding, 2026-11-27)."""
    pytest.importorskip("torch")
    from memo_exec.cli import cli as exec_cli

    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "2", "--hidden", "64", "--heads", "4",
                                 "--ffn", "128", "--vocab", "128", "--seq", "256", "--gpus", "2", "--pp", "2",
                                 "--pipeline-model-parallel-layout", "E|t*2L", "--dtype", "fp32", "--profile",
                                 "h100-sxm5-80gb", "--global-batch", "2", "--micro-batch", "1", "--policy", "store_all",
                                 "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "plan.json").read_text())["layout"]["chunk_layers"] == [0, 2]
    run = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "plan.json"), "--device", "cpu", "--nproc", "2",
                                        "--steps", "1", "--out", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    assert (tmp_path / "run" / "report.md").exists()


def test_a_fixed_split_is_compared_with_the_searched_one():
    """A user's fixed split (DeepSeek-V3 at PP 8 as 4 and 3 layers at the ends) ranked 27.94 s without saying the
    what-if's own 6 and 7 runs 9% faster (a review): the answer compares the fixed split's best with the same
    search's best where the split is searched."""
    args = ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "32K", "--pp", "4",
            "--decoder-first-pipeline-num-layers", "5", "--decoder-last-pipeline-num-layers", "9", "--profile",
            "h100-sxm5-80gb", "--no-plan", "--jobs", "1"]
    text, js = text_and_json(args)  # one search, its text and --json
    text = text.output
    assert "the pipeline split fixed costs" in text and "with the split left to the search" in text, text
    assert "tokens/GPU/s (simulated) against" in text  # each throughput with its tier
    d = json.loads(js.output)
    best, searched = d["candidates"][0], d["searched_split_best"]
    assert "f5l9" in best["layout"] and "f5l9" not in searched["layout"]
    assert searched["simulated_tgs_tokens_per_gpu_s"] > best["simulated_tgs_tokens_per_gpu_s"]
    plain = json.loads(CliRunner().invoke(cli, args[:9] + args[13:] + ["--json"]).output)
    assert plain["searched_split_best"] is None  # nothing fixed, nothing compared


def test_uneven_splits_that_cannot_be_chunked_build_the_slot_layout_once():
    """The even split and each uneven one that cannot be chunked at a vpp all become one embedding-and-loss-slot
    layout there: built once (a review: llama-3.1-405b on 16,384 H100s built pp16v4el three times, '32 duplicates
    folded' and 'recompute_mlp ... the same bytes as recompute_mlp'). 30 layers over pp 4: f7l7, f6l8 and f8l6 all
    go to v4el at vpp 4."""
    from collections import Counter
    from dataclasses import replace as _replace

    from memo_sim.model import get_model
    from memo_sim.profile import load_profile
    from memo_sim.search.whatif import candidates_for

    res = candidates_for(_replace(get_model("llama-3.1-8b"), layers=30), 4096, 4, load_profile("b200-180gb"), pp=4,
                         tp=1, framework="megatron")
    keys = Counter((c.layout, c.policy.label(), c.schedule, c.micro_batch, c.batch) for c in res.candidates)
    assert not [k for k, n in keys.items() if n > 1]
    labels = {c.layout.label() for c in res.candidates}
    assert {"tp1-pp4f7l7-cudnn-ce-vocab_parallel", "tp1-pp4v4el-cudnn-ce-vocab_parallel"} <= labels
