"""What the runner-up gives up: the same words in the what-if's table answer, its --json answer
(``runner_up``), the plan.json it writes (``predicted.runner_up``) and `memo-sim explain` of that
plan; a plan without it (older, or hand-written) explains without it, a malformed one is refused
in one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--gpus", "1", "--jobs", "1"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    text = CliRunner().invoke(cli, TOY + ["--out", str(out)])
    assert text.exit_code == 0, text.output
    js = CliRunner().invoke(cli, TOY + ["--no-plan", "--json"])
    assert js.exit_code == 0, js.output
    return out / "plan.json", text.output, json.loads(js.output)


def test_the_runner_up_is_in_the_table_the_json_and_the_plan(toy):
    plan, text, answer = toy
    up = answer["runner_up"]
    assert up is not None and up["rank"] >= 2 and up["words"].startswith(f"runner-up #{up['rank']} {up['label']}")
    assert up["words"] in text  # the table answer prints the same words
    ranked = answer["candidates"][up["rank"] - 1]
    assert ranked["peak"]["bytes"] == pytest.approx(up["peak_gpu_bytes"], rel=1e-12)
    best = next(c for c in answer["candidates"] if c["status"] == "OK")
    assert up["throughput_given_up_fraction"] == pytest.approx(
        1 - up["tgs_tokens_per_gpu_s"] / best["simulated_tgs_tokens_per_gpu_s"], rel=1e-9)
    assert json.loads(plan.read_text())["predicted"]["runner_up"] == up


def test_explain_shows_the_runner_up_the_plan_carries(toy):
    plan, _text, answer = toy
    r = CliRunner().invoke(cli, ["explain", str(plan)])
    assert r.exit_code == 0, r.output
    assert answer["runner_up"]["words"] in r.output
    d = json.loads(CliRunner().invoke(cli, ["explain", str(plan), "--json"]).output)
    assert d["runner_up"] == answer["runner_up"]


def test_a_plan_without_a_runner_up_explains_without_one(toy, tmp_path):
    plan, _text, _answer = toy
    d = json.loads(plan.read_text())
    del d["predicted"]["runner_up"]  # a plan written before the field existed
    f = tmp_path / "old.json"
    f.write_text(json.dumps(d))
    r = CliRunner().invoke(cli, ["explain", str(f)])
    assert r.exit_code == 0 and "runner-up" not in r.output, r.output


def test_a_malformed_runner_up_is_refused_in_one_line(toy, tmp_path):
    plan, _text, _answer = toy
    d = json.loads(plan.read_text())
    d["predicted"]["runner_up"]["rank"] = "second"
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))
    r = CliRunner().invoke(cli, ["check-plan", str(f)])
    assert r.exit_code == 2 and "runner_up" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
