"""What the runner-up gives up: the same words in the what-if's table answer and its --json
answer (``runner_up``: its rank, label, tier, iteration time, throughput given up and peak with
the peak's source); none when nothing else fits."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--gpus", "1", "--jobs", "1", "--no-plan"]


def test_the_runner_up_is_in_the_table_and_the_json():
    text = CliRunner().invoke(cli, TOY)
    assert text.exit_code == 0, text.output
    js = CliRunner().invoke(cli, TOY + ["--json"])
    assert js.exit_code == 0, js.output
    answer = json.loads(js.output)
    up = answer["runner_up"]
    assert up is not None and up["rank"] >= 2 and up["words"].startswith(f"runner-up #{up['rank']} {up['label']}")
    assert up["words"] in text.output  # the table answer prints the same words
    ranked = answer["candidates"][up["rank"] - 1]
    assert f"{ranked['layout']} " in up["label"] + " " and ranked["status"] == "OK"
    assert ranked["peak"]["bytes"] == pytest.approx(up["peak_gpu_bytes"], rel=1e-12)
    from memo_sim.report.peaks import Peak

    assert up["peak_source"] == Peak(**ranked["peak"]).source  # the same peak, its words from its fields (a pipeline
    # row never replayed through the caching allocator says so: "replayed": false)
    best = next(c for c in answer["candidates"] if c["status"] == "OK")
    assert up["throughput_given_up_fraction"] == pytest.approx(
        1 - up["tgs_tokens_per_gpu_s"] / best["simulated_tgs_tokens_per_gpu_s"], rel=1e-9)
    assert up["iteration_s"] > 0


def test_no_runner_up_when_one_plan_fits():
    r = CliRunner().invoke(cli, TOY + ["--policy", "memo", "--alpha", "0.3", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["runner_up"] is None


def test_a_runner_up_as_fast_as_the_best_gives_up_none_not_minus_zero():
    """A review read 'gives up -0.0% of the throughput' for a runner-up as fast as the best to the printed digit."""
    from types import SimpleNamespace

    from memo_sim.report.whatif_answer import runner_up

    def cand(tgs, peak):
        lay = SimpleNamespace(label=lambda: "l")
        return SimpleNamespace(status="OK", tgs=tgs, simulated=None, layout=lay,
                               policy=SimpleNamespace(label=lambda: "p"), estimate=SimpleNamespace(iteration_s=1.0),
                               peak_gpu_bytes=peak, memory=None)

    best, up = cand(202.0, 1e9), cand(202.00001, 2e9)
    from memo_sim.report import whatif_answer

    real = whatif_answer.candidate_peak
    whatif_answer.candidate_peak = lambda c: SimpleNamespace(bytes=c.peak_gpu_bytes, source="analytic",
                                                             text=lambda: "x")
    try:
        words = runner_up([best, up], best)["words"]
    finally:
        whatif_answer.candidate_peak = real
    assert "gives up none of the throughput (to 0.1%)" in words and "-0.0%" not in words, words


# 1.25M until 2026-12-01, when memo-exec's Ulysses backward and embedding / head gradient unit were priced and the
# case stopped fitting at all; at 1.0625M the same held (a CP plan answers, tp2 x Ulysses 4 faster with the flag)
# until 2026-12-02, when the ring's fp32 dQ accumulator and the re-sending Ulysses' buffers of memo's own framework
# data were priced (memo_sim/memplan/trace_gen.py ``attention_buffers``) and nothing fit there; at 1M the same holds
# (tp2+metp_ffn-cp4-z3 answers at 252 tokens/GPU/s, tp2 x Ulysses 4 at 415 with the flag)
EXPANDABLE = ["whatif", "--model", "llama-3.1-8b", "--profile", "h100-sxm5-80gb", "--gpus", "8", "--seq", "1M",
              "--policy", "full_recompute", "--jobs", "1", "--no-plan"]


def test_a_fitting_answer_names_the_faster_plan_expandable_segments_would_fit():
    """At 1.25M tokens on 8 H100s the best full-recompute plan rings the sequence over CP 2 at 202 tokens/GPU/s while
    tp2 x Ulysses 4 (335 analytic) ran out of memory on the caching allocator's fragmentation alone; the answer named
    PyTorch's one-flag fix only when nothing fit (a review)."""
    r = CliRunner().invoke(cli, EXPANDABLE + ["--json"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    x = answer["faster_with_expandable_segments"]
    assert x is not None and x["flag"] == "--alloc-conf expandable_segments:True" and "-expandable" in x["label"]
    assert x["tgs_tokens_per_gpu_s"] > 1.2 * x["best_analytic_tgs_tokens_per_gpu_s"]
    asked = x["label"].replace("-expandable", "").split()[0]  # the same layout without the flag: OOM in the ranking
    assert [c["status"] for c in answer["candidates"] if c["layout"] == asked][:1] == ["OOM"], x["label"]
    text = CliRunner().invoke(cli, EXPANDABLE)
    assert x["words"] in text.output
    # asked with the flag, nothing to add
    on = CliRunner().invoke(cli, EXPANDABLE + ["--alloc-conf", "expandable_segments:True", "--json"])
    assert on.exit_code == 0, on.output
    assert json.loads(on.output)["faster_with_expandable_segments"] is None
