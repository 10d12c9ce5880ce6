"""`memo_sim.api` refuses bad input as the command line does: one `MemoError` naming the argument or the request's
field and the fix, never a Python exception from deep inside (a review, 2026-12-02): `estimate_iteration` priced
seq=0, a layout `check_layout` refuses (tp 3 of 32 heads) and ended tp=0 in ZeroDivisionError; `WhatifRequest` took
2**31 tokens; read_plan / write_plan of a folder, write_plan of a dict, simulate of a policy or profile name and
get_model(None) raised IsADirectoryError, AttributeError or TypeError; a model file's path was refused as a request's
model; the what-if's errors named the command's options (--tp, --schedule) where a program set the request's fields."""

from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim import api
from memo_sim.errors import MemoError, PlanError
from memo_sim.search import estimate as estimate_module
from memo_sim.search.request import BOOL_FLAGS, FIELD_FLAGS, in_request_words
from memo_sim.units import MAX_TOKENS
from tests.cli_run import one_error

TOY = replace(api.get_model("gpt-7b"), layers=2)
A800 = api.load_profile("a800-80gb")
STORE = api.get_policy("store_all")
MEMO = api.get_policy("memo", 0.5)


# -- 1. estimate_iteration ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch, seq", [(1, 0), (0, 4096), (1, -1), (True, 4096), (1, "4K"), (1, 4096.0),
                                        (1, MAX_TOKENS + 1)])
def test_estimate_iteration_refuses_a_batch_or_seq_that_is_not_a_positive_count(batch, seq):
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(tp=8), batch, seq, MEMO, A800))
    assert "estimate_iteration" in text and ("seq" in text or "batch" in text), text


def test_estimate_iteration_refuses_a_layout_check_layout_refuses():
    why = api.check_layout(api.Layout(tp=3), TOY, 3, A800.node_gpus, 4096)
    assert why  # 32 heads over tp 3
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(tp=3), 1, 4096, MEMO, A800))
    assert text.startswith("estimate_iteration: layout tp3") and why in text, text
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(tp=12), 1, 4096, STORE, A800))
    # wider than the profile's 8-GPU node and not whole nodes (TP 16, two whole nodes, is priced)
    assert text.startswith("estimate_iteration: layout tp12") and "must divide the 8 GPUs" in text, text


@pytest.mark.parametrize("degree", ["tp", "cp", "ulysses", "dp", "pp", "vpp", "ep", "etp"])
@pytest.mark.parametrize("value", [0, -2, 2.0, "2", True])
def test_estimate_iteration_refuses_degrees_that_are_not_whole_numbers_of_at_least_one(degree, value):
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(**{degree: value}), 1, 4096, STORE, A800))
    assert text.startswith(f"estimate_iteration: layout.{degree} = "), text


def test_estimate_iteration_refuses_what_the_single_stage_does_not_price():
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(pp=2), 2, 4096, STORE, A800))
    assert "estimate_pipeline" in text, text
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(tp=8), 3, 4096, STORE, A800, micro_batch=2))
    assert "micro_batch = 2 does not divide batch = 3" in text, text
    text = one_error(lambda: api.estimate_iteration(TOY, api.Layout(tp=8), 1, 4096, "memo", A800))
    assert "get_policy('memo', alpha)" in text, text
    for bad in (None, 3, object()):
        for i, name in ((0, "model"), (1, "layout"), (4, "policy"), (5, "profile")):
            args = [TOY, api.Layout(tp=8), 1, 4096, STORE, A800]
            args[i] = bad
            text = one_error(lambda: api.estimate_iteration(*args))
            assert text.startswith(f"estimate_iteration: {name} = "), text


def test_estimate_iteration_prices_a_good_call_as_the_searchs_estimate_does():
    lay = api.Layout(tp=8)
    want = estimate_module.estimate_iteration(TOY, lay, 2, 4096, STORE, A800, micro_batch=1)
    assert api.estimate_iteration(TOY, lay, 2, 4096, STORE, A800, micro_batch=1) == want
    assert api.estimate_iteration(TOY, lay, 2, 4096, "store_all", "a800-80gb", micro_batch=1) == want  # by name
    # the checks are the API's: the search calls the estimate itself, unchecked, thousands of times
    from memo_sim.search import whatif

    assert api.estimate_iteration is not estimate_module.estimate_iteration
    assert whatif.estimate_iteration is estimate_module.estimate_iteration


# -- 2. the request's token cap ---------------------------------------------------------------------------------------

