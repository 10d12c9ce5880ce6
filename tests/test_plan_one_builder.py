"""The plan is built in one place: `memo-sim whatif` and `memo_sim.api` give byte-identical
plan.json files for the same question, memory plan included (`memo_sim.search.plan_build`)."""

import datetime as _dt
import json

import pytest
from click.testing import CliRunner

import memo_sim.memplan.dsa_search as dsa_search
import memo_sim.memplan.solve as memplan_solve
import memo_sim.plan.schema as plan_schema
from memo_sim import api
from memo_sim.cli import cli
from memo_sim.model.config import ModelConfig

TOY = ModelConfig("toy", 2, 256, 8, 1024, vocab=1000)


class _FrozenClock(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 1, 2, 3, 4, 5, tzinfo=tz)


class _StoppedTimer:
    """`time` for the memory planner's solvers, whose clock stands still (they run to the end)."""

    @staticmethod
    def perf_counter():
        return 1000.0


@pytest.fixture
def frozen_clock(monkeypatch):
    """A plan records two clock readings, when it was made (to the second) and how long its memory
    plan's solver took: the two builds read one stopped clock, so every other byte must agree."""
    monkeypatch.setattr(plan_schema, "_dt", type("dt", (), {"datetime": _FrozenClock, "timezone": _dt.timezone}))
    for module in (memplan_solve, dsa_search):
        monkeypatch.setattr(module, "time", _StoppedTimer)


CASES = {  # flags beyond the model and profile, and the same question as request fields
    "memo": (["--seq", "16K", "--gpus", "2", "--tp", "2", "--policy", "memo", "--simulate-top", "2"],
             dict(seq=16384, gpus=2, tp=2, policies=("memo",), simulate_top=2)),
    "store_all": (["--seq", "8K", "--gpus", "2", "--policy", "store_all", "--policy", "full_recompute",
                   "--simulate-top", "2"],
                  dict(seq=8192, gpus=2, policies=["store_all", "full_recompute"], simulate_top=2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_and_api_write_byte_identical_plans(case, tmp_path, frozen_clock):
    flags, fields = CASES[case]
    model_file = tmp_path / "toy.json"
    model_file.write_text(json.dumps(TOY.to_dict()))
    out = tmp_path / "cli"
    r = CliRunner().invoke(cli, ["whatif", "--model", str(model_file), "--profile", "a800-80gb", "--jobs", "1",
                                 "--out", str(out), *flags], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    req = api.WhatifRequest(model=api.get_model(str(model_file)), profile=api.load_profile("a800-80gb"), **fields)
    answer = api.whatif(req)
    by_api = api.write_plan(answer.plans()["plan.json"], tmp_path / "api" / "plan.json")
    by_candidate = api.write_plan(answer.best.to_plan(), tmp_path / "candidate" / "plan.json")
    written = (out / "plan.json").read_bytes()
    assert by_api.read_bytes() == written
    assert by_candidate.read_bytes() == written
    plan = json.loads(written)
    assert (plan["memory_plan"] is not None) == (case == "memo")  # MEMO's plan carries its bi-level memory plan


def test_request_resolves_like_the_command():
    """--tp alone asks about Megatron TP; SPPO's own options plan SPPO; lists become tuples."""
    prof = api.load_profile("a800-80gb")
    assert api.WhatifRequest(TOY, 4096, 2, prof, tp=2).flavour == "megatron"
    assert api.WhatifRequest(TOY, 4096, 2, prof).flavour == "all"
    assert api.WhatifRequest(TOY, 4096, 2, prof, subseqs=4).searched_policies == ("sppo",)
    req = api.WhatifRequest(TOY, 4096, 2, prof, policies=["memo"], schedules=["single_stage"])
    assert req.policies == ("memo",) and req.search_kwargs()["schedules"] == ("single_stage",)
    assert req == api.WhatifRequest(TOY, 4096, 2, prof, policies=("memo",), schedules=("single_stage",))


def test_every_whatif_option_lands_in_the_request_or_the_output():
    """A new `memo-sim whatif` option is a field of `WhatifRequest` (the question) or of the
    command's `Show` (what it prints and writes), by the same name: none is dropped on the way."""
    from dataclasses import fields

    from memo_sim.cli.whatif import Show, whatif
    from memo_sim.search.request import WhatifRequest

    built = {"model_name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype",  # the model
             "mtp_layers", "precision",
             "profile_name", "train_tokens", "headroom",  # the profile (--headroom left free on it); Show.train_budget
             "pipeline_layout"}  # parsed against the model into WhatifRequest.chunk_layers
    taken = {f.name for f in fields(WhatifRequest)} | {f.name for f in fields(Show)} | built
    assert {p.name for p in whatif.params} - taken == set()
