"""Attention kernels as framework data (`Layout.attention`): FlashAttention-2 (``flash``) and cuDNN's fused
attention (``cudnn``, TransformerEngine's choice on Hopper) priced at their own profile curves where the profile
gives them; the Hopper profiles' FlashAttention-2 top is the FlashAttention-3 paper's published 35%."""

from __future__ import annotations

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


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_flash_tops_at_the_published_35_percent_and_cudnn_has_its_own_curve(name):
    prof = load_profile(name)
    eff = prof.efficiency
    assert eff.attention_fwd(1e14) == pytest.approx(0.35)
    fwd, bwd = eff.attention_curves("cudnn")
    assert fwd is eff.attention_cudnn_fwd and bwd is eff.attention_cudnn_bwd and fwd(1e14) > 0.35
    f = 1e13
    assert attention_fwd_time(f, prof, kernel="cudnn") < attention_fwd_time(f, prof, kernel="flash")
    assert attention_bwd_time(f, prof, kernel="cudnn") < attention_bwd_time(f, prof, kernel="flash")


@pytest.mark.parametrize("name", ("a100-sxm4-80gb", "a800-80gb", "b200-180gb"))
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
    for name in ("torchtitan", "torchtitan@2024-12", "deepspeed", "any"):  # torch SDPA / flash-attn 2
        assert get_framework(name).adapt(Layout()).attention == "flash", name


def test_a_half_given_cudnn_pair_is_one_line(tmp_path):
    raw = yaml.safe_load(open(load_profile("h100-sxm5-80gb").path))
    del raw["efficiency"]["attention_cudnn_bwd"]
    with pytest.raises(ProfileError, match="attention_cudnn_fwd and attention_cudnn_bwd go together"):
        parse_profile(raw, "mine.yaml")