def test_a_request_of_more_tokens_than_the_command_takes_is_refused():
    for seq in (2**31, MAX_TOKENS + 1):
        text = one_error(lambda: api.WhatifRequest(model=TOY, seq=seq, gpus=8, profile=A800))
        assert text.startswith("WhatifRequest.seq = ") and "1024M" in text and "--" not in text, text
    assert api.WhatifRequest(model=TOY, seq=MAX_TOKENS, gpus=8, profile=A800).seq == MAX_TOKENS
    assert api.WhatifRequest(model=TOY, seq="1G", gpus=8, profile=A800).seq == MAX_TOKENS


# -- 3. plans, simulate and get_model ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan():
    ans = api.whatif(api.WhatifRequest(model=TOY, seq=4096, gpus=1, profile=A800, policies="store_all",
                                       simulate_top=1))
    return ans.best.to_plan()


def test_read_plan_and_write_plan_refuse_a_folder_and_a_plan_that_is_not_one(plan, tmp_path):
    text = one_error(lambda: api.read_plan(tmp_path))
    assert "a folder, not a plan file" in text, text
    api.write_plan(plan, tmp_path / "plan.json")
    with pytest.raises(PlanError, match=re.escape(f"give {tmp_path / 'plan.json'}")):
        api.read_plan(tmp_path)  # the plan.json inside is named
    before = sorted(tmp_path.iterdir())
    text = one_error(lambda: api.write_plan(plan, tmp_path))
    assert text.startswith("write_plan: path") and "is a folder" in text and "plan.json" in text, text
    text = one_error(lambda: api.write_plan({"a": 1}, tmp_path / "x.json"))
    assert text.startswith("write_plan: plan is a dict, not a Plan"), text
    for call in (lambda: api.write_plan(plan, None), lambda: api.read_plan(None), lambda: api.read_plan(3),
                 lambda: api.write_plan(plan, "")):
        assert "give a file's path" in one_error(call)
    assert sorted(tmp_path.iterdir()) == before  # nothing written by a refusal
    back = api.read_plan(str(tmp_path / "plan.json"))
    assert back.to_dict()["layout"] == plan.to_dict()["layout"]
    assert api.read_plan.__doc__ and api.write_plan.__doc__


def test_simulate_takes_a_policy_or_profile_by_name_or_refuses_in_one_line():
    lay = api.Layout(tp=8)
    want = api.simulate(TOY, lay, 1, 4096, STORE, A800, keep_timeline=False)
    got = api.simulate(TOY, lay, 1, 4096, "store_all", "a800-80gb", keep_timeline=False)
    assert got.iteration_s == want.iteration_s and got.peak_gpu_bytes == want.peak_gpu_bytes
    text = one_error(lambda: api.simulate(TOY, lay, 1, 4096, "memo", A800))
    assert text.startswith("simulate: policy = 'memo'") and "get_policy('memo', alpha)" in text, text
    assert "bogus' unknown" in one_error(lambda: api.simulate(TOY, lay, 1, 4096, "bogus", A800))
    assert "bogus-gpu" in one_error(lambda: api.simulate(TOY, lay, 1, 4096, STORE, "bogus-gpu"))
    for i, name in ((4, "policy"), (5, "profile"), (0, "model"), (1, "layout")):
        args = [TOY, lay, 1, 4096, STORE, A800]
        args[i] = 3
        assert one_error(lambda: api.simulate(*args)).startswith(f"simulate: {name} = 3: give ")
    assert one_error(lambda: api.simulate(TOY, lay, 1, 0, STORE, A800)).startswith("simulate: batch and seq")
    assert one_error(lambda: api.simulate(TOY, api.Layout(tp=0), 1, 4096, STORE, A800)).startswith(
        "simulate: layout.tp = 0")


@pytest.mark.parametrize("bad", [None, 3, "", "  ", b"gpt-7b"])
def test_get_model_refuses_what_is_not_a_name_or_path(bad):
    text = one_error(lambda: api.get_model(bad))
    assert "give a preset's name" in text and "model file's path" in text, text


def test_get_model_takes_a_path_object(tmp_path):
    f = tmp_path / "toy.json"
    f.write_text(json.dumps(TOY.to_dict()))
    assert api.get_model(f).layers == 2 == api.get_model(str(f)).layers
    with pytest.raises(MemoError, match="unknown"):
        api.get_model(Path("gpt-7bb"))  # a Path without a model file's suffix is a preset's name


# -- 4. a request's model by name or file ------------------------------------------------------------------------------

