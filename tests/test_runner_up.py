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
    assert up["peak_source"] == f"{ranked['peak']['tier']}, {ranked['peak']['allocator']}"
    best = next(c for c in answer["candidates"] if c["status"] == "OK")
    assert up["throughput_given_up_fraction"] == pytest.approx(
        1 - up["tgs_tokens_per_gpu_s"] / best["simulated_tgs_tokens_per_gpu_s"], rel=1e-9)
    assert up["iteration_s"] > 0


def test_no_runner_up_when_one_plan_fits():
    r = CliRunner().invoke(cli, TOY + ["--policy", "memo", "--alpha", "0.3", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["runner_up"] is None
