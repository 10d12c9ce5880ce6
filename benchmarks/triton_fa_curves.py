"""FlashAttention's Triton kernel's efficiency curves for the A100 profiles, from the one public A100 measurement of it
with printed values beside FlashAttention-2 (the curves `memo_sim.profile.attention_kernels`'s ``flash_triton`` is
priced on).

Source: the FlashAttention-2 README's chart (Dao-AILab/flash-attention, assets/flash2_a100_fwd_bwd_benchmark.png at
4f285b35, 2023-07-17; the same file at 0251105a): forward + backward TFLOP/s on an A100 80GB SXM4 of 'FlashAttention
Triton' (flash_attn/flash_attn_triton.py) and 'FlashAttention-2', measured by benchmarks/benchmark_flash_attention.py:
batch x sequence = 16K tokens, hidden 2048, so 16 heads of head dim 128; panel (d), causal, whose FLOPs count half
the full matrix and the backward as 2.5 forwards. The chart gives both kernels at the same calls, but only forward
and backward together, so memo takes from it the Triton kernel's speed relative to FlashAttention-2's at each call
(its bars over FlashAttention-2's) and applies that ratio to the profile's own FlashAttention-2 forward and
backward curves alike (the split between the two passes is not in the chart; it is assumed to be
FlashAttention-2's). The ratio is indexed by the call's forward FLOPs, as memo's curves are, and held flat outside
the chart's calls: beyond its longest (16K) call the Triton bars have stopped growing (74, 78, 80 TFLOP/s at 4K, 8K,
16K). Head dim 128 is the panel whose tile (BLOCK_HEADDIM 128) every head dim from 65 to 128 runs at
(`AttentionKernel.priced_head_dim`). No training run enters.

Run: `python benchmarks/triton_fa_curves.py` prints the two curves' points as the profiles hold them;
tests/test_attention_triton.py re-derives them and fails if a profile's differ.
"""

from __future__ import annotations

import bisect
import math

# panel (d) (causal, head dim 128): sequence length -> TFLOP/s forward + backward
CHART_FA2 = {512: 99, 1024: 133, 2048: 155, 4096: 173, 8192: 182, 16384: 189}
CHART_TRITON = {512: 50, 1024: 61, 2048: 68, 4096: 74, 8192: 78, 16384: 80}
CHART_TOKENS, CHART_HEADS, CHART_HEAD_DIM = 16384, 16, 128
BWD_FACTOR = 2.5  # the chart's and memo's backward FLOPs over the forward's (memo_sim.model.flops.ATTN_BWD_FACTOR)


def chart_fwd_flops(seq: int) -> float:
    """Forward FLOPs of one of the chart's calls: 16K / seq sequences of seq tokens, causal (half the matrix)."""
    return 4.0 * (CHART_TOKENS // seq) * seq * seq * CHART_HEADS * CHART_HEAD_DIM / 2


def ratio_points() -> list[tuple[float, float]]:
    """(forward FLOPs of the chart's call, Triton's speed over FlashAttention-2's there)."""
    return [(chart_fwd_flops(s), CHART_TRITON[s] / CHART_FA2[s]) for s in sorted(CHART_FA2)]


def ratio(fwd_flops: float) -> float:
    """The Triton kernel's speed over FlashAttention-2's at a call of ``fwd_flops``: linear in log10 FLOPs between
    the chart's calls, flat outside them."""
    pts = ratio_points()
    xs = [math.log10(p[0]) for p in pts]
    x = math.log10(fwd_flops)
    if x <= xs[0]:
        return pts[0][1]
    if x >= xs[-1]:
        return pts[-1][1]
    i = bisect.bisect_right(xs, x)
    return pts[i - 1][1] + (pts[i][1] - pts[i - 1][1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def triton_points(fa2_curve, backward: bool) -> list[list[float]]:
    """The Triton kernel's curve on the profile's FlashAttention-2 ``fa2_curve`` (a `memo_sim.profile.Curve` of the
    forward, or of the backward with ``backward``): points at the FA2 curve's own FLOPs and at the chart's calls."""
    scale = BWD_FACTOR if backward else 1.0
    xs = sorted({p[0] for p in fa2_curve.points} | {scale * f for f, _r in ratio_points()})
    return [[float(f"{x:.4g}"), round(fa2_curve(x) * ratio(x / scale), 4)] for x in xs]


def _yaml_float(x: float) -> str:
    """``x`` as YAML reads a float (1.0e+09: YAML 1.1 takes 1e+09 for a string)."""
    text = f"{x:.4g}"
    mantissa, _, exp = text.partition("e")
    return f"{mantissa}.0e{exp}" if exp and "." not in mantissa else text


def main() -> None:
    from memo_sim.profile import load_profile  # noqa: PLC0415

    eff = load_profile("a100-sxm4-80gb").efficiency
    for name, curve, bwd in (("attention_flash_triton_fwd", eff.attention_fwd, False),
                             ("attention_flash_triton_bwd", eff.attention_bwd, True)):
        pts = ", ".join(f"[{_yaml_float(x)}, {e:g}]" for x, e in triton_points(curve, bwd))
        print(f"  {name}:\n    x: FLOP\n    points: [{pts}]")


if __name__ == "__main__":
    main()
