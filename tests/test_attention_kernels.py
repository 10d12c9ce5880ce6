"""Attention kernels as framework data (`Layout.attention`): FlashAttention-2 (``flash``) and cuDNN's fused
attention (``cudnn``, TransformerEngine's choice on Hopper) priced at their own profile curves where the profile
gives them; the Hopper profiles' curves are the kernels measured on an H200 (benchmarks/gpu/hopper_curves.py over
reports/data/gpu-h200-2026-11-26-kernels.json), FlashAttention-2's top near the FlashAttention-3 paper's published 35%."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time
from memo_sim.cost.layer_time import forward_costs
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.profile import load_profile
from memo_sim.profile.loader import ProfileError, parse_profile
from memo_sim.search.frameworks import get_framework

HOPPER = ("h100-sxm5-80gb", "h200-141gb", "h100-sxm5-96gb-500w")


REPO = Path(__file__).resolve().parents[1]


def _hopper_curves():
    spec = importlib.util.spec_from_file_location("hopper_curves", REPO / "benchmarks/gpu/hopper_curves.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_curves_are_the_measured_kernels_and_cudnn_has_its_own(name):
    # the profile's curves are what benchmarks/gpu/hopper_curves.py --write derives from the committed
    # measurements: one place for the numbers, the profiles its output
    import json  # noqa: PLC0415

    mod = _hopper_curves()
    rows = json.loads((REPO / mod.DATA).read_text())["rows"]
    measured = {**mod.attention(rows), **mod.gemm(rows)}
    kind = mod.PROFILES[f"hardware_profiles/{name}.yaml"][0]
    prof = load_profile(name)
    eff = prof.efficiency

    def same(curve, want):
        return [tuple(p) for p in curve.points] == [(float(mod._num(x)), y) for x, y in want]

    path = f"hardware_profiles/{name}.yaml"
    for field in ("attention_fwd", "attention_bwd", "attention_cudnn_fwd", "attention_cudnn_bwd"):
        assert same(getattr(eff, field), mod.profile_points(path, field, measured[field])[0]), field
    assert same(eff.gemm_curve("fp8-tensorwise"), mod.profile_points(path, "gemm_fp8", measured["gemm_fp8"])[0])
    # row-wise and block-wise FP8: the tensor-wise curve over their same-run time ratios (2026-12-04)
    scaled = mod.gemm_scaled(json.loads((REPO / mod.SCALED_DATA).read_text())["rows"], measured["gemm_fp8"])
    for field, fmt in (("gemm_fp8_rowwise", "fp8-rowwise"), ("gemm_fp8_blockwise", "fp8-blockwise")):
        assert same(eff.gemm_curve(fmt), mod.profile_points(path, field, scaled[field])[0]), field
    assert same(eff.gemm, mod.profile_points(path, "gemm", mod.profile_gemm(kind))[0])
    if mod.PROFILES[path][2] is not None:  # a part limited below 700 W: every curve below the 700 W part's
        full = load_profile("h100-sxm5-80gb").efficiency
        for field in ("gemm", "attention_fwd", "attention_bwd", "attention_cudnn_fwd", "attention_cudnn_bwd"):
            top = max(y for _x, y in getattr(eff, field).points)
            assert 0.75 * max(y for _x, y in getattr(full, field).points) < top < max(
                y for _x, y in getattr(full, field).points), field
    # the measured FlashAttention-2 forward tops out near the FlashAttention-3 paper's published 35% on the H100
    if mod.PROFILES[path][2] is None:
        assert max(p[1] for p in eff.attention_fwd.points) == pytest.approx(0.35, abs=0.01)
    fwd, bwd = eff.attention_curves("cudnn")
    assert fwd is eff.attention_cudnn_fwd and bwd is eff.attention_cudnn_bwd and fwd(1e14) > 0.35
    f = 1e13
    assert attention_fwd_time(f, prof, kernel="cudnn") < attention_fwd_time(f, prof, kernel="flash")
    assert attention_bwd_time(f, prof, kernel="cudnn") < attention_bwd_time(f, prof, kernel="flash")


@pytest.mark.parametrize("name", ("a100-sxm4-80gb", "a800-80gb"))
def test_a_profile_without_cudnn_curves_prices_cudnn_as_flash(name):
    prof = load_profile(name)
    assert prof.efficiency.attention_cudnn_fwd is None
    assert attention_fwd_time(1e13, prof, kernel="cudnn") == attention_fwd_time(1e13, prof, kernel="flash")


def test_the_layer_prices_its_layouts_kernel():
    model, prof = PRESETS["llama-3.1-8b"], load_profile("h100-sxm5-80gb")
    flash = {c.name: c for c in forward_costs(model, Layout(), 1, 32768, prof)}
    cudnn = {c.name: c for c in forward_costs(model, Layout(attention="cudnn"), 1, 32768, prof)}
    assert cudnn["attention"].seconds < flash["attention"].seconds
    assert cudnn["attention"].flops == flash["attention"].flops
    assert {n: c.seconds for n, c in flash.items() if n != "attention"} == {
        n: c.seconds for n, c in cudnn.items() if n != "attention"}
    assert "cudnn" in Layout(attention="cudnn").label()
    assert Layout.from_dict(Layout(attention="cudnn").to_dict()).attention == "cudnn"


def test_frameworks_name_their_kernel():
    assert get_framework("megatron").adapt(Layout()).attention == "cudnn"  # TE prefers cuDNN on Hopper
    # memo-exec runs the kernel its plan is priced on (cuDNN's through torch SDPA where the profile prices it)
    assert get_framework("any").adapt(Layout()).attention == "cudnn"
    for name in ("torchtitan", "torchtitan@2024-12", "deepspeed"):  # torch SDPA / flash-attn 2
        assert get_framework(name).adapt(Layout()).attention == "flash", name


def test_a_half_given_cudnn_pair_is_one_line(tmp_path):
    raw = yaml.safe_load(open(load_profile("h100-sxm5-80gb").path))
    del raw["efficiency"]["attention_cudnn_bwd"]
    with pytest.raises(ProfileError, match="attention_cudnn_fwd and attention_cudnn_bwd go together"):
        parse_profile(raw, "mine.yaml")


def test_the_h200_attention_rows_carry_over_to_an_h100():
    # the Hopper profiles price attention from the H200's rows; the same probe on an H100 (700 W) ran each case
    # of 1 ms or more within 6% of the H200's time, forward and backward, but one
    checked = _hopper_curves().h100_check()
    assert len(checked) >= 20
    close = [c for c, f, b in checked if 0.94 < f < 1.06 and 0.94 < b < 1.06]
    assert len(close) >= len(checked) - 1


def test_memos_own_blocks_are_priced_on_the_kernel_memo_exec_runs_them_on():
    """Framework any prices a layer's whole attention on cuDNN's where the profile prices it (memo-exec runs torch
    SDPA's cuDNN op first for such a plan), but memo-exec runs ring CP's blocks (and full METP's, SPPO's pieces) on
    aten's FlashAttention-2 kernel (`memo_exec.block_attention.kernel_for`): those are priced on FlashAttention-2
    (``block_attention: flash``), and the plan names that kernel, so memo-exec notes no mismatch. Megatron's
    (TransformerEngine's) CP steps run cuDNN's kernel: its blocks stay on it."""
    from dataclasses import replace as _replace

    h100, m = load_profile("h100-sxm5-80gb"), PRESETS["llama-3.1-8b"]
    ring = get_framework("any").adapt(Layout(tp=2, cp=2))
    whole = get_framework("any").adapt(Layout(tp=2, ulysses=2))
    assert (ring.attention, ring.block_kernel, ring.attention_kernel()) == ("cudnn", "flash", "flash")
    assert whole.attention_kernel() == "cudnn" and whole.attention_kernel(sppo=True) == "flash"
    assert "cudnn-blocks-flash" in ring.label() and "blocks" not in whole.label()

    def attn(lay):
        return sum(c.seconds for c in forward_costs(m, lay, 1, 65536, h100) if c.name == "attention")

    assert attn(ring) == pytest.approx(attn(_replace(ring, attention="flash", block_attention="")))
    assert attn(ring) > attn(_replace(ring, block_attention=""))  # cuDNN's blocks would be faster: not memo-exec's
    megatron = get_framework("megatron").adapt(Layout(tp=2, cp=2))
    assert megatron.block_kernel == "cudnn" and attn(megatron) < attn(ring)
    assert attn(whole) < attn(_replace(whole, attention="flash"))
    assert Layout.from_dict(ring.to_dict()) == ring and "block_attention" not in Layout().to_dict()
