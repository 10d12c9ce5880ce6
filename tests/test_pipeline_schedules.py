"""[pipeline] The micro-batch pipelines (1F1B, interleaved 1F1B) in the simulator, the analytic
tier, the search, the plan and the CLI (issue #27, simulator side)."""

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.grad_sync import GradSync
from memo_sim.cost.opcost import OpCost
from memo_sim.engine.schedules import interleaved, one_f_one_b, registered_schedules
from memo_sim.engine.schedules.microbatch import (
    PipelineCosts, build_microbatch_pipeline, in_flight, run_microbatch_pipeline, stage_in_flight,
)
from memo_sim.engine.simulate import simulate
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout
from memo_sim.layout.schedule import SCHEDULE_NAMES, check_schedule
from memo_sim.model.config import get_model
from memo_sim.plan.schema import read_plan
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.estimate import estimate_iteration, estimate_pipeline, pipeline_bubble
from memo_sim.report.whatif_answer import searched_words
from memo_sim.search.pipeline import pipeline_memory
from memo_sim.search.whatif import candidates_for

A800 = load_profile("a800-80gb")
GPT7 = get_model("gpt-7b")
ROOT = Path(__file__).resolve().parents[1]
ORDERS = {1: one_f_one_b.order}  # vpp -> the schedule's order


def _order(vpp):
    return one_f_one_b.order if vpp == 1 else interleaved.order


def _toy(pp, fwd=1.0, bwd=2.0, unit_bytes=3.0):
    """Every layer of every micro-batch: ``fwd`` s forward, ``bwd`` s backward, ``unit_bytes``
    kept from its forward to its backward; no boundaries, no P2P time, no gradient sync."""
    return PipelineCosts([OpCost("f", "gemm", "fwd", "compute", fwd)], [OpCost("b", "gemm", "bwd", "compute", bwd)],
                         [], 0.0, 0.0, 0.0, (0.0,) * pp, (0.0,) * pp,
                         {"input": 1.0, "attn": 1.0, "other": unit_bytes - 2.0, "lse": 0.0, "total": unit_bytes},
                         0.0, 0.0, 0.0, 0.0, 0.0, {"nvlink": 0.0, "internode": 0.0}, GradSync("nvlink", 0, 0, 0, 0))


def _run_toy(pp, vpp, m, layers_per_chunk=2):
    n = pp * vpp * layers_per_chunk
    sched = build_microbatch_pipeline(_toy(pp), Layout(pp=pp, vpp=vpp), A800, get_policy("store_all"), n, m,
                                      _order(vpp))
    _engine, run, rows = run_microbatch_pipeline(sched, A800, contention=False)
    return run, rows


def test_every_schedule_name_has_a_simulator():
    assert set(registered_schedules()) == set(SCHEDULE_NAMES)


@pytest.mark.parametrize("pp, vpp, m", [(4, 1, 8), (4, 1, 4), (8, 1, 16), (8, 1, 32), (4, 2, 8), (4, 2, 16),
                                        (8, 2, 16), (4, 4, 8), (2, 2, 2)])
def test_constant_time_toy_bubble_is_the_closed_form(pp, vpp, m):
    """Equal stages: each stage idles (p - 1)/m of its work under 1F1B, (p - 1)/(v m) interleaved."""
    run, rows = _run_toy(pp, vpp, m)
    want = pipeline_bubble(pp, vpp, m)
    assert want == (pp - 1) / (vpp * m)
    for r in rows:
        assert r["bubble_ratio"] == pytest.approx(want, rel=0.01)
    per_stage_work = m * 2 * vpp * 3.0  # m micro-batches x 2 layers per chunk x v chunks x (1 + 2) s
    assert run.end_time == pytest.approx(per_stage_work * (1 + want), rel=1e-9)


