"""memo-sim explain: for every policy and schedule, the time parts add up to the iteration, the
memory terms to the peak, and the binding limit is said in words."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--jobs", "1"]


def _plan(tmp_path, *extra) -> str:
    out = tmp_path / "p"
    r = CliRunner().invoke(cli, TOY + list(extra) + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    return str(out / "plan.json")


@pytest.mark.parametrize("extra", [
    ("--gpus", "1", "--policy", "store_all"), ("--gpus", "1", "--policy", "full_recompute"),
    ("--gpus", "1", "--policy", "full_offload"), ("--gpus", "1", "--policy", "memo", "--alpha", "0.4"),
    ("--gpus", "4", "--tp", "2", "--cp", "2", "--policy", "memo"),
    ("--gpus", "1", "--policy", "store_all", "--global-batch", "4", "--micro-batch", "1"),
    ("--gpus", "1", "--policy", "memo", "--global-batch", "4", "--micro-batch", "1", "--seq", "32K"),
], ids=["store_all", "full_recompute", "full_offload", "memo", "tp2-cp2-memo", "store_all-4-micro-batches",
        "memo-4-micro-batches"])
def test_explain_adds_up(tmp_path, extra):
    plan = _plan(tmp_path, *extra)
    r = CliRunner().invoke(cli, ["explain", plan, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "OK" and d["binding"]
    for t in d["time_breakdown_s"]:
        parts = sum(t["busy"].values()) + sum(t["waits"].values())
        assert parts == pytest.approx(t["iteration_s"], rel=1e-9, abs=1e-12)
        assert t["busy"]["forward"] > 0 and t["busy"]["backward"] > 0
    assert max(t["iteration_s"] for t in d["time_breakdown_s"]) == pytest.approx(d["iteration_s"], rel=1e-9)
    terms = d["memory_terms_bytes"]
    layer_side = ("layer transients", "boundary", "classifier", "recompute buffer")
    resident = sum(v for k, v in terms.items() if not k.startswith(layer_side))
    trans = next(v for k, v in terms.items() if k.startswith("layer transients")) + terms["boundary activation"]
    trans += terms["recompute buffer (in a backward)"]  # a layer's backward holds it, the classifier does not
    assert resident + max(trans, terms["classifier (or the three above it)"]) == \
        pytest.approx(d["analytic_peak_gpu_bytes"], rel=1e-9)
    if "memo" in extra:
        assert "alpha" in d["binding"]
    if "memo" in extra and "--micro-batch" in extra:  # the solver asked for the micro-batch the plan runs (a review:
        assert "is the solver's" in d["binding"], d["binding"]  # 'alpha 0.402 was set by hand (the solver gives 0.425)'
    if "--micro-batch" in extra:  # the terms of one micro-batch in flight (a review found them x 4): the simulated
        # iteration's peak, with the same activations, within the caching allocator's rounding of the analytic one
        assert d["simulated_peak_gpu_bytes"] == pytest.approx(d["analytic_peak_gpu_bytes"], rel=0.1)
    # [allocator] torch.cuda.memory_stats()'s keys: the cache is replayed beside a static memory plan's arena too
    ms = d["allocator_memory_stats"]  # (`memo_sim.memplan.iteration_replay.engine_replay`)
    assert set(ms) == {"num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                       "reserved_bytes.all.peak", "allocated_bytes.all.peak", "segment.all.current"}
    assert ms["reserved_bytes.all.peak"] >= ms["allocated_bytes.all.peak"] > 0
    text = CliRunner().invoke(cli, ["explain", plan])
    assert text.exit_code == 0 and "binding:" in text.output and "compute stream" in text.output
    assert ("torch.cuda.memory_stats() keys" in text.output) == (ms is not None)


def test_explain_a_pipeline_plan_per_stage(tmp_path):
    out = tmp_path / "s"
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--layers", "8", "--gpus", "8", "--seq", "64K",
                                 "--policy", "sppo", "--pp", "2", "--jobs", "1", "--simulate-top", "1",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = next(p for p in (out / "plan-sppo.json", out / "plan.json") if p.exists())
    d = json.loads(CliRunner().invoke(cli, ["explain", str(plan), "--json"]).output)
    assert len(d["time_breakdown_s"]) == 2 and len(d["stages"]) == 2
    for t in d["time_breakdown_s"]:
        assert sum(t["busy"].values()) + sum(t["waits"].values()) == pytest.approx(t["iteration_s"], rel=1e-9)
        # every stage's table ends at the plan's iteration (a stage done early was shown a shorter 'iteration')
        assert t["iteration_s"] == pytest.approx(d["iteration_s"], rel=1e-9)
    text = CliRunner().invoke(cli, ["explain", str(plan)]).output
    # tp1-pp2-dp4, stages outermost: stage 1 of the first replica is rank 4 (stage 0's four replicas before it)
    assert "time on stage 1's GPU (the first replica's rank 4)'s compute stream" in text, text
    # tp 2 x pp 2: the simulated device's index was printed as 'GPU 1 (stage 1)' though stage 1 starts at rank 2
    r = CliRunner().invoke(cli, [*TOY, "--gpus", "4", "--tp", "2", "--pp", "2", "--policy", "full_recompute",
                                 "--schedule", "1f1b", "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    text = CliRunner().invoke(cli, ["explain", str(tmp_path / "t" / "plan.json")]).output
    assert "time on stage 1's GPU (the first replica's ranks 2-3)'s compute stream" in text, text


@pytest.mark.parametrize("extra", [
    ("--gpus", "2", "--pp", "2", "--schedule", "1f1b", "--policy", "memo"),
    ("--gpus", "2", "--pp", "2", "--schedule", "interleaved_1f1b", "--vpp", "2", "--policy", "full_recompute"),
    ("--gpus", "1", "--framework", "megatron", "--policy", "selective_recompute"),
    ("--gpus", "2", "--tp", "2", "--tp-mode", "metp", "--policy", "store_all"),
], ids=["1f1b-memo", "interleaved-full_recompute", "selective_recompute", "metp"])
def test_explain_every_schedule_and_the_other_policies(tmp_path, extra):
    plan = _plan(tmp_path, *extra)
    r = CliRunner().invoke(cli, ["explain", plan, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["status"] == "OK" and d["binding"] and d["analytic_peak_gpu_bytes"] > 0
    for t in d["time_breakdown_s"]:
        assert sum(t["busy"].values()) + sum(t["waits"].values()) == pytest.approx(t["iteration_s"], rel=1e-9)
    for st in d["stages"] or ():
        assert st["analytic_peak_gpu_bytes"] > 0 and st["peak_gpu_bytes"] > 0
    text = CliRunner().invoke(cli, ["explain", plan])
    assert text.exit_code == 0 and "binding:" in text.output, text.output


def test_explain_names_ulysses_waits_as_such_on_a_tp1_layout(tmp_path):
    """The "comm" stream carries both TP collectives and Ulysses' all-to-alls: a tp1 Ulysses plan's
    waits are the all-to-all's (explain called them "tensor-parallel collectives")."""
    plan = _plan(tmp_path, "--gpus", "2", "--ulysses", "2", "--tp", "1", "--policy", "store_all")
    d = json.loads(CliRunner().invoke(cli, ["explain", plan, "--json"]).output)
    waits = {k for t in d["time_breakdown_s"] for k in t["waits"]}
    assert any("Ulysses all-to-all" in w for w in waits), waits
    assert not any("tensor-parallel" in w for w in waits), waits