def test_a_request_takes_a_models_name_or_file(tmp_path):
    assert api.WhatifRequest(model="gpt-7b", seq=4096, gpus=8, profile=A800).model == api.get_model("gpt-7b")
    f = tmp_path / "toy.yaml"
    f.write_text(json.dumps(TOY.to_dict()))  # JSON is YAML
    for given in (f, str(f)):
        assert api.WhatifRequest(model=given, seq=4096, gpus=8, profile=A800).model.layers == 2
    text = one_error(lambda: api.WhatifRequest(model="gpt-7bb", seq=4096, gpus=8, profile=A800))
    assert text.startswith("WhatifRequest.model: model 'gpt-7bb' unknown") and "--" not in text, text
    assert "a ModelConfig" in text, text
    text = one_error(lambda: api.WhatifRequest(model=tmp_path / "none.yaml", seq=4096, gpus=8, profile=A800))
    assert text.startswith("WhatifRequest.model: ") and "no such model file" in text, text
    text = one_error(lambda: api.WhatifRequest(model=3, seq=4096, gpus=8, profile=A800))
    assert text.startswith("WhatifRequest.model = 3: give a ModelConfig") and "preset's name" in text, text
    text = one_error(lambda: api.WhatifRequest(model=TOY, seq=4096, gpus=8, profile="bogus-gpu"))
    assert text.startswith("WhatifRequest.profile: "), text


# -- 5. the what-if's errors in the request's words -------------------------------------------------------------------

@pytest.mark.parametrize("over, says", [
    (dict(tp=3), "WhatifRequest: tp=3 does not divide the 8 GPUs of gpus; pick a divisor of 8"),
    (dict(schedules="bogus"), "WhatifRequest: schedules='bogus' unknown"),
    (dict(framework="bogus"), "WhatifRequest: framework='bogus' unknown"),
    (dict(allocator="bogus"), "WhatifRequest: allocator must be one of"),
    (dict(dp_mode="bogus"), "WhatifRequest: dp_mode='bogus': "),
    (dict(rank_order="bogus"), "WhatifRequest: rank_order='bogus': "),
    (dict(tp_mode="bogus"), "WhatifRequest: tp_mode='bogus' unknown"),
])
def test_the_whatifs_refusals_name_the_requests_fields(over, says):
    req = api.WhatifRequest(**{**dict(model=TOY, seq=4096, gpus=8, profile=A800), **over})
    text = one_error(lambda: api.whatif(req))
    assert text.startswith(says), text
    assert not re.search(r"(?<![\w-])--(" + "|".join(re.escape(f[2:]) for f in FIELD_FLAGS.values()) + r")(?![\w-])",
                         text), text


def test_the_commands_own_refusals_keep_the_options_names():
    from memo_sim.cli import cli

    toy = ["--layers", "2", "--hidden", "256", "--heads", "4", "--ffn", "512", "--vocab", "512"]
    r = CliRunner().invoke(cli, ["whatif", *toy, "--seq", "4K", "--gpus", "8", "--tp", "3", "--no-plan"])
    assert r.exit_code == 2 and "--tp 3 does not divide the 8 GPUs of --gpus" in r.output, r.output
    r = CliRunner().invoke(cli, ["whatif", *toy, "--seq", "4K", "--gpus", "8", "--schedule", "bogus", "--no-plan"])
    assert r.exit_code == 2 and "WhatifRequest" not in r.output, r.output


def test_in_request_words_rewords_the_commands_options_alone():
    assert in_request_words("--no-sp needs --tp > 1") == "WhatifRequest: sp=False needs tp > 1"
    assert in_request_words("use --policy sppo (--framework memo-paper)") == \
        "WhatifRequest: use policies='sppo' (framework='memo-paper')"
    assert in_request_words("--global-batch 12 does not split over dp 5") == \
        "WhatifRequest: global_batch=12 does not split over dp 5"
    assert in_request_words("--schedule 1f1b: megatron does not run it") == \
        "WhatifRequest: schedules='1f1b': megatron does not run it"
    assert in_request_words("--policy op_sac: not priced; fix: choose another --policy") == \
        "WhatifRequest: policies='op_sac': not priced; fix: choose another policy in policies"
    assert in_request_words("--decoder-first/last-pipeline-num-layers fix it") == \
        "WhatifRequest: first_stage_layers/last_stage_layers fix it"
    # another tool's options, and a message naming none, are left as they are
    for other in ("Megatron-LM's --micro-batch-size 2 and --tp-comm-overlap", "--use-distributed-optimizer is on",
                  "no option here", "torchtitan's --training.compile"):
        assert in_request_words(other) == other


