"""What a launch line sets over a framework's data, as `memo-sim whatif` / `maxseq` options and
`memo_sim.api.WhatifRequest` fields: the attention kernel (--attention) and the gradients reduced beside the backward
or after it (--grad-overlap / --no-grad-overlap; Megatron-LM's --overlap-grad-reduce is off in its arguments, so a
script that does not pass it runs the gradients after the backward). Each moves the priced plan as the mechanism does,
and what cannot run is refused in one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memo_sim import api
from memo_sim.cli import cli
from memo_sim.errors import MemoError
from memo_sim.plan.schema import read_plan

GPT = ["--layers", "4", "--hidden", "2048", "--heads", "16", "--vocab", "32000", "--seq", "16K"]


def _whatif(*args: str, tmp=None):
    out = ["--out", str(tmp)] if tmp else ["--no-plan"]
    return CliRunner().invoke(cli, ["whatif", *GPT, "--gpus", "8", "--policy", "full_recompute", "--tp", "8",
                                    "--sp", "--pp", "1", "--jobs", "1", "--json", *out, *args])


def _best(r) -> dict:
    """The answer's first candidate (the best simulated plan), as --json lists it."""
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["candidates"][0]


def test_the_attention_kernel_over_the_frameworks(tmp_path):
    """On an A100 the Triton kernel runs the same plan slower than FlashAttention-2 (its own curves, `tests/
    test_attention_triton.py`); the plan written carries it, and a plan reader takes it back."""
    flash = _best(_whatif("--profile", "a100-sxm4-80gb"))
    triton = _best(_whatif("--profile", "a100-sxm4-80gb", "--attention", "flash_triton", tmp=tmp_path))
    assert "flash_triton" in triton["layout"] and "flash_triton" not in flash["layout"]
    assert triton["simulated_iteration_s"] > 1.2 * flash["simulated_iteration_s"]
    plan = read_plan(tmp_path / "plan.json")
    assert plan.layout.attention == "flash_triton" and plan.priced_attention_kernel() == "flash_triton"


def test_what_cannot_run_the_kernel_is_refused_in_one_line():
    for args, words in ((("--profile", "h100-sxm5-80gb", "--attention", "flash_triton"),
                         "profile h100-sxm5-80gb has no efficiency curves for FlashAttention's Triton kernel"),
                        (("--profile", "a100-sxm4-80gb", "--attention", "flash_triton", "--head-dim", "256"),
                         "runs head dims up to 128")):
        r = _whatif(*args)
        assert r.exit_code == 2 and r.output.count("\n") == 1 and words in r.output, r.output
        assert "--attention flash_triton" in r.output and "Traceback" not in r.output


def test_gradients_after_the_backward():
    """--no-grad-overlap reduces the data-parallel gradients after the whole backward: the same layout, slower, with
    serial-grads in its label; --grad-overlap is the framework data's own default here."""
    base = ["whatif", *GPT, "--gpus", "8", "--profile", "h100-sxm5-80gb", "--policy", "full_recompute", "--tp", "1",
            "--dp", "8", "--zero", "1", "--pp", "1", "--framework", "megatron", "--jobs", "1", "--json", "--no-plan"]
    runs = {flag: _best(CliRunner().invoke(cli, base + ([flag] if flag else []))) for flag in
            ("", "--grad-overlap", "--no-grad-overlap")}
    assert runs[""]["layout"] == runs["--grad-overlap"]["layout"]
    assert runs[""]["layout_degrees"].get("grad_overlap", True) is True
    assert runs["--no-grad-overlap"]["layout_degrees"]["grad_overlap"] is False
    assert "serial-grads" in runs["--no-grad-overlap"]["layout"] and "serial-grads" not in runs[""]["layout"]
    assert runs["--no-grad-overlap"]["simulated_iteration_s"] > runs[""]["simulated_iteration_s"]


def test_the_request_fields_and_maxseq():
    model = api.get_model("llama-3.1-8b")
    with pytest.raises(MemoError, match="attention"):
        api.WhatifRequest(model=model, seq=8192, gpus=8, profile="a100-sxm4-80gb", attention="bogus")
    with pytest.raises(MemoError, match="grad_overlap"):
        api.WhatifRequest(model=model, seq=8192, gpus=8, profile="a100-sxm4-80gb", grad_overlap="no")
    r = CliRunner().invoke(cli, ["maxseq", "--model", "llama-3.1-8b", "--gpus", "8", "--profile", "a100-sxm4-80gb",
                                 "--tp", "8", "--policy", "full_recompute", "--step", "64K", "--jobs", "1", "--json"])
    t = CliRunner().invoke(cli, ["maxseq", "--model", "llama-3.1-8b", "--gpus", "8", "--profile", "a100-sxm4-80gb",
                                 "--tp", "8", "--policy", "full_recompute", "--step", "64K", "--jobs", "1", "--json",
                                 "--attention", "flash_triton", "--no-grad-overlap"])
    assert r.exit_code == 0 and t.exit_code == 0, (r.output, t.output)
    flash, triton = (json.loads(x.output)["answers"][0] for x in (r, t))
    assert "flash_triton" in triton["best"]["layout"] and "flash_triton" not in flash["best"]["layout"]


