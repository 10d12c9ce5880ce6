"""Review fixes of 2026-12-03 (an audit of memo-exec against the plans memo-sim writes): a hand-edited plan whose
pipeline split no longer holds is refused with the layout's line, naming the plan fields, before its memory plan
(placed for that split) is checked; a MEMO plan's stage trace raised the split's error without the file or field."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.plan.schema import read_plan
from memo_sim.search.plan_check import runnable_problems

TINY = ["--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32", "--seq", "512",
        "--jobs", "1"]


def test_an_edited_uneven_memo_pipeline_is_refused_by_its_layout_line(tmp_path):
    out = tmp_path / "plan"
    r = CliRunner().invoke(cli, ["whatif", *TINY, "--layers", "5", "--pp", "2", "--decoder-first-pipeline-num-layers",
                                 "2", "--schedule", "1f1b", "--policy", "memo", "--alpha", "0.5", "--gpus", "2",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output[-800:]
    d = json.loads((out / "plan.json").read_text())
    assert d["layout"]["first_stage_layers"] == 2 and d.get("memory_plan")
    d["layout"]["first_stage_layers"] = 0
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    problems = runnable_problems(read_plan(edited))
    assert problems and problems[0].startswith("layout: 5 layers do not split evenly into 2 pipeline stages")
    assert "layout.first_stage_layers" in problems[0]
