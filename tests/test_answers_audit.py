"""[answers #30] What a new user's run of the issue's commands showed, kept fixed: a fixed --tp
is answered as asked (Megatron TP unless --tp-mode says otherwise), and an answer does not claim
a pipeline search that had no pipeline to search."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memo_sim.cli import cli

ASKED = ["whatif", "--seq", "1M", "--tp", "8", "--policy", "full_recompute", "--no-plan", "--jobs", "1"]


def test_tp8_is_answered_as_megatron_tp8():
    r = CliRunner().invoke(cli, ASKED + ["--json"])
    assert r.exit_code == 3, r.output  # Megatron TP8 with full recompute does not fit 1M tokens on 8 GPUs
    d = json.loads(r.stdout)
    assert d["candidates"] and all(c["layout_degrees"]["tp_mode"] == "megatron" and c["layout_degrees"]["tp"] == 8
                                   for c in d["candidates"])
    text = CliRunner().invoke(cli, ASKED)
    # the closest is Megatron TP 8 with SP (with the optimizer on the host, searched where nothing fits: one state
    # shard, so the distributed optimizer over one rank offloads it)
    assert text.output.startswith("answer: nothing fits") and "the closest, tp8+sp-optim-offload full_recompute" in (
        text.output)


def test_no_pipeline_to_search_is_said_so():
    text = CliRunner().invoke(cli, ASKED).output
    searched = next(ln for ln in text.splitlines() if ln.startswith("searched:"))
    assert "pipelines (searched by default): none valid with the degrees given" in searched
    assert "pp micro-batches per replica" not in text  # the batch is not split for a pipeline that is not there
