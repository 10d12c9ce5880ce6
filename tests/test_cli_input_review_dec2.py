"""memo-sim's refusals of bad input an audit found short of the rule (2026-12-02): one line, exit 2, naming the
option or field and the fix."""

import json

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from tests.cli_run import one_error_line
from tests.test_check_plan import TOY


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """test_check_plan's toy MEMO plan (its TOY what-if)."""
    out = tmp_path_factory.mktemp("toy")
    assert CliRunner().invoke(cli, TOY + ["--out", str(out)]).exit_code == 0
    return out / "plan.json"

def _refused(args) -> str:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    return one_error_line(r)


@pytest.mark.parametrize("args, says", [
    (["whatif", "--model", "gpt-7b", "--layers", "2", "--gpus", "2", "--seq", "2K", "--no-plan", "--policy", "memo",
      "--alpha", "nan"], "'--alpha': 'nan' is not a number"),
    (["memplan", "--model", "gpt-7b", "--layers", "2", "--seq", "2K", "--time-limit", "nan"],
     "'--time-limit': 'nan' is not a number"),
])
def test_nan_is_refused_by_the_option(args, says):
    assert says in _refused(args)


@pytest.mark.parametrize("cmd, flag, value, says", [
    ("sweep-alpha", "--alphas", "0.1,", "an empty item between commas"),
    ("sweep-alpha", "--alphas", "", "--alphas: empty"),
    ("sweep-seq", "--seqs", "2K,", "an empty item between commas"),
    ("sweep-seq", "--seqs", "", "--seqs: empty"),
])
def test_the_sweeps_lists_follow_one_rule(toy, tmp_path, cmd, flag, value, says):
    assert says in _refused([cmd, str(toy), "--out", str(tmp_path / "o"), flag, value])
    assert not (tmp_path / "o").exists()


def test_a_profile_file_of_a_list_and_a_whole_input_check_name_no_internals(tmp_path):
    (tmp_path / "p.yaml").write_text("[]\n")
    line = _refused(["whatif", "--model", "gpt-7b", "--layers", "2", "--gpus", "1", "--seq", "2K", "--no-plan",
                     "--profile", str(tmp_path / "p.yaml")])
    assert "must be a mapping of fields, got a list" in line and "_ProfileIn" not in line
    (tmp_path / "m.json").write_text(json.dumps({"name": "m", "layers": 2, "hidden": 250, "heads": 8, "ffn": 1024}))
    line = _refused(["whatif", "--model", str(tmp_path / "m.json"), "--gpus", "1", "--seq", "2K", "--no-plan"])
    assert "hidden (250) must be divisible by heads (8)" in line and "(top)" not in line


def test_a_config_json_missing_a_field_says_to_add_it(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_hidden_layers": 2,
           "vocab_size": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    line = _refused(["whatif", "--model", str(tmp_path / "config.json"), "--gpus", "1", "--seq", "2K", "--no-plan"])
    assert "intermediate_size: missing; add it" in line


def test_plot_of_a_plan_says_what_to_plot(toy, tmp_path):
    line = _refused(["plot", str(toy), "--out", str(tmp_path / "o")])
    assert "this is a plan" in line and "timeline.json" in line


@pytest.mark.parametrize("cmd", [["explain"], ["simulate", "--out", "SIM"], ["sweep-alpha", "--out", "SIM"],
                                 ["export", "--to", "megatron", "--out", "SIM"]])
def test_an_unknown_profile_in_a_plan_names_the_plan_and_its_field(toy, tmp_path, cmd):
    d = json.loads(toy.read_text())
    d["profile"] = "h300"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    args = [cmd[0], str(f)] + [str(tmp_path / "o") if a == "SIM" else a for a in cmd[1:]]
    line = _refused(args)
    assert f"{f}: profile: profile 'h300' not found" in line, line
    assert ("--profile NAME" in line) == (cmd[0] in ("simulate", "sweep-alpha"))


def test_an_unknown_profile_option_names_the_option(toy, tmp_path):
    line = _refused(["simulate", str(toy), "--out", str(tmp_path / "o"), "--profile", "h300"])
    assert line.startswith("error: --profile: profile 'h300' not found")