def test_a_stage_waiting_on_another_stage_is_not_waiting_on_the_transfer(tmp_path):
    """A pipeline stage's wait for an activation another stage had not computed yet was all called 'waiting on
    pipeline transfers' (DeepSeek-V3 at PP 8, a 4-layer first stage: 16.87 s of 27.9 s, where its P2P traffic
    takes about 0.1 s, a review): the transfer's own time is the transfer's, the wait before it started the other
    stage's compute."""
    from memo_sim.cli.explain import simulate_plan
    from memo_sim.plan.schema import read_plan
    from memo_sim.profile.loader import load_profile
    from memo_sim.report.explain import PEER_WORDS, PIPELINE_STREAMS, time_breakdown

    plan = read_plan(_plan(tmp_path, "--gpus", "2", "--pp", "2", "--schedule", "1f1b", "--batch", "4",
                           "--decoder-first-pipeline-num-layers", "1", "--policy", "store_all"))
    assert plan.layout.first_stage_layers == 1
    res = simulate_plan(plan, load_profile(plan.profile))
    for dev in (0, 1):
        tb = time_breakdown(res, dev)
        moving = sum(o.end - o.start for o in res.ops if o.device == dev and o.stream in PIPELINE_STREAMS)
        assert tb.waits_s.get("waiting on pipeline transfers", 0.0) <= moving * (1 + 1e-9)
        assert tb.accounted_s == pytest.approx(tb.iteration_s, rel=1e-9)
    assert time_breakdown(res, 0).waits_s[PEER_WORDS] > 0  # the 1-layer stage waits on the 3-layer one


def test_explain_json_has_stable_keys_beside_the_words(tmp_path):
    """explain --json keyed its times and memory terms by display words ('waiting on context-parallel ring',
    "layer transients (static plan)"), some of which change with the plan (a review): the same numbers come by
    stable codes too."""
    from memo_sim.cli.explain import MEMORY_TERM_WORDS

    plan = _plan(tmp_path, "--gpus", "4", "--tp", "2", "--cp", "2", "--policy", "memo")
    d = json.loads(CliRunner().invoke(cli, ["explain", plan, "--json"]).output)
    assert set(d["memory_terms_by_kind_bytes"]) == set(MEMORY_TERM_WORDS)
    assert sorted(d["memory_terms_by_kind_bytes"].values()) == sorted(d["memory_terms_bytes"].values())
    for t in d["time_breakdown_s"]:
        assert set(t["busy_by_phase"]) <= {"fwd", "bwd", "recompute", "classifier", "optimizer", "allocator"}
        assert all(k.split(":")[0] in ("stream", "after_last") or k in ("peer_stage", "issue_order",
                                                                         "idle_after_slowest_stage")
                   for k in t["waits_by_cause"]), t["waits_by_cause"]
        assert sum(t["busy_by_phase"].values()) == pytest.approx(sum(t["busy"].values()))
        assert sum(t["waits_by_cause"].values()) == pytest.approx(sum(t["waits"].values()))
    assert any("stream:cp_comm" in t["waits_by_cause"] for t in d["time_breakdown_s"])
