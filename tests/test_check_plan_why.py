"""memo-sim check-plan says what binds and what fills memory at the peak with the words and
numbers of `memo-sim simulate` and `memo-sim explain` (one code path, `memo_sim.cli.explain`)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli

TOY = ["whatif", "--layers", "4", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024", "--seq", "2K",
       "--jobs", "1", "--simulate-top", "1"]


def _line(output: str, start: str) -> str:
    return next(ln.strip() for ln in output.splitlines() if ln.strip().startswith(start))


@pytest.mark.parametrize("extra", [("--gpus", "1", "--policy", "memo", "--alpha", "0.3"),
                                   ("--gpus", "2", "--pp", "2", "--schedule", "1f1b", "--policy", "full_recompute")],
                         ids=["memo", "1f1b"])
def test_check_plan_prints_the_binding_line_and_memory_of_simulate_and_explain(tmp_path, extra):
    out = tmp_path / "p"
    r = CliRunner().invoke(cli, TOY + list(extra) + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = str(out / "plan.json")
    check = CliRunner().invoke(cli, ["check-plan", plan])
    sim = CliRunner().invoke(cli, ["simulate", plan, "--out", str(tmp_path / "sim")])
    explain = CliRunner().invoke(cli, ["explain", plan])
    for r in (check, sim, explain):
        assert r.exit_code == 0, r.output
    binding = _line(check.output, "binding:")
    assert binding == _line(explain.output, "binding:")
    assert _line(sim.output, "binding:").startswith(binding)
    assert re.search(r"GPU 0 peaks at .* during", check.output)
    assert "pinned host memory per node" in check.output
    if "--pp" in extra:
        assert "GPU memory per stage" in check.output
    else:
        for row in ("model states", "kept activations", "layer transients", "peak (the terms above)"):
            assert _line(check.output, row) == _line(explain.output, row)


def test_check_plan_json_is_explains_memory_and_binding(tmp_path):
    out = tmp_path / "p"
    r = CliRunner().invoke(cli, TOY + ["--gpus", "1", "--policy", "full_offload", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = str(out / "plan.json")
    import json

    check = json.loads(CliRunner().invoke(cli, ["check-plan", plan, "--format", "json"]).output)
    explain = json.loads(CliRunner().invoke(cli, ["explain", plan, "--json"]).output)
    assert check["valid"] is True and check["binding"] == explain["binding"]
    for key in ("memory_terms_bytes", "analytic_peak_gpu_bytes", "simulated_peak_gpu_bytes", "peak",
                "host_bytes_per_node"):
        assert check[key] == explain[key], key
    md = CliRunner().invoke(cli, ["check-plan", plan, "--format", "md"])
    assert md.exit_code == 0 and md.output.startswith(f"**{plan}: valid") and "| model states |" in md.output


def test_a_plan_folder_moved_with_its_profile_file_finds_the_profile_beside_it(tmp_path):
    """A plan records a profile file by its absolute path; copied with the file to another folder (another
    machine) every command said 'no such profile file'. The copy beside the plan is used now; without it the
    line says where to put the file."""
    import shutil

    prof = tmp_path / "orig" / "my-h100.yaml"
    prof.parent.mkdir()
    shutil.copy("hardware_profiles/h100-sxm5-80gb.yaml", prof)
    out = tmp_path / "p"
    r = CliRunner().invoke(cli, TOY + ["--gpus", "1", "--profile", str(prof), "--out", str(out)])
    assert r.exit_code == 0, r.output
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(out / "plan.json", moved / "plan.json")
    shutil.copy(prof, moved / "my-h100.yaml")
    shutil.rmtree(prof.parent)
    r = CliRunner().invoke(cli, ["check-plan", str(moved / "plan.json")])
    assert r.exit_code == 0 and "valid" in r.output, r.output
    (moved / "my-h100.yaml").unlink()
    r = CliRunner().invoke(cli, ["check-plan", str(moved / "plan.json")])
    assert r.exit_code == 2 and "no such profile file" in r.output and "beside the plan" in r.output, r.output
