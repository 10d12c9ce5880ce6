"""[exec-complete] item 5: one plan checker for both sides.

`memo-exec run` refuses a plan `memo-sim check-plan` refuses, with the same first line
(`memo_sim.search.plan_check.runnable_problems`), before anything runs: here every offset of a
tiny MEMO plan's memory plan is removed in turn (the what-if's plan, and a plan placed from the
executor's own layer trace, which the executor checks against that layer)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from memo_exec.cli import cli as exec_cli  # noqa: E402
from memo_sim.cli import cli as sim_cli  # noqa: E402
from tests.exec_helpers import time_limit  # noqa: E402
from tests.cli_run import one_error_line  # noqa: E402

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128", "--dtype", "fp32"]


@pytest.fixture(autouse=True)
def _time_limit():
    with time_limit(300):
        yield


@pytest.fixture(scope="module")
def memo_plan(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan")
    r = CliRunner().invoke(sim_cli, ["whatif", *TINY, "--seq", "512", "--gpus", "1", "--policy", "memo",
                                     "--alpha", "0.5", "--jobs", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads((out / "plan.json").read_text())
    assert d["memory_plan"]["phases"]["fwd"]["offsets"] and d["memory_plan"]["phases"]["bwd"]["offsets"]
    return d


@pytest.fixture(scope="module")
def traced_plan(tmp_path_factory, memo_plan) -> dict:
    out = tmp_path_factory.mktemp("traced")
    (out / "plan.json").write_text(json.dumps(memo_plan))
    r = CliRunner().invoke(exec_cli, ["trace", str(out / "plan.json"), "--device", "cpu", "--out",
                                      str(out / "t.json"), "--write-plan", str(out / "traced.json")])
    assert r.exit_code == 0, r.output
    d = json.loads((out / "traced.json").read_text())
    assert d["memory_plan"]["source"].startswith("memo-exec trace")
    return d


def _without(plan: dict, phase: str, name: str) -> dict:
    d = json.loads(json.dumps(plan))
    del d["memory_plan"]["phases"][phase]["offsets"][name]
    return d


def _run(path, out) -> object:
    return CliRunner().invoke(exec_cli, ["run", str(path), "--device", "cpu", "--steps", "1", "--out", str(out)])


def test_every_removed_offset_is_refused_by_both(tmp_path, memo_plan):
    names = [(ph, n) for ph, body in memo_plan["memory_plan"]["phases"].items() for n in body["offsets"]]
    assert len(names) >= 10
    for ph, name in names:
        p = tmp_path / f"{ph}-{name}.json"
        p.write_text(json.dumps(_without(memo_plan, ph, name)))
        sim = CliRunner().invoke(sim_cli, ["check-plan", str(p)])
        ex = _run(p, tmp_path / "out")
        sim_line, ex_line = one_error_line(sim), one_error_line(ex)
        assert f"memory_plan.phases.{ph}: no offset for 1 tensor(s) of the layer ({name})" in ex_line, ex_line
        assert sim_line.split(": ", 1)[1] in ex_line  # the same problem, in the same words
        assert "--no-memory-plan" in ex_line and not (tmp_path / "out").exists()


def test_the_intact_plan_runs_and_no_memory_plan_skips_the_check(tmp_path, memo_plan):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(memo_plan))
    assert CliRunner().invoke(sim_cli, ["check-plan", str(p)]).exit_code == 0
    r = _run(p, tmp_path / "ok")
    assert r.exit_code == 0, r.output
    ph, name = "fwd", sorted(memo_plan["memory_plan"]["phases"]["fwd"]["offsets"])[0]
    p2 = tmp_path / "broken.json"
    p2.write_text(json.dumps(_without(memo_plan, ph, name)))
    r = CliRunner().invoke(exec_cli, ["run", str(p2), "--device", "cpu", "--steps", "1", "--no-memory-plan",
                                      "--out", str(tmp_path / "nomp")])
    assert r.exit_code == 0, r.output  # the memory plan is not used, so its gap does not matter


def test_a_plan_traced_from_the_executor_is_checked_against_its_layer(tmp_path, traced_plan):
    p = tmp_path / "traced.json"
    p.write_text(json.dumps(traced_plan))
    assert _run(p, tmp_path / "ok").exit_code == 0
    for ph, body in traced_plan["memory_plan"]["phases"].items():
        for name in body["offsets"]:
            q = tmp_path / f"{ph}-{name}.json"
            q.write_text(json.dumps(_without(traced_plan, ph, name)))
            line = one_error_line(_run(q, tmp_path / "out"))
            assert f"memory_plan.phases.{ph}: no offset for 1 tensor(s) of the layer ({name})" in line, line


def test_check_plan_says_who_checks_an_executor_traced_plan(tmp_path, traced_plan):
    p = tmp_path / "traced.json"
    p.write_text(json.dumps(traced_plan))
    r = CliRunner().invoke(sim_cli, ["check-plan", str(p)])
    assert r.exit_code == 0, r.output
    assert "placed from memo-exec's recorded layer, which memo-exec run checks it against" in r.output


def test_a_plan_of_an_earlier_release_without_unplaced_lists_still_runs(tmp_path, memo_plan):
    """Plans written before plans carried the ``unplaced`` lists: the trace generator's own list of
    what the layer does not place stands in, on both sides."""
    d = json.loads(json.dumps(memo_plan))
    for body in d["memory_plan"]["phases"].values():
        body.pop("unplaced", None)
    p = tmp_path / "old.json"
    p.write_text(json.dumps(d))
    assert CliRunner().invoke(sim_cli, ["check-plan", str(p)]).exit_code == 0
    r = _run(p, tmp_path / "run")
    assert r.exit_code == 0, r.output


def test_the_run_s_attention_backend_is_the_one_checked(tmp_path, memo_plan):
    """A plan traced with torch's SDPA flash kernel (which allocates none of the math backend's
    scratch) runs with --attention-backend sdpa_flash, and is refused with the plan's own (auto:
    math on a CPU) in one line that says to re-trace: the check records the layer with the backend
    the run uses."""
    (tmp_path / "plan.json").write_text(json.dumps(memo_plan))
    r = CliRunner().invoke(exec_cli, ["trace", str(tmp_path / "plan.json"), "--device", "cpu", "--attention-backend",
                                      "sdpa_flash", "--out", str(tmp_path / "t.json"), "--write-plan",
                                      str(tmp_path / "traced.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "traced.json"), "--device", "cpu", "--steps", "1",
                                      "--attention-backend", "sdpa_flash", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    line = one_error_line(_run(tmp_path / "traced.json", tmp_path / "run2"))
    assert "no offset for" in line and "re-trace the plan with memo-exec trace --write-plan" in line, line


@pytest.fixture(scope="module")
def pipelined_memo_plan(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pipelined")
    r = CliRunner().invoke(sim_cli, ["whatif", *TINY[:1], "4", *TINY[2:], "--seq", "512", "--gpus", "2", "--pp", "2",
                                     "--schedule", "1f1b", "--policy", "memo", "--alpha", "0.5", "--jobs", "1",
                                     "--out", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads((out / "plan.json").read_text())
    assert d["layout"]["pp"] == 2 and [s["stage"] for s in d["memory_plan"]["stages"]] == [0, 1]
    return d


def test_every_removed_offset_of_a_pipelined_plan_is_refused_by_both(tmp_path, pipelined_memo_plan):
    """[exec-complete] item 2: a pipelined MEMO plan's level 1 and each rank's level 2 (the blocks of the
    micro-batches the rank holds in flight): every offset removed in turn, `memo-exec run --nproc 2` and
    `memo-sim check-plan` refuse it in one line, the same words; the intact plan passes both checks."""
    plan = pipelined_memo_plan
    removals = [(("phases", ph), n) for ph, body in plan["memory_plan"]["phases"].items() for n in body["offsets"]]
    removals += [(("stages", k), n) for k, st in enumerate(plan["memory_plan"]["stages"]) for n in st["offsets"]]
    assert len(removals) >= 30
    intact = tmp_path / "intact.json"
    intact.write_text(json.dumps(plan))
    assert CliRunner().invoke(sim_cli, ["check-plan", str(intact)]).exit_code == 0
    for (part, key), name in removals:
        d = json.loads(json.dumps(plan))
        body = d["memory_plan"][part][key]
        del body["offsets"][name]
        p = tmp_path / "cut.json"
        p.write_text(json.dumps(d))
        sim_line = one_error_line(CliRunner().invoke(sim_cli, ["check-plan", str(p)]))
        ex_line = one_error_line(CliRunner().invoke(exec_cli, ["run", str(p), "--nproc", "2", "--device", "cpu",
                                                                "--steps", "1", "--out", str(tmp_path / "out")]))
        want = (f"memory_plan.phases.{key}: no offset for 1 tensor(s) of the layer ({name})" if part == "phases"
                else f"memory_plan.stages[{key}].offsets: no offset for 1 block(s) of the rank's micro-batches ({name})")
        assert want in ex_line, ex_line
        assert sim_line.split(": ", 1)[1] in ex_line


def test_a_plan_whose_profile_does_not_load_is_refused_as_check_plan_refuses_it(tmp_path, memo_plan):
    """A review (2026-11-30): a plan naming a profile that does not exist here was refused by check-plan (exit 2) and
    trained by memo-exec run (exit 0, 'the simulator refused the plan' in its report). Both refuse it with the same
    line now, and --profile still runs it on another profile."""
    d = dict(memo_plan, profile="nope-gpu")
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    sim = CliRunner().invoke(sim_cli, ["check-plan", str(f)])
    run = CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "o")])
    assert sim.exit_code == 2 and run.exit_code == 2, (sim.output, run.output)
    assert one_error_line(run).startswith(one_error_line(sim)) and "or give --profile" in run.output, run.output
    assert not (tmp_path / "o").exists()
    ok = CliRunner().invoke(exec_cli, ["run", str(f), "--device", "cpu", "--steps", "1", "--profile", "a800-80gb",
                                       "--out", str(tmp_path / "o")])
    assert ok.exit_code == 0, ok.output


def test_a_plan_of_an_unknown_framework_is_refused_by_both(tmp_path, memo_plan):
    """A review (2026-11-30): a plan with "framework": "jax" was read by check-plan, run and export; only sweep-seq
    refused it, once it re-ran the search."""
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(dict(memo_plan, framework="jax")))
    sim = CliRunner().invoke(sim_cli, ["check-plan", str(f)])
    run = _run(f, tmp_path / "o")
    assert one_error_line(sim) == one_error_line(run), (sim.output, run.output)
    assert "framework: 'jax' is not a framework memo knows; write one of any, " in sim.output
