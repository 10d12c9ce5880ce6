"""A user review of the micro-batch pipelines (2026-12-01, second round): checkpoint offload's slot in a pipeline,
the reason a 1F1B search names, the kept-activation words under interleaving, --schedule sppo with another policy
and the equal-stage bubble as a share of the iteration."""

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.engine.schedules import interleaved, one_f_one_b
from memo_sim.engine.schedules.microbatch import build_microbatch_pipeline, pipeline_costs
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout, virtual_split_why_not
from memo_sim.model.config import get_model, with_overrides
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.report.explain import live_words
from memo_sim.search.pipeline import pipeline_memory

A800 = load_profile("a800-80gb")
GPT7 = get_model("gpt-7b")
TOY = with_overrides(GPT7, layers=8, hidden=256, heads=8, vocab=512)


def _slot_bytes(policy: str) -> tuple:
    """The rounding blocks each rank holds through the step in the pipeline's op graph (toy model, pp 2, 1F1B: its
    static allocations), any slot a unit still allocates, the unit's skeletal bytes and the policy."""
    pol = get_policy(policy, 0.5 if policy == "memo" else None)
    lay = Layout(pp=2)
    costs = pipeline_costs(TOY, lay, 1, 2048, pol, A800)
    sched = build_microbatch_pipeline(costs, lay, A800, pol, TOY.layers, 4, one_f_one_b.order)
    blocks = [(d, a.nbytes) for d, a in sched.graph.static if a.tensor == "rounding_blocks"]
    per_unit = {a.nbytes for op in sched.graph.ops for a in (op.mem_start or ()) + (op.mem_end or ())
                if a.tensor.endswith(".slot")}
    return blocks, per_unit, costs.skeletal, pol


@pytest.mark.parametrize("policy", ["checkpoint_offload", "full_offload", "memo"])
def test_each_offloading_policy_writes_its_own_slot_size_in_a_pipeline(policy):
    """Bug 1: a unit's slot is one of the policy's own buffers (its pipeline rank's forward buffer): the layer
    input for checkpoint offload (the whole skeletal slot was allocated), every skeletal tensor for the others.
    Since 2026-12-03 the rank's two forward and two prefetch blocks are held through the step, as memo-exec allocates
    them and the stage's level-2 plan places them (a review: slots allocated per unit and freed as each copy ended
    put a stage's simulated peak below its own arena)."""
    blocks, per_unit, sk, pol = _slot_bytes(policy)
    rounding = sum(b for n, b in pol.pipeline_rank_blocks(sk) if "forward" in n or "prefetch" in n)
    assert not per_unit
    assert sorted(d for d, _b in blocks) == [0, 1] and {b for _d, b in blocks} == {rounding}
    assert rounding == 4 * (sk["input"] if policy == "checkpoint_offload" else sk["total"])


def test_checkpoint_offload_pipeline_peak_is_its_analytic_peak():
    """Bug 1, the review's run: gpt-7b at 64K, tp 2 + SP, pp 4, 8 micro-batches: stage 0 simulated 38.10 GiB
    beside its analytic 23.10 GiB (four full-layer slots of 4 GiB where the policy holds four 256 MiB inputs)."""
    lay = Layout(tp=2, sp=True, pp=4)
    pol = get_policy("checkpoint_offload")
    r = simulate(GPT7, lay, 8, 65536, pol, A800, schedule="1f1b", micro_batch=1, keep_timeline=False)
    _mem, rows = pipeline_memory(GPT7, lay, 8, 1, 65536, pol, A800, "1f1b")
    assert r.ok
    sim0 = r.pipeline["stages"][0]["peak_gpu_bytes"]
    assert sim0 == pytest.approx(rows[0]["peak_gpu_bytes"], rel=0.01)


def test_checkpoint_offload_holds_less_than_full_recompute_at_its_longest_length():
    """Bug 1's consequence in maxseq (gpt-7b, 8 GPUs, pp 4, tp 2, step 32K): checkpoint offload's longest length
    was 160K, below full recompute's 256K, though it keeps no layer input on the GPU (its simulated stage held
    four full-layer slots). At 256K, 4 micro-batches, it now fits, below full recompute's peak."""
    lay = Layout(tp=2, sp=True, pp=4)
    peak = {}
    for pol in ("checkpoint_offload", "full_recompute"):
        r = simulate(GPT7, lay, 4, 262144, get_policy(pol), A800, schedule="1f1b", micro_batch=1,
                     keep_timeline=False)
        assert r.ok, (pol, r.status)
        peak[pol] = r.peak_gpu_bytes
    assert peak["checkpoint_offload"] < peak["full_recompute"]


