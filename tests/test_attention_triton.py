"""FlashAttention's Triton kernel (`memo_sim.profile.attention_kernels` flash_triton): its A100 curves are the
derivation benchmarks/triton_fa_curves.py writes from the FlashAttention-2 README's A100 chart, they give the chart's
Triton bars where the FlashAttention-2 curves give the chart's FlashAttention-2 bars, a call is priced at the head dim
the kernel pads it to, and what cannot run it is refused in one line. No published training run enters."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memo_sim.errors import ProfileError
from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import ModelConfig
from memo_sim.profile import load_profile
from memo_sim.profile.attention_kernels import ATTENTION_KERNELS, attention_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import triton_fa_curves as T  # noqa: E402

A100S = ("a100-sxm4-80gb", "a100-sxm4-40gb", "dgx-a100-selene", "a800-80gb")


@pytest.mark.parametrize("name", A100S)
def test_the_profiles_hold_the_derivation(name):
    """Re-derived from the profile's own FlashAttention-2 curves: a change to those without re-running
    benchmarks/triton_fa_curves.py fails here."""
    eff = load_profile(name).efficiency
    assert [list(p) for p in eff.attention_flash_triton_fwd.points] == T.triton_points(eff.attention_fwd, False)
    assert [list(p) for p in eff.attention_flash_triton_bwd.points] == T.triton_points(eff.attention_bwd, True)


def _chart_tflops(profile, seq: int, kernel: str) -> float:
    """Forward + backward TFLOP/s on the chart's call (16K tokens as 16384/seq sequences of 16 heads of 128)."""
    fwd = T.chart_fwd_flops(seq)
    t = (attention_fwd_time(fwd, profile, "fp16", 128, kernel)
         + attention_bwd_time(2.5 * fwd, profile, "fp16", 128, kernel))
    return 3.5 * fwd / t / 1e12


@pytest.mark.parametrize("name", A100S)
def test_the_triton_curves_give_the_charts_triton_bars_where_flash_gives_its_flash_bars(name):
    """From 4K the profiles' FlashAttention-2 curves give the chart's bars within 4% (tests/test_profile_fa2_chart.py);
    the Triton curves, FlashAttention-2's times the chart's ratio, give its Triton bars as closely; at every call the
    two kernels' speeds stand in the chart's ratio (to the curves' rounding)."""
    p = load_profile(name)
    for seq in (4096, 8192, 16384):
        assert _chart_tflops(p, seq, "flash_triton") == pytest.approx(T.CHART_TRITON[seq], rel=0.04), seq
    for seq in T.CHART_FA2:
        ratio = _chart_tflops(p, seq, "flash_triton") / _chart_tflops(p, seq, "flash")
        assert ratio == pytest.approx(T.CHART_TRITON[seq] / T.CHART_FA2[seq], rel=0.01), seq


def test_a_call_is_priced_at_the_head_dim_the_kernel_pads_it_to():
    """flash_attn_triton.py tiles the head dim as a power of two (BLOCK_HEADDIM): a head dim of 96 does 128's work, so
    a call of the same heads and length costs the same at 96 as at 128; FlashAttention-2 runs 96 for less."""
    p = load_profile("a100-sxm4-40gb")
    kernel = attention_kernel("flash_triton")
    assert [kernel.priced_head_dim(d) for d in (8, 64, 80, 96, 128)] == [16, 64, 128, 128, 128]
    assert attention_kernel("flash").priced_head_dim(96) == 96
    per_dim = 4.0 * 32768 ** 2 * 2 / 2  # one causal call of 2 heads over 32K tokens, FLOPs per unit of head dim
    for price in (attention_fwd_time, attention_bwd_time):
        assert price(per_dim * 96, p, "fp16", 96, "flash_triton") == pytest.approx(
            price(per_dim * 128, p, "fp16", 128, "flash_triton"), rel=1e-12)
        assert price(per_dim * 96, p, "fp16", 96, "flash") < 0.8 * price(per_dim * 128, p, "fp16", 128, "flash")


def test_a_layers_attention_on_the_triton_kernel():
    """GPT-30B's layer (h 6144, 64 heads of 96) at TP 32 and 64K tokens: the Triton kernel's attention is the padded
    work (4/3) at the chart's ratio (0.42 at these calls: 1/0.42 = 2.4x), about 3.1x FlashAttention-2's; the rest of
    the layer is unchanged."""
    m = ModelConfig("gpt-30b", 64, 6144, 64, 4 * 6144, vocab=53248, dtype="fp16")
    p = load_profile("a100-sxm4-40gb")

    def costs(attention):
        lay = Layout(tp=32, sp=True, attention=attention)
        return {(c.name, c.phase): c for f in (forward_costs, backward_costs) for c in f(m, lay, 1, 65536, p)}

    flash, triton = costs("flash"), costs("flash_triton")
    assert flash.keys() == triton.keys()
    attn = [k for k, c in flash.items() if c.kind == "attention"]
    assert {phase for _name, phase in attn} == {"fwd", "bwd"}
    for k in flash:
        if k in attn:
            assert 2.9 < triton[k].seconds / flash[k].seconds < 3.4, k
        else:
            assert triton[k].seconds == pytest.approx(flash[k].seconds), k


def test_what_cannot_run_it_is_refused_in_one_line():
    assert "flash_triton" in ATTENTION_KERNELS
    with pytest.raises(ProfileError, match="no efficiency curves for FlashAttention's Triton kernel"):
        load_profile("h100-sxm5-80gb").efficiency.priced_attention_kernel("flash_triton")
    wide = ModelConfig("wide-heads", 4, 4096, 16, 16384)  # head dim 256
    why = check_layout(Layout(tp=1, attention="flash_triton"), wide, 1, 1, 4096, 1)
    assert why and "head dims up to 128" in why and "\n" not in why
    assert check_layout(Layout(tp=1, attention="flash"), wide, 1, 1, 4096, 1) is None
    assert check_layout(Layout(tp=1, attention="flash_triton"), ModelConfig("gpt", 4, 4096, 32, 16384), 1, 1, 4096,
                        1) is None
    # cuDNN's kernel still falls back to FlashAttention-2's curves where a profile has none
    assert load_profile("a100-sxm4-80gb").efficiency.priced_attention_kernel("cudnn") == "flash"


def test_the_executor_names_the_kernel_it_does_not_run():
    pytest.importorskip("torch")
    from memo_exec.attention import priced_kernel_note

    note = priced_kernel_note("flash_triton", "flash_attn", "cuda")
    assert note and "Triton" in note and "flash_attn" in note and "not comparable" in note and "\n" not in note
    assert priced_kernel_note("flash_triton", "math", "cpu")  # on every device
