"""SPPO and METP reviews: full METP refuses the attention it neither builds nor prices (head size other than hidden /
heads, sliding windows), SPPO alone refuses the flags its search ignored, a fixed TP flavour's own rules are named,
and explain reads a multiplexed SPPO piece's tag."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.report.explain import _LAYER_TENSOR


def test_full_metp_refuses_attention_it_prices_as_a_standard_layers():
    metp = Layout(tp=8, tp_mode="metp")
    gpt = get_model("gpt-7b")
    assert metp.flavour.check(metp, gpt) is None
    wide = ModelConfig("wide", 4, 4096, 32, 16384, vocab=50257, head_dim=256)
    assert "heads of 256 in 4096" in metp.flavour.check(metp, wide)
    swa = ModelConfig("swa", 4, 4096, 32, 16384, vocab=50257, sliding_window=4096, sliding_layers=2, sliding_period=2)
    assert "sliding windows" in metp.flavour.check(metp, swa)
    ffn = Layout(tp=8, tp_mode="metp_ffn")  # attention under Megatron TP: priced as the layer's
    assert ffn.flavour.check(ffn, wide) is None and ffn.flavour.check(ffn, swa) is None


@pytest.mark.parametrize("flags, said", [(["--dp-mode", "fsdp"], "--dp-mode fsdp"),
                                         (["--pp", "4", "--vpp", "2"], "--vpp 2"),
                                         (["--allocator", "plan"], "--allocator plan"),
                                         (["--pp", "1", "--multiplex"], "multiplexing needs pp >= 2")])
def test_sppo_alone_refuses_the_flags_its_search_does_not_take(flags, said):
    r = CliRunner().invoke(cli, ["whatif", "--model", "gpt-7b", "--gpus", "32", "--seq", "256K", "--profile",
                                 "a100-sxm4-80gb", "--policy", "sppo", "--jobs", "1", "--no-plan", *flags])
    assert r.exit_code == 2 and "--policy sppo does not take" in r.output and said in r.output, r.output


def test_a_fixed_tp_flavours_own_rules_are_named():
    base = ["whatif", "--gpus", "8", "--seq", "64K", "--no-plan", "--jobs", "1"]
    r = CliRunner().invoke(cli, base + ["--tp", "1", "--tp-mode", "metp"])
    assert r.exit_code == 2 and "--tp-mode metp needs --tp 2 or more" in r.output, r.output
    r = CliRunner().invoke(cli, base + ["--tp", "8", "--tp-mode", "metp", "--no-sp"])
    assert r.exit_code == 2 and "drop --no-sp" in r.output, r.output


def test_explain_reads_a_split_sppo_pieces_tag():
    m = _LAYER_TENSOR.match("L3@s0.1.skeletal")
    assert (m["layer"], m["tag"], m["rest"]) == ("3", "s0.1", "skeletal")
    assert _LAYER_TENSOR.match("mb1.L3.fwd.working")["rest"] == "fwd.working"


def test_the_executors_fp8_refusal_of_a_moe_plan_offers_bf16_alone():
    """A review: a MoE fp8-rowwise plan was told to plan fp8-tensorwise under --framework any, which the executor then
    refuses for its experts."""
    from dataclasses import replace

    from memo_sim.plan.executor_scope import gemm_why_not

    moe = replace(get_model("qwen3-30b-a3b"), gemm_format="fp8-rowwise")
    why = gemm_why_not(moe, Layout(dp=8), "single_stage")
    # the refusal offers bf16 alone (the experts run no FP8 in the executor under any framework)
    assert why.endswith(("plan with --precision bf16 to run it", "plan with --precision bf16")), why
    assert "under --framework any" not in why, why
    dense = replace(get_model("llama-3.1-8b"), gemm_format="mxfp8")  # a dense plan in a format it does not run
    assert "fp8-tensorwise under --framework any" in gemm_why_not(dense, Layout(dp=8), "single_stage")
    # a dense fp8-rowwise plan runs (memo_exec.gemm_scaled, since 2026-12-04)
    assert gemm_why_not(replace(dense, gemm_format="fp8-rowwise"), Layout(dp=8), "single_stage") is None