def test_only_the_interleaved_schedule_takes_virtual_stages():
    from memo_sim.engine.schedules.microbatch import takes_virtual_stages

    assert takes_virtual_stages(interleaved.NAME) and not takes_virtual_stages(one_f_one_b.NAME)


def test_a_1f1b_search_names_its_own_reason_not_a_virtual_split():
    """Bug 2: torchtitan's 1F1B needs at least as many micro-batches as stages (4 < 8); the search tried vpp 2-4
    for 1F1B too, and 'do not split evenly into pp x vpp = 24 model chunks' replaced that reason; the reason
    named is the one at the smallest micro-batch (4 micro-batches, not 1)."""
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--pp", "8",
                                 "--batch", "4", "--framework", "torchtitan", "--schedule", "1f1b", "--no-plan"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "pp x vpp" not in r.output and "at least as many micro-batches as pipeline stages, got 4 for pp 8" \
        in r.output, r.output


def test_kept_words_count_units_where_layers_and_micro_batches_do_not_multiply():
    """Bug 3: under interleaving a rank holds its chunks for different micro-batches: 11 (layer, micro-batch)
    units of 2 layers over 7 micro-batches were called '2 layers in 7 micro-batches'."""
    units = [(0, k) for k in range(7)] + [(4, k) for k in range(4)]
    live = {f"mb{k}.L{layer}.skeletal": 16.0 for layer, k in units}
    words = live_words(live)
    assert words == {"kept activations of 11 layer-micro-batch units (2 layers, up to 7 micro-batches)": 176.0}
    full = live_words({f"mb{k}.L{layer}.slot": 1.0 for layer in (6, 7) for k in (4, 5)})
    assert full == {"rounding-buffer slot of 2 layers in 2 micro-batches": 4.0}  # every unit named: true as it was


