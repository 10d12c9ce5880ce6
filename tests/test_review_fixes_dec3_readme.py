"""Fixes from a review of the README's commands (2026-12-03): check-plan's stored peak beside a re-simulation that
runs out of memory, a single-stage refusal the pipelines' reason hid, and the fix named in a missing or broken file's
one line."""

from __future__ import annotations

import json

from memo_sim.errors import MemoError
from memo_sim.fileio import read_json
from memo_sim.model.config import model_from_file
from tests.cli_run import one_error_line, run_sim


def test_check_plan_names_the_stored_peak_when_the_resimulation_runs_out_of_memory(tmp_path):
    """A plan edited from full recompute to store all: the re-simulation ends OOM, and the stored peak (the full
    recompute plan's) was printed as 'predicted peak GPU' under that line."""
    run_sim(["whatif", "--model", "gpt-7b", "--gpus", 1, "--seq", "64K", "--profile", "a800-80gb", "--policy",
             "full_recompute", "--out", tmp_path])
    d = json.loads((tmp_path / "plan.json").read_text())
    d["policy"] = {"policy": "store_all", "alpha": None}
    (tmp_path / "edited.json").write_text(json.dumps(d))
    out = run_sim(["check-plan", tmp_path / "edited.json"], code=3).output
    assert "re-simulated now OOM" in out
    line = next(ln for ln in out.splitlines() if "peak GPU" in ln and "GiB" in ln)
    assert line.strip().startswith("stored predicted peak GPU") and "the re-simulation now ends OOM" in line, line
    assert "\n  predicted peak GPU" not in out


def test_the_single_stage_reason_of_the_degrees_asked_for_is_the_answer():
    """--ep 256 --moe-dispatcher deepep on 256 GPUs without --pp: DeepEP's rank cap refuses the layout asked for; the
    pipelines searched by default were refused for another reason ('must divide the 128 GPUs of a pipeline stage'),
    which was the answer."""
    line = one_error_line(run_sim(["whatif", "--model", "deepseek-v3", "--gpus", 256, "--seq", "4K", "--ep", 256,
                                   "--moe-dispatcher", "deepep", "--profile", "h100-sxm5-80gb", "--no-plan"], code=2))
    assert "at most 160 ranks" in line and "pipeline stage" not in line, line


def test_a_missing_or_broken_file_names_the_fix(tmp_path):
    try:
        model_from_file(tmp_path / "missing.yaml")
    except MemoError as e:
        assert "no such model file; give a preset name" in str(e)
    else:
        raise AssertionError("no refusal")
    bad = tmp_path / "plan.json"
    bad.write_text("{")
    for path, words in ((tmp_path / "none.json", "no such file; check the path"), (bad, "; fix the file")):
        try:
            read_json(path)
        except MemoError as e:
            assert words in str(e) and "\n" not in str(e), str(e)
        else:
            raise AssertionError("no refusal")
