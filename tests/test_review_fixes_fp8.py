"""A review's findings on memo's FP8 paths: torchtitan's NVFP4 converter, the format an export searches where the
target lacks the plan's, the FP8 copies check-plan and explain price, and the profile checks of FP8/FP4 GEMMs."""

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from memo_sim.cli import cli
from memo_sim.cost.gemm_format import check_gemm_format
from memo_sim.errors import MemoError
from memo_sim.export import EXPORTERS
from memo_sim.export.base import best_runnable, gemm_format_gap
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.plan.schema import Plan, read_plan
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework

REPO = Path(__file__).resolve().parents[1]


def _plan(fmt: str, profile: str, framework: str = "megatron", model: str = "llama-3.1-8b") -> Plan:
    return Plan(model=replace(get_model(model), gemm_format=fmt), batch=1, seq_tokens=8192, gpus=8,
                layout=Layout(dp=8, zero=3), policy=get_policy("store_all"), profile=profile,
                predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, framework=framework)


# --- 1: torchtitan at b5bcd76c ships NVFP4LinearConverter (components/quantization/nvfp4.py)

def test_torchtitan_offers_nvfp4_and_its_export_writes_the_converter():
    assert "nvfp4" in get_framework("torchtitan").gemm_formats
    ex = EXPORTERS["torchtitan"].export(_plan("nvfp4", "b200-180gb", "torchtitan"), price=False)
    src = "\n".join(ex.files.values())
    assert "from torchtitan.components.quantization.nvfp4 import NVFP4LinearConverter" in src
    assert "NVFP4LinearConverter.Config(fqns=['attention', 'feed_forward'], model_compile_enabled=True)" in src
    assert "config.compile.enable = True" in src
    assert not [g for g in ex.gaps if g.change.gemm_format is not None], [g.what for g in ex.gaps]
    # each name written is one tests/data/export/torchtitan_names.txt lists, checked against torchtitan at b5bcd76c
    names = (REPO / "tests" / "data" / "export" / "torchtitan_names.txt").read_text().splitlines()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom):
            assert all(f"import {node.module}.{a.name}" in names for a in node.names), ast.unparse(node)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "NVFP4LinearConverter.Config":
            assert all(any(n.startswith(f"arg NVFP4LinearConverter.Config {k.arg} ") for n in names)
                       for k in node.keywords), ast.unparse(node)


def test_whatif_nvfp4_under_torchtitan_is_not_refused():
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile",
                                 "b200-180gb", "--precision", "nvfp4", "--framework", "torchtitan", "--no-plan",
                                 "--jobs", "1", "--simulate-top", "1"])
    assert r.exit_code == 0, r.output
    assert "does not offer nvfp4" not in r.output


def test_torchtitan_nvfp4_on_a_moe_says_its_grouped_experts_stay_bf16():
    ex = EXPORTERS["torchtitan"].export(replace(_plan("nvfp4", "b200-180gb", "torchtitan", "qwen3-30b-a3b"),
                                                layout=Layout(dp=8, ep=8, zero=3)), price=False)
    assert any("grouped GEMMs in bf16" in g.nearest for g in ex.gaps), [g.nearest for g in ex.gaps]


# --- 2: the nearest FP8 format the target offers on the plan's GPU, not bf16

@pytest.mark.parametrize("fmt, profile, target, expected", [
    ("fp8-tensorwise", "h100-sxm5-80gb", "torchtitan", "fp8-rowwise"),
    ("fp8-blockwise", "h100-sxm5-80gb", "torchtitan", "fp8-rowwise"),
    ("fp8-blockwise", "b200-180gb", "torchtitan", "mxfp8"),
    ("mxfp8", "b200-180gb", "torchtitan@2024-12", "fp8-tensorwise"),
    ("fp8-blockwise", "h100-sxm5-80gb", "torchtitan@2024-12", "fp8-tensorwise"),
    ("fp8-tensorwise", "h100-sxm5-80gb", "deepspeed", "bf16"),
])
def test_the_export_runs_the_nearest_format_the_target_offers(fmt, profile, target, expected):
    from memo_sim.export.base import target_gemm_format  # noqa: PLC0415 - new with the fix

    plan = _plan(fmt, profile)
    gap, = gemm_format_gap(plan, target)
    assert target_gemm_format(plan, target) == expected
    assert gap.change.gemm_format == expected and gap.nearest.startswith(f"{expected} GEMMs"), gap.nearest


