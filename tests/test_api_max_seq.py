"""`memo_sim.api.max_seq`: `memo-sim maxseq`'s answers for a program (an audit, 2026-12-02: the API had the what-if
and the estimates but no maxseq entry). The request is the what-if's (`WhatifRequest`), ``seq`` the step."""

import json

import pytest
from click.testing import CliRunner

from memo_sim import api
from memo_sim.cli import cli

ASK = dict(model="gpt-7b", seq="128K", gpus=8, profile="a800-80gb")


def test_max_seq_answers_as_the_command_does():
    r = CliRunner().invoke(cli, ["maxseq", "--model", "gpt-7b", "--gpus", "8", "--profile", "a800-80gb",
                                 "--policy", "full_recompute", "--tp", "8", "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)["answers"]
    got = api.max_seq(api.WhatifRequest(**ASK, policies=("full_recompute",), tp=8))
    assert [a.to_json()["max_seq_tokens"] for a in got] == [w["max_seq_tokens"] for w in want]
    assert [a.to_json()["binding"] for a in got] == [w["binding"] for w in want]
    assert got[0].max_seq and got[0].max_seq % (128 * 1024) == 0 and got[0].best.layout.tp == 8
    assert got[0].best.to_plan().layout.tp == 8  # a plan to run


@pytest.mark.parametrize("over, says", [
    (dict(batch=2), "WhatifRequest.batch = 2: maxseq does not take it"),
    (dict(schedules=("1f1b",)), "WhatifRequest.schedules"),
    (dict(tp=3), "tp=3 does not divide"),
    (dict(policies=("nope",)), "WhatifRequest.policies"),
    (dict(seq=0), "WhatifRequest.seq = 0"),
    (dict(allocator="bogus"), "WhatifRequest.allocator = 'bogus': give caching, plan or both"),
])
def test_max_seq_refuses_in_one_line_naming_the_field(over, says):
    with pytest.raises(api.MemoError) as e:
        api.max_seq(api.WhatifRequest(**{**ASK, "policies": ("memo",), **over}))
    assert says in str(e.value) and "\n" not in str(e.value) and "--" not in str(e.value)


def test_max_seq_refuses_what_is_not_a_request():
    with pytest.raises(api.MemoError, match="not a WhatifRequest"):
        api.max_seq(ASK)


def test_whatif_json_is_the_commands_json():
    """`api.whatif_json(api.whatif(req))`: the JSON `memo-sim whatif --json` prints for the same question, one
    builder for both (`memo_sim/report/whatif_json.py`); the seconds it took are the caller's to give."""
    flags = ["whatif", "--model", "gpt-7b", "--seq", "32K", "--gpus", "8", "--profile", "a800-80gb", "--tp", "8",
             "--policy", "memo", "--policy", "full_recompute", "--train-tokens", "1B", "--json", "--no-plan"]
    r = CliRunner().invoke(cli, flags)
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    ans = api.whatif(api.WhatifRequest(model="gpt-7b", seq="32K", gpus=8, profile="a800-80gb", tp=8,
                                       policies=("memo", "full_recompute")))
    got = json.loads(json.dumps(api.whatif_json(ans, elapsed_s=1.5, train_tokens=10**9)))
    assert got["elapsed_s"] == 1.5 and want.pop("removed_stale") == []
    for side in (got, want):  # the seconds each run took, its own
        side.pop("elapsed_s")
        for c in side["candidates"]:
            c.pop("simulated_sim_wall_s")
    assert got == want
    assert got["train_days"] > 0 and got["candidates"][0]["layout"].startswith("tp8")
