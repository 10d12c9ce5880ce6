"""A review of the simulator's commands (2026-12-01, second round): the fixed pipeline split's verdict when the hand
split is faster or the best plan has no pipeline, --dp-mode fsdp searching FSDP layouts only, --subseqs past one
token per rank refused and a large fixed N announced, memplan refusing SPPO, export and explain refusing a plan's
unknown framework as check-plan does, --no-plan beside --out refused, Gemma-3's wrapper named as refused."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from memo_sim.api import get_model
from memo_sim.cli.whatif import _refuse_zero0_fsdp, _warn_long_sppo_simulation
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import enumerate_layouts
from memo_sim.model import hf_config
from memo_sim.search.request import split_words
from memo_sim.search.sppo import MAX_SUBSEQS
from tests.cli_run import one_line, run_sim

TOY_FLAGS = ["--layers", "2", "--hidden", "256", "--heads", "8", "--ffn", "1024", "--vocab", "1024"]


_run, _one_line = run_sim, one_line  # tests/cli_run.py


def _cand(tgs: float, pp: int, label: str = "tp2+sp-pp4"):
    lay = SimpleNamespace(pp=pp, label=lambda: label)
    return SimpleNamespace(tgs=tgs, tier="simulated", layout=lay, policy=SimpleNamespace(label=lambda: "store_all"))


# ---- 1: the fixed split's verdict ----------------------------------------------------------------------------------

def test_split_words_says_a_faster_fixed_split_is_faster_and_nothing_without_a_pipeline():
    """A review: a hand split 9% faster than the search's own read 'as fast as ... 0.917x', and a single-stage
    answer (the split flags without --pp) read 'as fast as ... 1.000x'."""
    faster = split_words(_cand(19845, 4), _cand(18198, 4))
    assert "faster" in faster and "as fast as" not in faster and "0.917x" in faster and "9.1%" in faster
    assert split_words(_cand(100, 1, "tp8"), _cand(100, 1, "tp8")) == ""
    assert "as fast as" in split_words(_cand(100, 4), _cand(100.2, 4))
    assert "costs" in split_words(_cand(90, 4), _cand(100, 4))


# ---- 2: --dp-mode fsdp searches FSDP layouts -----------------------------------------------------------------------

def test_fsdp_alone_enumerates_no_ddp_replicas_unless_the_framework_runs_them_as_fsdp():
    """ZeRO 0 over replicas is DDP unless the framework runs it as FSDP2 over a shard group of one (torchtitan's
    replicate_fsdp); a layout with nothing to shard (no DP, CP or Ulysses group) is kept as it is."""
    m = get_model("llama-3.1-8b")
    valid, _ = enumerate_layouts(m, 8, 8, 8192, dp_modes=("fsdp",), replicate_fsdp=False)
    assert valid and all(lay.dp_mode == "fsdp" or lay.state_shards == 1 for lay in valid)
    assert any(lay.state_shards == 1 and lay.zero == 0 for lay in valid)  # tp8: nothing to shard, kept
    kept, _ = enumerate_layouts(m, 8, 8, 8192, dp_modes=("fsdp",))  # torchtitan's: its ZeRO 0 is FSDP2's
    assert any(lay.zero == 0 and lay.state_shards > 1 for lay in kept)


def test_fsdp_with_zero0_is_refused_in_one_line_unless_the_framework_runs_replicate_fsdp():
    r = _run(["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile", "b200-180gb", "--tp",
              "1", "--pp", "1", "--policy", "store_all", "--dp-mode", "fsdp", "--zero", "0", "--no-plan"], 2)
    line = _one_line(r)
    assert "--zero 0" in line and "--dp-mode fsdp" in line and "torchtitan" in line and "replicate_fsdp" in line
    _refuse_zero0_fsdp(SimpleNamespace(dp_mode="fsdp", zero=0, framework="torchtitan"))  # what it means there


# ---- 3: --subseqs -------------------------------------------------------------------------------------------------

def test_subseqs_past_one_token_per_rank_is_refused_naming_the_largest_n():
    r = _run(["whatif", "--model", "gpt-7b", "--gpus", "8", "--seq", "64K", "--tp", "2", "--pp", "4", "--policy",
              "sppo", "--subseqs", "40000", "--no-plan"], 2)
    line = _one_line(r)
    assert "--subseqs 40000" in line and "32,768" in line and "no valid layout" not in line


def test_a_fixed_n_past_the_search_grid_is_announced_before_the_search(capsys):
    """A review: --subseqs 32768 ran minutes without a word (tier 2 simulates every piece of every subsequence)."""
    req = SimpleNamespace(subseqs=MAX_SUBSEQS * 64, simulate_top="bound", seq=1 << 20, tp=2)
    _warn_long_sppo_simulation(req)
    err = capsys.readouterr().err
    assert f"--subseqs {MAX_SUBSEQS * 64:,}" in err and "--simulate-top 0" in err
    _warn_long_sppo_simulation(SimpleNamespace(subseqs=MAX_SUBSEQS, simulate_top="bound", seq=1 << 20, tp=2))
    _warn_long_sppo_simulation(SimpleNamespace(subseqs=MAX_SUBSEQS * 64, simulate_top=0, seq=1 << 20, tp=2))
    assert capsys.readouterr().err == ""


# ---- 4: memplan refuses SPPO --------------------------------------------------------------------------------------

def test_memplan_refuses_sppo_in_one_line():
    r = _run(["memplan", *TOY_FLAGS, "--seq", "16K", "--tp", "8", "--policy", "sppo"], 2)
    line = _one_line(r)
    assert "--policy sppo" in line and "static memory plan" in line


# ---- 5: export and explain refuse an unknown framework ------------------------------------------------------------

@pytest.fixture(scope="module")
def bogus_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    _run(["whatif", *TOY_FLAGS, "--gpus", "1", "--seq", "4K", "--policy", "store_all", "--simulate-top", "0",
          "--out", out])
    plan = json.loads((out / "plan.json").read_text())
    plan["framework"] = "megatron@2099"
    path = out / "bogus.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("cmd", [["explain"], ["export", "--to", "megatron", "--no-price"]])
def test_export_and_explain_refuse_an_unknown_framework_as_check_plan_does(bogus_plan, tmp_path, cmd):
    args = [cmd[0], bogus_plan, *cmd[1:]] + (["--out", tmp_path / "x"] if cmd[0] == "export" else [])
    line = _one_line(_run(args, 2))
    assert "framework: 'megatron@2099' is not a framework memo knows" in line


# ---- 6: --no-plan beside --out ------------------------------------------------------------------------------------

def test_no_plan_with_out_is_refused(tmp_path):
    r = _run(["whatif", *TOY_FLAGS, "--gpus", "1", "--seq", "4K", "--no-plan", "--out", tmp_path / "foo"], 2)
    line = _one_line(r)
    assert "--out" in line and "--no-plan" in line
    assert not (tmp_path / "foo").exists()


# ---- 7: Gemma-3's wrapper ----------------------------------------------------------------------------------------

def test_gemma3_wrapper_is_refused_and_the_docstrings_say_so():
    raw = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}, "vision_config": {}}
    with pytest.raises(MemoError, match="text_config.model_type"):
        hf_config.language_model(raw)
    for doc in (hf_config.__doc__, hf_config.language_model.__doc__):
        assert "Gemma-3) is read" not in doc and "Llama-4, Gemma-3:" not in doc and "gemma3_text" in doc