def test_the_field_flags_are_the_commands_options():
    """`FIELD_FLAGS` is the what-if command's option of each request field (a renamed option fails here)."""
    import click

    from memo_sim.cli import cli

    cmd = cli.get_command(click.Context(cli), "whatif")
    opts = {p.name: p for p in cmd.params}
    names = {f.name for f in fields(api.WhatifRequest)} - {"model", "profile"}
    renamed = {"chunk_layers": "pipeline_layout"}  # the command parses the layout string into chunk_layers
    assert set(FIELD_FLAGS) == names
    for name, flag in FIELD_FLAGS.items():
        p = opts[renamed.get(name, name)]
        assert flag in p.opts, (name, flag, p.opts)
        if name in BOOL_FLAGS and p.secondary_opts:
            assert p.secondary_opts == ["--no-" + flag[2:]], (name, p.secondary_opts)


# -- 6. units in the docstring ----------------------------------------------------------------------------------------

def test_the_requests_docstring_states_its_units():
    doc = " ".join(api.WhatifRequest.__doc__.split())
    for words in ("``seq``: tokens", "``gpus``: how many GPUs", "in [0, 1]", "sequences per data-parallel replica",
                  "counts of sequences, not tokens"):
        assert words in doc, words


def test_whatif_refuses_what_is_not_a_request():
    text = one_error(lambda: api.whatif({"model": "gpt-7b", "seq": 4096}))
    assert text.startswith("whatif: request is a dict, not a WhatifRequest"), text


def test_numpy_integers_are_whole_numbers_as_before():
    """A sweep over ``np.arange`` passed numpy integers, which `simulate` and `estimate_iteration` priced before the
    argument checks; the checks refused them as not whole (a review). They are taken, as Python's integers."""
    import numpy as np

    m = api.get_model("gpt-7b")
    lay = api.Layout(tp=np.int64(8))
    plain = api.simulate(m, api.Layout(tp=8), 1, 4096, STORE, A800)
    got = api.simulate(m, lay, np.int64(1), np.int64(4096), STORE, A800)
    assert got.status == plain.status == "OK" and got.iteration_s == plain.iteration_s
    est = api.estimate_iteration(m, lay, np.int64(1), np.int64(4096), STORE, A800)
    assert est.iteration_s == api.estimate_iteration(m, api.Layout(tp=8), 1, 4096, STORE, A800).iteration_s


def test_an_unknown_policy_names_the_field():
    """The registry's words ("policy 'bogus' unknown") named no field of the request (a review)."""
    text = one_error(lambda: api.WhatifRequest(model=TOY, seq=4096, gpus=8, profile=A800, policies=("memo", "bogus")))
    assert text.startswith("WhatifRequest.policies = ") and "policy 'bogus' unknown; choose from" in text, text


@pytest.mark.parametrize("message, words", [
    ("re-create the plan with memo-sim whatif --seq 128K --gpus 8", "re-create the plan with memo-sim whatif --seq 128K "
                                                                    "--gpus 8"),
    ("give `--seq 128K` or drop --policy memo", "WhatifRequest: give `--seq 128K` or drop policies='memo'"),
    ("give at most --seq 128K.", "WhatifRequest: give at most seq=128K."),
])
def test_a_command_line_in_a_message_is_left_as_written(message, words):
    """The rewriter turned a command the user is told to run (``memo-sim whatif --seq 128K``) into one that does not
    run (``memo-sim whatif seq=128K``), and left a value ending a sentence unread (a review)."""
    from memo_sim.search.request import in_request_words

    assert in_request_words(message) == words


def test_fp8_on_an_a100_is_refused_for_the_missing_tensor_cores_in_the_calls_words():
    """An audit (2026-12-02): `api.simulate` of an FP8 model on an A100 advised adding an fp8 peak to the profile
    (the A100 has no FP8 tensor cores; the command said so). Now the command's check, in the call's words."""
    from memo_sim.model.config import with_overrides

    m = with_overrides(api.get_model("gpt-7b"), gemm_format="fp8-tensorwise")
    for call in (api.simulate, api.estimate_iteration):
        with pytest.raises(api.MemoError) as e:
            call(m, api.Layout(tp=8), 1, 8192, "store_all", "a100-sxm4-80gb")
        msg = str(e.value)
        assert msg.startswith(f"{call.__name__}: model.gemm_format = 'fp8-tensorwise'"), msg
        assert "FP8 tensor cores" in msg and "add fp8" not in msg and "--precision" not in msg