def test_best_runnable_searches_torchtitan_in_fp8_rowwise_for_a_megatron_tensorwise_plan():
    alt, summary = best_runnable(_plan("fp8-tensorwise", "h100-sxm5-80gb"), "torchtitan")
    assert alt.model.gemm_format == "fp8-rowwise"
    assert summary["gemm_format_searched"] == "fp8-rowwise" and summary["gemm_format_dropped"] == "fp8-tensorwise"
    ex = EXPORTERS["torchtitan"].export(alt, price=False, instead=summary)
    assert "Float8LinearConverter" in "\n".join(ex.files.values())
    assert "layer GEMMs run in fp8-rowwise" in ex.comment_block()


# --- 3: check-plan and explain derive fp8_transposes for the plan's GPU, as simulate does

def _json(args: list[str]) -> dict:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    d.pop("plan", None)
    return d


def test_check_plan_and_explain_price_one_fp8_copy_on_blackwell_without_the_field(tmp_path):
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "8", "--seq", "8K", "--profile",
                                 "b200-180gb", "--precision", "fp8-tensorwise", "--framework", "megatron",
                                 "--jobs", "1", "--simulate-top", "1", "--out", str(tmp_path / "w")])
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "w" / "plan.json").read_text())
    assert d["model"]["fp8_transposes"] is False  # TransformerEngine on a Blackwell: one copy
    del d["model"]["fp8_transposes"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(d))
    assert read_plan(bare).model.fp8_transposes is True  # the file's default, which simulate does not trust
    for cmd in ("check-plan", "explain"):
        kept = _json([cmd, str(tmp_path / "w" / "plan.json"), "--format", "json"])
        assert _json([cmd, str(bare), "--format", "json"]) == kept, cmd


# --- 4: a Hopper profile with MXFP8/FP4 peaks added; an FP8 peak 20x the bf16 one

def _profile(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (REPO / "hardware_profiles" / "h100-sxm5-80gb.yaml").read_text()
    assert old in text
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("name: h100-sxm5-80gb", f"name: {name}").replace(old, new))
    return path


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_hopper_profile_with_blackwell_peaks_refuses_mxfp8_and_nvfp4(tmp_path, fmt):
    path = _profile(tmp_path, "h100-mx", "    fp8: {value: 1979,", "    mxfp8: {value: 1979, unit: TFLOP/s, source: "
                    "x}\n    fp4: {value: 3958, unit: TFLOP/s, source: x}\n    fp8: {value: 1979,")
    profile = load_profile(path)
    with pytest.raises(MemoError) as e:
        check_gemm_format(replace(get_model("llama-3.1-8b"), gemm_format=fmt), profile)
    msg = str(e.value)
    assert "\n" not in msg and "compute_capability 9.0" in msg and "10.0" in msg, msg
    check_gemm_format(replace(get_model("llama-3.1-8b"), gemm_format="fp8-tensorwise"), profile)  # Hopper's own


def test_an_fp8_peak_twenty_times_bf16_is_refused(tmp_path):
    path = _profile(tmp_path, "h100-big", "fp8: {value: 1979,", "fp8: {value: 19790,")
    with pytest.raises(MemoError) as e:
        load_profile(path)
    msg = str(e.value)
    assert "\n" not in msg and "gpu.peak_flops.fp8" in msg and "20.0x" in msg, msg


@pytest.mark.parametrize("name", ["b200-180gb", "gb200-nvl72", "gb300-nvl72", "h100-sxm5-80gb", "h200-141gb"])
def test_the_shipped_profiles_peaks_pass_the_bound(name):
    load_profile(name)


def test_explain_says_which_peak_an_fp8_plans_mfu_is_of(tmp_path):
    """A review: explain printed 'MFU 80.7%' for an FP8 plan where the what-if says '(of the bf16 peak)'."""
    from click.testing import CliRunner

    from memo_sim.cli import cli

    out = tmp_path / "p"
    r = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--layers", "2", "--gpus", "8", "--seq", "8K",
                                 "--profile", "h100-sxm5-80gb", "--precision", "fp8-tensorwise", "--framework",
                                 "megatron", "--jobs", "1", "--simulate-top", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    first = CliRunner().invoke(cli, ["explain", str(out / "plan.json")]).output.splitlines()[0]
    assert "(of the bf16 peak; " in first and "% of the fp8 peak)" in first, first