def test_explain_says_the_units_of_an_interleaved_plan(tmp_path):
    """Bug 3 end to end: the review's plan (8 layers, pp 4, vpp 2, 8 micro-batches); stage 0 holds 11 units."""
    out = tmp_path / "p"
    r = CliRunner().invoke(cli, ["whatif", "--layers", "8", "--hidden", "256", "--seq", "2K", "--gpus", "4",
                                 "--pp", "4", "--vpp", "2", "--batch", "8", "--micro-batch", "1",
                                 "--policy", "store_all", "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["explain", str(out / "plan.json")])
    assert r.exit_code == 0, r.output
    assert "kept activations of 11 layer-micro-batch units (2 layers, up to 7 micro-batches)" in r.output, r.output
    assert "2 layers in 7 micro-batches" not in r.output


@pytest.mark.parametrize("extra", [[], ["--pp", "2"]])
def test_sppo_schedule_with_another_policy_names_the_rule(extra):
    """Bug 4: --schedule sppo --policy memo said 'no factorisation of the GPU count matches the fixed degrees'
    (with --pp 2: 'no pipeline schedule is searched (sppo)')."""
    r = CliRunner().invoke(cli, ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                 "--seq", "2K", "--gpus", "2", "--schedule", "sppo", "--policy", "memo", "--no-plan",
                                 *extra])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1, r.output
    assert "--policy memo with --schedule sppo: the sppo schedule runs --policy sppo only" in r.output, r.output


def test_the_ideal_bubble_is_a_share_of_the_iteration():
    """Bug 5: pp 4, 2 micro-batches: (p - 1)/(v m) = 150 % is idle over work; the share of the iteration is
    (p - 1)/(v m + p - 1) = 60 %, the simulated pipeline's ``ideal_bubble_fraction`` (memo-exec's definition)."""
    from memo_sim.engine.schedules.microbatch import ideal_bubble_fraction

    assert ideal_bubble_fraction(4, 1, 2) == pytest.approx(0.6)
    assert ideal_bubble_fraction(4, 2, 4) == pytest.approx(3 / 11)
    r = simulate(TOY, Layout(pp=4), 2, 2048, get_policy("store_all"), A800, schedule="1f1b", micro_batch=1,
                 keep_timeline=False)
    assert r.pipeline["ideal_bubble_fraction"] == pytest.approx(0.6)
    assert r.pipeline["ideal_bubble_fraction"] < 1 and r.pipeline["ideal_bubble_ratio"] == pytest.approx(1.5)


def test_simulate_prints_the_ideal_bubble_as_a_share_of_the_iteration(tmp_path):
    """Bug 5 (memo_sim/cli/simulate.py): pp 4, 2 micro-batches printed 'bubble (p - 1)/(v m) = 150.0%'."""
    r = CliRunner().invoke(cli, ["whatif", "--layers", "8", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                 "--seq", "2K", "--gpus", "4", "--pp", "4", "--batch", "2", "--micro-batch", "1",
                                 "--schedule", "1f1b", "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["simulate", str(tmp_path / "p" / "plan.json"), "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "bubble (p - 1)/(v m + p - 1) = 60.0% of the iteration" in r.output and "150.0%" not in r.output


def test_memo_exec_pipeline_report_uses_the_simulators_bubble():
    """Bug 5 (memo_exec/pipeline/report.py): one definition for both tools."""
    from memo_exec.pipeline.report import ideal_bubble
    from memo_sim.engine.schedules.microbatch import ideal_bubble_fraction

    assert ideal_bubble(4, 1, 2) == ideal_bubble_fraction(4, 1, 2) == pytest.approx(0.6)


def test_layers_that_the_plans_pipeline_cannot_split_are_refused_before_any_rank_starts(tmp_path):
    """Bug 7 (memo_exec/runner.py run_model, which check_plan_for_world runs before --nproc launches): --layers 3
    of a 4-layer pp 2 plan failed inside every rank after ~15 s without naming --layers."""
    from memo_exec.errors import ExecError
    from memo_exec.runner import RunOptions, run_model
    from memo_sim.plan.schema import read_plan

    r = CliRunner().invoke(cli, ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "512",
                                 "--seq", "2K", "--gpus", "2", "--pp", "2", "--vpp", "1", "--schedule", "1f1b",
                                 "--policy", "store_all", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    plan = read_plan(str(tmp_path / "p" / "plan.json"))
    with pytest.raises(ExecError, match=r"^--layers 3: plan layout tp1-pp2 cannot split .*; give --layers 2 or 4$"):
        run_model(plan, RunOptions(layers=3))
    assert run_model(plan, RunOptions(layers=2)).layers == 2


def test_the_uneven_split_error_lists_no_middle_stage_at_pp_2():
    """Bug 6 (memo_sim/layout/parallel.py virtual_split_why_not): pp 2 has no stages between its two ends."""
    why = virtual_split_why_not(8, 2, 2, first=3)
    assert why == "the stages' layer counts (3 first, 5 last) must each divide over the 2 model chunks of a rank"
    assert "5 between" in virtual_split_why_not(13, 3, 2, first=3)  # pp 3: 3 first, 5 between, 5 last


def test_zero_beside_stages_refusal_names_a_way_maxseq_takes():
    """A review: maxseq's refusal of ZeRO 2 with pp suggested "dp_mode fsdp", an option maxseq does not have; the way
    every command takes is --framework torchtitan (FSDP beside stages)."""
    r = CliRunner().invoke(cli, ["maxseq", "--layers", "8", "--hidden", "256", "--heads", "8", "--ffn", "1024",
                                 "--vocab", "1024", "--gpus", "4", "--pp", "2", "--dp", "2", "--zero", "2",
                                 "--policy", "store_all", "--step", "2K"])
    assert r.exit_code == 2 and "--framework torchtitan" in r.output and "dp_mode" not in r.output, r.output


def test_old_megatrons_warm_up_note_counts_what_memo_counts():
    """A review: the megatron@2021-2023 note said stage s held max(0, 2s + 2 - p) chunks more than memo counts (the
    last stage p more); memo counts 8, 8, 7, 5 at p 4, v 2, m 4 against the all-warm-up p·v = 8: 2s + 1 - p."""
    from memo_sim.search.frameworks import get_framework

    for name in ("megatron@2021", "megatron@2022", "megatron@2023"):
        note = " ".join(get_framework(name).sources)
        assert "max(0, 2s + 1 - p)" in note and "(the last stage p - 1 more)" in note, name


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_1f1b"])
def test_memo_stages_hold_their_rounding_blocks_through_the_step(schedule):
    """A review (2026-12-03): a pp 2 MEMO plan's last stage simulated 192 MiB beside its own level-2 arena of 280 MiB
    and memo-exec's four rounding blocks of 56 MiB (224 MiB) on the rank: the event simulator allocated a slot per
    unit and freed it as its copy ended. Every stage now holds the four blocks through the step, beside its model
    states, as the analytic peak counts them."""
    lay = Layout(pp=2, vpp=2 if schedule == "interleaved_1f1b" else 1)
    pol = get_policy("memo", 0.3)
    r = simulate(TOY, lay, 2, 4096, pol, A800, schedule=schedule, micro_batch=1, keep_timeline=False)
    assert r.ok
    costs = pipeline_costs(TOY, lay, 1, 4096, pol, A800)
    blocks = sum(b for _n, b in pol.pipeline_rank_blocks(costs.skeletal))
    for s, st in enumerate(r.pipeline["stages"]):
        assert st["peak_gpu_bytes"] >= blocks + costs.model_states[s], (s, st["peak_gpu_bytes"], blocks)
