"""The analytic tier's estimate of a single stage keeps the data-parallel stream's own time (a review: FSDP's fp32
reduce-scatters outlasting the backward were counted as hidden, the estimate half the simulated step)."""

from __future__ import annotations

import json
from dataclasses import replace

from click.testing import CliRunner

from memo_sim.cli import cli


def test_fsdp_estimate_counts_the_data_parallel_stream():
    args = ["whatif", "--model", "llama-3.1-8b", "--gpus", "64", "--seq", "4K", "--tp", "1", "--dp", "64",
            "--zero", "3", "--dp-mode", "fsdp", "--profile", "h100-sxm5-80gb", "--framework", "torchtitan",
            "--simulate-top", "all", "--jobs", "1", "--no-plan", "--policy", "store_all", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    rows = {r["layout"]: r for r in json.loads(res.output)["candidates"]}
    slow = [r for lab, r in rows.items() if lab.endswith("-fsdp")]  # resharded after the forward, 64-way
    assert slow, sorted(rows)
    for r in rows.values():  # the estimate is perfect overlap, never below the stream's work the simulator runs
        assert r["analytic_iteration_s"] >= 0.9 * r["simulated_iteration_s"], r["layout"]


def test_an_analytic_runner_up_above_a_simulated_answer_is_not_a_negative_loss(monkeypatch):
    """A review: 'gives up -12.8% of the throughput' where the runner-up was an analytic row (perfect overlap)
    ranked below the simulated answer."""
    from types import SimpleNamespace

    from memo_sim.report import whatif_answer

    peak = SimpleNamespace(bytes=1 << 30, source="analytic", text=lambda: "1.00 GiB (analytic)")
    monkeypatch.setattr(whatif_answer, "candidate_peak", lambda c: peak)
    named = SimpleNamespace(label=lambda: "x")
    best = SimpleNamespace(status="OK", tgs=700.0, simulated={"iteration_s": 1.0}, layout=named, policy=named)
    up = SimpleNamespace(status="OK", tgs=789.0, simulated=None, estimate=SimpleNamespace(iteration_s=0.9),
                         layout=named, policy=named, sppo=None)
    words = whatif_answer.runner_up([best, up], best)["words"]
    assert "gives up -" not in words and "12.7% more throughput on the analytic tier" in words, words


def test_the_gap_split_never_prices_a_layout_the_framework_cannot_run():
    """A review: memo's best (Ulysses 2 beside TP 8) adapted to Megatron's mechanisms splits Llama-3.1-405B's 8 K/V
    heads whole over 16 ranks, which Megatron refuses; the split priced it at 1.03x all the same."""
    from types import SimpleNamespace

    from memo_sim.layout.parallel import Layout
    from memo_sim.model.config import get_model
    from memo_sim.profile.loader import load_profile
    from memo_sim.report.whatif_answer import gap_line
    from memo_sim.search.frameworks import get_framework
    from memo_sim.search.request import framework_runs_why_not

    fw, prof = get_framework("megatron"), load_profile("h100-sxm5-80gb")
    mine = Layout(tp=8, sp=True, ulysses=2, pp=16, vpp=4, dp=2, zero=1, account_embedding_loss=True)
    best = SimpleNamespace(model=get_model("llama-3.1-405b"), micro_batch=1, tgs=138.0, layout=mine)
    req = SimpleNamespace(gpus=512, profile=prof, seq=8192)
    why = framework_runs_why_not(fw, fw.adapt(mine, prof), best, req)
    assert "not divisible by tp x ulysses" in why, why
    ok = replace(mine, ulysses=1, dp=4)
    assert framework_runs_why_not(fw, fw.adapt(ok, prof), replace_ns(best, layout=ok), req) is None
    words = gap_line("megatron", SimpleNamespace(tgs=134.0), best, {"not_runnable": why, "layout_label": "x"})
    assert "is not one megatron runs (kv heads (8)" in words and "runs 138" not in words, words


def replace_ns(ns, **kw):
    from types import SimpleNamespace

    return SimpleNamespace(**{**vars(ns), **kw})


def test_the_tier_two_line_names_no_skipped_bound_where_none_was_skipped():
    """A review: '0 skipped by a proved bound; the closest skipped bound is 9.9% below' (the skipped plans were all
    simulated since, for the verdict lines)."""
    from memo_sim.search.prune import SIMULATE_BOUND, PruneReport

    r = PruneReport(SIMULATE_BOUND, 10, 10, 0, margin=0.099, best_tgs=100.0, for_verdicts=3)
    assert "closest" not in r.line() and "0 skipped by a proved bound" in r.line()
    r.add_not_built({"candidates": 4, "families": 2, "best_bound_tgs": 95.0})
    assert "the closest bound of a pipeline family left unbuilt is 5.0% below" in r.line(), r.line()
    assert "the closest skipped bound is 1.0%" in PruneReport(SIMULATE_BOUND, 10, 5, 5, margin=0.01,
                                                              best_tgs=1.0).line()