def test_a_plan_on_a_profile_without_the_kernels_curves_is_refused_by_every_reader(tmp_path):
    """A plan file whose profile gives no curves for its attention kernel (edited from an A100 to an H100): check-plan
    and the executor's contract refuse it in the same one line (`memo_sim.search.plan_check.layout_problem`)."""
    from memo_sim.plan.schema import read_plan
    from memo_sim.search.plan_check import runnable_problems

    _best(_whatif("--profile", "a100-sxm4-80gb", "--attention", "flash_triton", tmp=tmp_path))
    text = (tmp_path / "plan.json").read_text().replace("a100-sxm4-80gb", "h100-sxm5-80gb")
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    r = CliRunner().invoke(cli, ["check-plan", str(bad)])
    words = "layout: attention flash_triton: profile h100-sxm5-80gb has no efficiency curves"
    assert r.exit_code == 2 and r.output.count("\n") == 1 and words in r.output, r.output
    assert any(words in p for p in runnable_problems(read_plan(bad)))


@pytest.mark.parametrize("framework, to, zero", [("megatron", "megatron", "1"), ("deepspeed", "deepspeed", "2")])
def test_an_export_writes_the_plans_gradient_overlap(tmp_path, framework, to, zero):
    """A plan searched for a framework with --no-grad-overlap is written without the overlap (Megatron-LM: no
    --overlap-grad-reduce, off in its own arguments; DeepSpeed: overlap_comm false) and priced as the plan is, every
    part of it expressed (a review: the script overlapped them, priced 10% faster than the plan); the framework's own
    overlap is written for a plan with it, and for a plan of another framework (its mechanisms)."""
    from memo_sim.export import export_plan  # noqa: PLC0415

    base = ["whatif", *GPT, "--gpus", "8", "--profile", "h100-sxm5-80gb", "--policy", "full_recompute", "--tp", "1",
            "--dp", "8", "--zero", zero, "--pp", "1", "--framework", framework, "--jobs", "1"]
    written = {}
    for flag in ("--no-grad-overlap", "--grad-overlap"):
        out = tmp_path / flag
        r = CliRunner().invoke(cli, [*base, flag, "--out", str(out)])
        assert r.exit_code == 0, r.output
        plan = read_plan(out / "plan.json")
        assert plan.layout.grad_overlap is (flag == "--grad-overlap")
        ex = export_plan(plan, to, price=True, nearest=True)
        assert ex.nearest is None or not any("grad_overlap" in m for m in ex.nearest["mechanisms"]), ex.nearest
        if to == "megatron":
            written[flag] = "--overlap-grad-reduce" in ex.files["megatron.sh"]
        else:
            written[flag] = json.loads(ex.files["ds_config.json"])["zero_optimization"]["overlap_comm"]
        if flag == "--no-grad-overlap":  # the other framework's plan: its overlap is the target's own, named
            other = export_plan(plan, "torchtitan" if to == "megatron" else "megatron", price=True, nearest=True)
            assert other.nearest is not None and "grad_overlap False -> True" in other.nearest["mechanisms"]
    assert written == {"--no-grad-overlap": False, "--grad-overlap": True}


@pytest.mark.parametrize("framework", ["torchtitan", "torchtitan@2024-12"])
def test_no_grad_overlap_is_refused_where_no_setting_defers_the_gradients(framework):
    """torchtitan's FSDP2 and DDP reduce in their backward hooks: --no-grad-overlap there is a plan it cannot run, refused
    in one line naming the framework (where Megatron-LM and DeepSpeed write it: no --overlap-grad-reduce,
    overlap_comm false), for the what-if, maxseq and the request alike."""
    r = _whatif("--profile", "h100-sxm5-80gb", "--framework", framework, "--no-grad-overlap")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"--no-grad-overlap: {framework} reduces the data-parallel gradients beside the backward only" in r.output
    r = CliRunner().invoke(cli, ["maxseq", "--model", "llama-3.1-8b", "--gpus", "8", "--profile", "h100-sxm5-80gb",
                                 "--framework", framework, "--no-grad-overlap"])
    assert r.exit_code == 2 and "--no-grad-overlap" in r.output and "Traceback" not in r.output, r.output
    with pytest.raises(MemoError, match="reduces the data-parallel gradients beside the backward only"):
        api.whatif(api.WhatifRequest(model="llama-3.1-8b", gpus=8, seq="8K", profile="h100-sxm5-80gb",
                                     framework=framework, grad_overlap=False))
