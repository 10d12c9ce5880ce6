"""The A100 profiles' FlashAttention-2 curves against the one public A100 measurement of the kernel with printed values:
the FlashAttention-2 README's chart (Dao-AILab/flash-attention, assets/flash2_a100_fwd_bwd_benchmark.png at 4f285b35,
2023-07-17, section "A100": forward + backward TFLOP/s of flash-attn 2 on an A100 80GB SXM4, batch x sequence = 16K
tokens, hidden 2048, so 16 heads of head dim 128; panel (d), causal). The curves were assumed from the FA2 paper and
fitted to the MEMO paper's figures (the profiles' sources say so); this test holds them to the chart where they agree
(4K-16K, within 4%) and states where they do not (shorter sequences: the curve is faster), so a change to the curves
that moves them away from the chart fails here. No published training run enters."""

from __future__ import annotations

import pytest

from memo_sim.cost.kernel_time import attention_bwd_time, attention_fwd_time
from memo_sim.profile import load_profile

# panel (d), FlashAttention-2's bars: sequence length -> TFLOP/s (forward + backward, causal, head dim 128)
CHART_A100_CAUSAL_D128 = {512: 99, 1024: 133, 2048: 155, 4096: 173, 8192: 182, 16384: 189}


def _profile_tflops(profile: str, seq: int) -> float:
    """The profile's forward + backward speed on the chart's call: 16K tokens as 16384/seq sequences of 16 heads;
    the chart counts a causal call's FLOPs as half the full ones and the backward as 2.5 forwards."""
    p = load_profile(profile)
    fwd = 4 * seq * seq * 128 * 16 * (16384 // seq) / 2
    t = attention_fwd_time(fwd, p, "fp16", 128) + attention_bwd_time(2.5 * fwd, p, "fp16", 128)
    return 3.5 * fwd / t / 1e12


@pytest.mark.parametrize("profile", ["a100-sxm4-80gb", "dgx-a100-selene", "a800-80gb"])
def test_the_a100_flash_curves_follow_the_fa2_chart_from_4k(profile):
    for seq in (4096, 8192, 16384):
        assert _profile_tflops(profile, seq) == pytest.approx(CHART_A100_CAUSAL_D128[seq], rel=0.04), seq


@pytest.mark.parametrize("profile", ["a100-sxm4-80gb", "dgx-a100-selene", "a800-80gb"])
def test_below_4k_the_curves_are_faster_than_the_chart_as_their_sources_say(profile):
    """The chart's short-sequence calls are many short sequences (32 of 512 tokens), slower than a FLOP-indexed curve
    fitted to long ones: +10% at 2K, +21% at 1K, +51% at 512 (the profiles' sources state it)."""
    ratios = [_profile_tflops(profile, s) / CHART_A100_CAUSAL_D128[s] for s in (512, 1024, 2048)]
    assert ratios[0] > ratios[1] > ratios[2] > 1.05
    assert ratios[0] == pytest.approx(1.51, abs=0.02) and ratios[2] == pytest.approx(1.10, abs=0.02)