@pytest.mark.parametrize("pp, vpp, m", [(4, 1, 8), (4, 1, 2), (8, 1, 16), (4, 2, 8), (8, 2, 16), (4, 3, 8)])
def test_toy_peak_memory_follows_the_in_flight_count(pp, vpp, m):
    """Stage s holds min(p - s, m) micro-batches under 1F1B; the interleaved schedule's warm-up
    (Megatron-LM's (p - s - 1)·2 + (v - 1)·p forwards) plus one in flight; peak = that x its layers."""
    run, rows = _run_toy(pp, vpp, m, layers_per_chunk=2)
    for s, r in enumerate(rows):
        want = min(pp - s, m) if vpp == 1 else min((pp - s - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
        assert r["in_flight"] == want
        assert r["peak_gpu_bytes"] == pytest.approx(want * 2 * 3.0)
    assert stage_in_flight("1f1b" if vpp == 1 else "interleaved_1f1b", pp, m, vpp) == [r["in_flight"] for r in rows]


def test_interleaved_holds_more_micro_batches_than_1f1b_but_each_a_vth():
    """Per rank the same layers: 1F1B holds p micro-batches of all its layers on stage 0, the
    interleaved schedule more chunk forwards, each 1/v of the layers."""
    p, m, layers = 4, 8, 16
    one = [in_flight(one_f_one_b.order(p, m, 1, s)) for s in range(p)]
    two = [in_flight(interleaved.order(p, m, 2, s)) for s in range(p)]
    assert one == [4, 3, 2, 1] and two == [11, 9, 7, 5]
    assert [k * layers // (2 * p) for k in two] > [k * layers // p for k in one][1:] + [0]


@pytest.mark.parametrize("schedule, layout", [("1f1b", Layout(tp=2, pp=4)),
                                              ("interleaved_1f1b", Layout(tp=2, pp=4, vpp=2))])
def test_real_stage_memory_steps_by_one_micro_batch_per_stage(schedule, layout):
    """gpt-7b, store all: the simulated peak of stage s less its model states drops from stage to
    stage by exactly the kept activations of the chunks that stage holds fewer of (the last stage,
    which also runs the classifier, aside)."""
    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.cost.sppo import stage_model_state_bytes

    r = simulate(GPT7, layout, 8, 16384, get_policy("store_all"), A800, schedule=schedule, micro_batch=1,
                 keep_timeline=False)
    assert r.ok and r.schedule == schedule
    sk = skeletal_bytes(GPT7, Layout(tp=2), 1, 16384)
    per_chunk = GPT7.layers // (layout.pp * layout.vpp) * (sk["total"] + sk["lse"])
    st = r.pipeline["stages"]
    act = [x["peak_gpu_bytes"] - stage_model_state_bytes(GPT7, layout, x["stage"]) for x in st]
    for a, b, x, y in zip(act, act[1:-1], st, st[1:-1]):
        assert a - b == pytest.approx((x["in_flight"] - y["in_flight"]) * per_chunk, rel=1e-9)


@pytest.mark.parametrize("schedule, layout", [("1f1b", Layout(tp=2, pp=4)), ("interleaved_1f1b", Layout(tp=2, pp=4, vpp=2)),
                                              ("1f1b", Layout(tp=8, pp=4, dp=2, zero=1)),
                                              ("interleaved_1f1b", Layout(tp=4, pp=2, vpp=4, dp=2))])
@pytest.mark.parametrize("policy", ["store_all", "full_recompute", "full_offload", "memo"])
def test_analytic_tier_prices_the_simulated_pipeline(schedule, layout, policy):
    """Without contention the analytic pipeline (bubble (p - 1)/(v m)) is the simulation's
    iteration within 1 % for the policies that do not copy, 10 % for those that do (the analytic
    tier puts each layer's copy under its own layer), and its memory within 10 %."""
    pol = get_policy(policy, 0.3 if policy == "memo" else None)
    b = 8 if layout.dp == 1 else 16 if layout.pp == 4 else 4
    r = simulate(GPT7, layout, b, 16384, pol, A800, schedule=schedule, micro_batch=1, keep_timeline=False,
                 contention=False)
    e = estimate_pipeline(GPT7, layout, b, 1, 16384, pol, A800)
    mem, _rows = pipeline_memory(GPT7, layout, b, 1, 16384, pol, A800, schedule)
    assert r.ok
    assert r.iteration_s == pytest.approx(e.iteration_s, rel=0.10 if pol.offloads else 0.01)
    assert r.peak_gpu_bytes == pytest.approx(mem.peak_gpu_bytes, rel=0.10)
    if pol.offloads:  # every micro-batch in flight holds its offloaded layers in pinned host memory
        assert r.peak_host_bytes_per_node == pytest.approx(mem.host_bytes_per_node, rel=0.10)
        assert r.pipeline["stages"][0]["in_flight"] > 1


def test_p2p_rides_the_inter_node_link_across_nodes():
    r = simulate(GPT7, Layout(tp=8, pp=2), 4, 8192, get_policy("full_recompute"), A800, schedule="1f1b",
                 micro_batch=1, record=True, keep_timeline=False)
    sends = [o for o in r.ops if o.stream == "p2p"]
    assert sends and {o.link for o in sends} == {"internode"}  # tp8: each stage fills a node
    r = simulate(GPT7, Layout(tp=2, pp=4), 4, 8192, get_policy("full_recompute"), A800, schedule="1f1b",
                 micro_batch=1, record=True, keep_timeline=False)
    assert {o.link for o in r.ops if o.stream == "p2p"} == {"nvlink"}
    names = {o.name.split("@")[0] for o in r.ops if o.device == 0} | {o.name for o in r.ops if o.device == 3}
    assert "embedding" in names and any(n.startswith("classifier") for n in names)
    first = {o.name.split("@")[0] for o in r.ops if o.device == 0}
    last = {o.name.split("@")[0] for o in r.ops if o.device == 3}
    assert "embedding" in first and "classifier" not in first and "classifier" in last and "embedding" not in last


def test_gradients_are_reduced_once_per_iteration():
    """DP gradient buckets go out after the last micro-batch's backward of each layer only (the head's after the
    last micro-batch's head)."""
    lay = Layout(tp=8, pp=2, dp=2)
    r = simulate(GPT7, lay, 4, 8192, get_policy("full_recompute"), A800, schedule="1f1b", micro_batch=1,
                 record=True, keep_timeline=False)
    grads = [o for o in r.ops if o.phase == "grad_sync" and o.name != "sum_shared_embedding_grad"]
    per_stage = GPT7.layers // 2 + 1  # a bucket per layer and one for the embedding / classifier
    assert len(grads) == 2 * per_stage
    last_bwd = {o.device: max(x.end for x in r.ops if x.device == o.device and x.phase == "bwd") for o in grads}
    first_bwd_of_last_mb = {d: min(x.start for x in r.ops if x.device == d and x.phase == "bwd"
                                   and x.name.endswith("@m3")) for d in last_bwd}
    head = [o for o in grads if o.device == 1 and o.layer is None]  # the head's bucket: after the last head
    assert len(head) == 1 and head[0].start >= max(x.end for x in r.ops if x.name == "classifier@m3") - 1e-12
    assert all(o.start >= first_bwd_of_last_mb[o.device] for o in grads if o not in head)


def test_single_stage_accumulates_gradients_over_micro_batches():
    """Four micro-batches of one sequence: about four single-sequence iterations (one optimizer
    step, one gradient reduction), the peak of one; analytic and simulated agree as for m = 1."""
    lay, pol = Layout(tp=4, dp=2), get_policy("full_recompute")
    one = simulate(GPT7, lay, 1, 16384, pol, A800, keep_timeline=False)
    four = simulate(GPT7, lay, 4, 16384, pol, A800, micro_batch=1, keep_timeline=False)
    assert four.micro_batch == 1 and four.to_dict()["micro_batch"] == 1
    # less than four: one optimizer step, one exposed gradient tail, the allocator's cache warm after the first
    assert 3.5 * one.iteration_s < four.iteration_s < 4.0 * one.iteration_s
    assert four.peak_gpu_bytes == pytest.approx(one.peak_gpu_bytes, rel=1e-9)
    assert four.tgs == pytest.approx(4 * one.iteration_s / four.iteration_s * one.tgs, rel=1e-9)
    est = estimate_iteration(GPT7, lay, 4, 16384, pol, A800, micro_batch=1)
    est1 = estimate_iteration(GPT7, lay, 1, 16384, pol, A800)
    assert 3.5 * est1.iteration_s < est.iteration_s < 4.0 * est1.iteration_s
    assert est.tgs > est1.tgs
    with pytest.raises(MemoError, match="micro_batch"):
        simulate(GPT7, lay, 4, 16384, pol, A800, micro_batch=3)


def test_search_ranks_pipelines_beside_single_stage_on_throughput():
    res = candidates_for(GPT7, 32768, 8, A800, batch=8, policies=("full_recompute",),
                         schedules=("single_stage", "1f1b", "interleaved_1f1b"))
    ok = [c for c in res.candidates if c.status == "OK"]
    assert {c.schedule for c in ok} == {"single_stage", "1f1b", "interleaved_1f1b"}
    assert {c.layout.pp > 1 for c in ok} == {True, False}
    assert [c.tgs for c in ok] == sorted((c.tgs for c in ok), reverse=True)
    assert res.searched["pipeline"]["why"] == "asked for"


def test_default_search_ranks_pipelines_beside_the_single_stage():
    """Every schedule the framework runs is searched by default (issue #48 item 4), a single stage that fits
    or not; --schedule single_stage leaves the pipelines out and the searched line says how."""
    res = candidates_for(GPT7, 32768, 8, A800, policies=("memo",))
    assert {c.schedule for c in res.candidates} == {"single_stage", "1f1b", "interleaved_1f1b"}
    assert res.searched["pipeline"]["why"] == "searched by default" and res.searched["pipeline"]["pp"] == [2, 4, 8]
    assert any(c.status == "OK" for c in res.candidates if c.schedule == "single_stage")
    only = candidates_for(GPT7, 32768, 8, A800, policies=("memo",), schedules=("single_stage",))
    assert {c.schedule for c in only.candidates} == {"single_stage"} and "pipeline" not in only.searched
    assert "no micro-batch pipelines (left out by --schedule, --pp 1 or the framework)" in searched_words(
        only.searched)


def test_megatron_pipelines_a_model_that_does_not_fit_without_one():
    m = get_model("gpt-175b")
    res = candidates_for(m, 32768, 64, A800, framework="megatron@2023")  # the distributed optimizer, no FSDP
    single = [c for c in res.candidates if c.schedule == "single_stage"]
    assert single and all(c.status != "OK" for c in single)
    assert res.best is not None and res.best.layout.pp > 1 and res.best.schedule in ("1f1b", "interleaved_1f1b")
    assert res.best.layout.zero <= 1 and res.best.layout.ulysses == 1
    assert res.searched["pipeline"]["why"] == "searched by default"
    # today's Megatron-LM also shards the weights on one stage (Megatron-FSDP, ZeRO 3): those fit, no other does
    now = candidates_for(m, 32768, 64, A800, framework="megatron")
    fits = [c for c in now.candidates if c.schedule == "single_stage" and c.status == "OK"]
    assert fits and all(c.layout.zero == 3 for c in fits)
    assert any(c.layout.pp > 1 and c.status == "OK" for c in now.candidates)


@pytest.mark.parametrize("policy", ["memo", "full_recompute", "store_all"])
def test_cli_175b_pp8_ranks_1f1b_and_interleaved(policy):
    """Every ranked row (both tiers) is a pp 8 pipeline, 1F1B and interleaved; tier 2 simulates the analytic best
    (the ranking's rows are the same under the default bound-ordered tier 2, which simulates more of them)."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-175b", "--gpus", "64", "--seq", "32K", "--pp", "8",
                                 "--policy", policy, "--json", "--no-plan", "--simulate-top", "1"])
    assert r.exit_code in (0, 3), r.output
    obj = json.loads(r.stdout)
    cands = obj["candidates"]
    assert {c["schedule"] for c in cands} == {"1f1b", "interleaved_1f1b"}
    assert all(c["pp"] == 8 for c in cands) and any(c["vpp"] > 1 for c in cands)
    assert obj["searched"]["pipeline"]["pp"] == [8]


def test_whatif_plan_of_a_pipeline_reads_back_and_simulates(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "8", "--seq", "16K", "--pp", "4", "--schedule", "1f1b",
                                 "--batch", "8", "--micro-batch", "1", "--policy", "memo", "--out", str(tmp_path),
                                 "--simulate-top", "2"])
    assert r.exit_code == 0, r.output
    assert "searched: 1f1b; pipelines (asked for): pp 4" in r.output
    plan = read_plan(tmp_path / "plan.json")
    assert plan.schedule == "1f1b" and plan.micro_batch == 1 and plan.micro_batches == 8 and plan.layout.pp == 4
    assert plan.check_schedule() is None and check_schedule(
        "1f1b", pp=4, vpp=1, layers=plan.model.layers, batch=8, micro_batch=1, policy_name="memo") is None
    r = CliRunner().invoke(cli, ["check-plan", str(tmp_path / "plan.json")])
    assert r.exit_code == 0 and "schedule 1f1b: 8 micro-batch" in r.output
    out = tmp_path / "sim"
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "plan.json"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "pipeline_gantt.png").exists() and (out / "stage_memory.png").exists()
    assert "stage 3:" in r.output and "chunk forwards in flight" in r.output
    tl = json.loads((out / "timeline.json").read_text())
    assert tl["meta"]["schedule"] == "1f1b" and tl["meta"]["pipeline"]["micro_batches"] == 8
    assert {e["op"].rsplit("@m", 1)[1] for e in tl["events"] if "@m" in e["op"]} == {str(k) for k in range(8)}


@pytest.mark.parametrize("args, needle", [
    (["--vpp", "2", "--framework", "deepspeed"], "vpp"),
    (["--pp", "2", "--schedule", "single_stage"], "--pp"),
    (["--batch", "4", "--global-batch", "8"], "--global-batch"),
    (["--pp", "2", "--micro-batch", "3", "--batch", "4", "--schedule", "1f1b"], "--micro-batch 3 does not divide --batch 4"),
])
def test_bad_pipeline_flags_are_one_line_errors(args, needle):
    r = CliRunner().invoke(cli, ["whatif", "--gpus", "8", "--seq", "16K", "--no-plan", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and r.output.strip().count("\n") == 0


def test_no_capability_lookups_and_no_search_cycle():
    src = ROOT / "memo_sim"
    assert not [p for p in src.rglob("*.py") if "pipelined" in p.read_text()]
    for path in (src / "search" / "sppo").rglob("*.py"):  # the SPPO planner's modules
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "memo_sim.search.whatif" not in imported, path


def test_every_micro_batch_in_flight_offloads_to_host():
    """Full offload under 1F1B: with one micro-batch a stage holds one micro-batch's host blocks,
    with four the first stage holds four, the next three, ... (the node's pinned memory counts
    them all); the analytic count is an upper bound the simulation comes within 10 % of."""
    pol = get_policy("full_offload")
    host = {}
    for b in (1, 4):
        r = simulate(GPT7, Layout(tp=2, pp=4), b, 16384, pol, A800, schedule="1f1b", micro_batch=1,
                     keep_timeline=False)
        mem, _rows = pipeline_memory(GPT7, Layout(tp=2, pp=4), b, 1, 16384, pol, A800, "1f1b")
        assert [s["in_flight"] for s in r.pipeline["stages"]] == [min(4 - s, b) for s in range(4)]
        assert 0.9 * mem.host_bytes_per_node <= r.peak_host_bytes_per_node <= mem.host_bytes_per_node
        host[b] = r.peak_host_bytes_per_node
    assert host[4] > 2.5 * host[1]


def test_global_batch_gives_each_layout_its_share():
    res = candidates_for(GPT7, 32768, 8, A800, global_batch=8, policies=("full_recompute",), tp=2)
    assert res.candidates and all(c.batch * c.layout.dp == 8 for c in res.candidates)
    assert {c.micro_batch for c in res.candidates if c.batch == 2} == {1, 2}  # the batch's divisors
    with pytest.raises(MemoError, match="--global-batch"):
        candidates_for(GPT7, 32768, 8, A800, global_batch=8, batch=2)


@pytest.mark.parametrize("layout", [Layout(tp=2, sp=False, pp=2, cp=2), Layout(tp=2, pp=2, ulysses=2),
                                    Layout(cp=4, pp=2), Layout(tp=4, cp=2, pp=2, dp=2, zero=1)])
def test_pipelines_combine_with_the_other_splits(layout):
    """TP without SP, ring CP, Ulysses and DP with ZeRO-1 inside a pipeline: valid layouts, the
    stage's collectives in its op chains, analytic and simulated within 2 % without contention."""
    from memo_sim.layout.parallel import check_layout

    assert check_layout(layout, GPT7, layout.gpus, 8, 32768) is None
    pol = get_policy("memo", 0.4)
    r = simulate(GPT7, layout, 4, 32768, pol, A800, schedule="1f1b", micro_batch=1, keep_timeline=False,
                 contention=False, record=True)
    assert r.ok and r.iteration_s == pytest.approx(estimate_pipeline(GPT7, layout, 4, 1, 32768, pol, A800).iteration_s,
                                                   rel=0.02)
    streams = {o.stream for o in r.ops}
    assert ("cp_comm" in streams) == (layout.cp > 1) and "p2p" in streams


def test_pipelines_price_materialised_attention_per_layer():
    """Materialised attention in a pipeline stage (Megatron-LM 2021/2022): each layer's kernels
    over the whole s x s score matrix and its score-sized transients (and, store all, its kept
    softmax output and dropout mask per micro-batch in flight): slower and fuller than flash, the
    more so at a longer sequence; the analytic tier agrees on the direction."""
    from dataclasses import replace

    from memo_sim.layout.parallel import check_layout

    flash = Layout(tp=8, pp=2, dp=2)
    mat = replace(flash, attention="materialised")
    assert check_layout(mat, GPT7, 32, A800.node_gpus, 4096, 4) is None
    gaps = []
    for seq in (2048, 8192):
        for name in ("full_recompute", "store_all"):
            pol = get_policy(name)
            a, b = (simulate(GPT7, lay, 4, seq, pol, A800, schedule="1f1b", micro_batch=1, keep_timeline=False)
                    for lay in (flash, mat))
            assert b.iteration_s > a.iteration_s and b.peak_gpu_bytes > a.peak_gpu_bytes, (seq, name)
            assert (estimate_pipeline(GPT7, mat, 4, 1, seq, pol, A800).iteration_s
                    > estimate_pipeline(GPT7, flash, 4, 1, seq, pol, A800).iteration_s)
            if name == "full_recompute":
                gaps.append(b.iteration_s / a.iteration_s)
    assert gaps[1] > gaps[0]  # the s^2 kernels weigh more at the longer sequence


def test_pipelines_price_a_serial_gradient_reduction_per_stage():
    """``grad_overlap`` off with pp > 1 (Megatron-LM 2021's local DDP): no per-layer buckets; after
    each rank's last step one collective of the stage's own gradients, wholly exposed: slower than
    overlapped buckets when DP > 1, the same time without DP."""
    from dataclasses import replace

    from memo_sim.cost.sppo import stage_grad_sync, stage_serial_grad_reduce

    pol = get_policy("full_recompute")
    for dp in (2, 1):
        over = Layout(tp=8, pp=2, dp=dp)
        serial = replace(over, grad_overlap=False)
        a, b = (simulate(GPT7, lay, 4, 8192, pol, A800, schedule="1f1b", micro_batch=1, record=True,
                         keep_timeline=False) for lay in (over, serial))
        if dp == 1:
            assert b.iteration_s == pytest.approx(a.iteration_s)
            continue
        assert b.iteration_s > a.iteration_s
        grads = [o for o in b.ops if o.phase == "grad_sync" and o.name != "sum_shared_embedding_grad"]
        assert len(grads) == 2 and all(o.layer is None for o in grads)  # one per stage
        for o in grads:  # after the stage's whole backward, its own gradients
            assert o.start >= max(x.end for x in b.ops if x.device == o.device and x.phase == "bwd")
        secs = [stage_serial_grad_reduce(GPT7, serial, A800, s) for s in range(2)]
        # each at least its collective alone on the link (the two stages' share links where they overlap)
        for o in grads:
            assert o.end - o.start >= secs[0 if o.device == min(g.device for g in grads) else 1] * (1 - 1e-9)
        # a stage's reduction covers half the layers, so it is shorter than the whole model's
        assert max(secs) < stage_grad_sync(GPT7, serial, A800).all_grads
        assert (estimate_pipeline(GPT7, serial, 4, 1, 8192, pol, A800).iteration_s
                > estimate_pipeline(GPT7, over, 4, 1, 8192, pol, A800).iteration_s)


def test_families_whose_model_states_alone_overflow_are_rejected_unbuilt(monkeypatch):
    """A pipeline layout whose fullest stage's model states exceed the GPU is rejected before its
    candidates are built (`memo_sim.search.pipeline.states_why_not`): building them anyway gives only
    out-of-memory candidates, and every other candidate is the same to the byte."""
    import memo_sim.search.pipeline as pipeline

    m = get_model("gpt-175b")
    pruned = candidates_for(m, 32768, 64, A800, framework="megatron", schedules=("1f1b", "interleaved_1f1b"))
    words = [why for _lay, why in pruned.rejected_layouts if "model states alone" in why]
    assert words and all("no policy, micro-batch or schedule fits" in w for w in words)
    monkeypatch.setattr(pipeline, "states_why_not", lambda *_a: "")
    built = candidates_for(m, 32768, 64, A800, framework="megatron", schedules=("1f1b", "interleaved_1f1b"))

    def key(c):
        return (c.layout, c.policy.label(), c.schedule, c.micro_batch)

    kept = {key(c): c for c in pruned.candidates}
    extra = [c for c in built.candidates if key(c) not in kept]
    assert len(extra) > len(words) and all(c.status == "OOM" for c in extra)
    assert all(max(s["model_states_bytes"] for s in c.pipeline["stages"]) > A800.usable_gpu_memory for c in extra)
    same = [c for c in built.candidates if key(c) in kept]
    assert len(same) == len(pruned.candidates)
    for c in same:
        k = kept[key(c)]
        assert (k.memory, k.pipeline, k.estimate) == (c.memory, c.pipeline, c.estimate)


def test_pipeline_memory_of_one_stage():
    """`pipeline_memory(..., stage=s)`: stage s's terms (the executor report compares rank 0's estimate with
    stage 0's); by default the fullest stage's, whose peak is the largest of the per-stage rows."""
    pol = get_policy("full_recompute")
    lay = Layout(tp=2, pp=4)
    full, rows = pipeline_memory(GPT7, lay, 8, 1, 16384, pol, A800, "1f1b")
    assert full.peak_gpu_bytes == max(r["peak_gpu_bytes"] for r in rows)
    for s, row in enumerate(rows):
        one, _ = pipeline_memory(GPT7, lay, 8, 1, 16384, pol, A800, "1f1b", stage=s)
        assert one.peak_gpu_bytes == row["peak_gpu_bytes"] and one.model_states_bytes == row["model_states_bytes"]
    assert rows[0]["peak_gpu_bytes"] != rows[-1]["peak_gpu_bytes"]  # 1F1B: stage 0 holds p micro-batches, the last 1
    with pytest.raises(ValueError, match="stage 4 of a 4-stage"):
        pipeline_memory(GPT7, lay, 8, 1, 16384, pol, A800, "1f1b", stage=4)


def test_no_fit_names_the_layout_nearest_to_fitting(tmp_path, monkeypatch):
    """Where no pipeline layout's model states fit, the answer spoke of the first layout refused: Llama 4
    Maverick's shape (400.7B) on 64 H100s at PP 4 was told 'stage 3's model states alone (1.65 TiB)', the layout
    without TP, EP or ZeRO, while the least of the searched layouts holds 106.96 GiB (a review). The answer
    names the layout nearest to fitting, and its bytes are the least of the layouts refused."""
    import memo_sim.search.pipeline as pipeline
    from memo_sim.model.config import ModelConfig
    from memo_sim.model.hf_config import hf_model_fields
    from memo_sim.units import fmt_bytes

    text = json.loads((Path(__file__).parent / "data/hf/llama-4-scout/config.json").read_text())["text_config"]
    mav = ModelConfig.from_dict(hf_model_fields(dict(text, interleave_moe_layer_step=2, num_local_experts=128),
                                                name="maverick"))
    (tmp_path / "m.yaml").write_text(json.dumps(mav.to_dict()))
    refused, states_why_not = [], pipeline.states_why_not

    def recording(model, layout, profile):
        why = states_why_not(model, layout, profile)
        if why:
            refused.append(max(pipeline._stage_states(model, layout)))
        return why
    monkeypatch.setattr(pipeline, "states_why_not", recording)
    r = CliRunner().invoke(cli, ["whatif", "--model", str(tmp_path / "m.yaml"), "--gpus", "64", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--global-batch", "64", "--framework", "megatron",
                                 "--pp", "4", "--jobs", "1", "--out", str(tmp_path)])
    assert r.exit_code == 3, r.output  # a valid request nothing fits, not bad input (2)
    assert "the least of the layouts searched: tp" in r.output and len(set(refused)) > 1
    assert f"model states alone ({fmt_bytes(min(refused))})" in r.output
    # --json answers it as a document (it printed nothing), and maxseq exits 3 as the what-if does (it exited 2)
    j = CliRunner().invoke(cli, ["whatif", "--model", str(tmp_path / "m.yaml"), "--gpus", "64", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--framework", "megatron", "--pp", "4", "--jobs", "1",
                                 "--no-plan", "--json"])
    assert j.exit_code == 3 and json.loads(j.stdout)["nothing_fits"] is True, j.output
    m = CliRunner().invoke(cli, ["maxseq", "--model", str(tmp_path / "m.yaml"), "--gpus", "64", "--profile",
                                 "h100-sxm5-80gb", "--framework", "megatron", "--pp", "4", "--policy", "full_recompute",
                                 "--step", "8K"])
    assert m.exit_code == 3 and "model states alone exceed the GPU memory on every layout" in m.output, m.output
