"""Ulysses over more ranks than K/V heads (`memo_sim.layout.kv_heads`): the layout rule, the repeat factor
r = tp·u / n_kv, and what the repeated heads cost (all-to-all bytes, ring-CP K/V, the head-sharded K/V
buffers), each against a closed form derived here. Llama-2-70B: 64 query heads, 8 K/V heads, head 128."""

from __future__ import annotations

import pytest

from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.layout.kv_heads import kv_heads_why_not, kv_repeat_factor
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.memplan.trace_gen import ALIGN, layer_backward_trace, layer_forward_trace
from memo_sim.model.config import ModelConfig, get_model
from memo_sim.profile.loader import load_profile

K = 1024
M70 = get_model("llama-2-70b")
A100 = load_profile("a100-sxm4-80gb")
BF16 = 2


def _aligned(n: float) -> int:
    return max(ALIGN, -(-int(round(n)) // ALIGN) * ALIGN)


def _sizes(trace, name: str) -> list[int]:
    return [b.size for b in trace.buffers if (b.name or b.id) == name]


def _op(costs, name: str):
    return next(c for c in costs if c.name == name)


@pytest.mark.parametrize("tp,u,r", [(1, 1, 1), (1, 8, 1), (1, 16, 2), (1, 64, 8), (2, 4, 1), (2, 8, 2), (8, 2, 2)])
def test_repeat_factor(tp, u, r):
    """r = tp·u / 8 where tp·u exceeds the 8 K/V heads under Ulysses, else 1."""
    assert Layout(tp=tp, ulysses=u).kv_repeat(8, 64) == kv_repeat_factor(tp, u, 8) == r


@pytest.mark.parametrize("tp,u,r", [(1, 1, 1), (1, 2, 8), (1, 8, 8), (1, 16, 8), (1, 64, 8)])
def test_query_heads_rule_repeats_to_the_query_heads(tp, u, r):
    """XTuner 2024's rule (``ulysses_kv: query_heads``): under Ulysses every K/V head is repeated
    heads / n_kv = 8 times, whatever the degree; without Ulysses nothing is sent, nothing priced."""
    lay = Layout(tp=tp, ulysses=u, ulysses_kv="query_heads")
    assert lay.kv_repeat(8, 64) == kv_repeat_factor(tp, u, 8, 64, "query_heads") == r
    with pytest.raises(ValueError, match="query heads"):
        kv_repeat_factor(tp, u, 8, rule="query_heads")


def test_query_heads_rule_accepts_degrees_the_minimal_one_refuses():
    """8 K/V heads, 24 query heads over ulysses 12: no whole or one-repeated head per rank (refused under
    the minimal rule), but repeated to the 24 query heads each rank gets 2 K/V heads."""
    m = ModelConfig("kv8-h24", 2, 24 * 128, 24, 8192, kv_heads=8)
    assert check_layout(Layout(ulysses=12), m, 12, 8, 12 * K) is not None
    assert check_layout(Layout(ulysses=12, ulysses_kv="query_heads"), m, 12, 8, 12 * K) is None
    assert "ulysses_kv must be one of" in check_layout(Layout(ulysses=12, ulysses_kv="all"), m, 12, 8, 12 * K)
    assert Layout(ulysses=12, ulysses_kv="query_heads").label().endswith("kv-query-heads")
    assert "ulysses_kv" not in Layout(ulysses=12).to_dict()


def test_whole_rule_never_repeats_and_refuses_what_does_not_split():
    """TransformerEngine's all-to-all CP (Megatron's --cp-comm-type a2a): K/V heads split whole over tp x ulysses,
    never repeated; 70B's 8 K/V heads over ulysses 16 (the minimal rule's one repeated head a rank) refused."""
    assert kv_repeat_factor(1, 8, 8, rule="whole") == 1 and kv_heads_why_not(2, 4, 8, "whole") is None
    why = kv_heads_why_not(1, 16, 8, "whole")
    assert why and "--cp-comm-type a2a" in why and "never repeated" in why
    assert check_layout(Layout(ulysses=16, dp=2, zero=3, ulysses_kv="whole"), M70, 32, 8, 256 * K) is not None
    assert check_layout(Layout(ulysses=8, dp=4, zero=3, ulysses_kv="whole"), M70, 32, 8, 256 * K) is None
    assert Layout(ulysses=8, ulysses_kv="whole").label().endswith("kv-whole")


def test_layout_accepts_70b_over_16_and_64_ulysses_ranks():
    assert check_layout(Layout(ulysses=16, dp=2, zero=3), M70, 32, 8, 256 * K) is None
    assert check_layout(Layout(ulysses=64, zero=3), M70, 64, 8, 1024 * K) is None
    assert check_layout(Layout(tp=2, ulysses=8, dp=2), M70, 32, 8, 256 * K) is None


def test_layout_refuses_kv_heads_neither_dividing_nor_multiple_in_one_line():
    """8 K/V heads over tp x ulysses = 12: neither whole nor repeated heads (24 query heads: those split)."""
    m = ModelConfig("kv8-h24", 2, 24 * 128, 24, 8192, kv_heads=8)
    for lay in (Layout(ulysses=12), Layout(tp=2, ulysses=6), Layout(tp=4, ulysses=3)):
        why = check_layout(lay, m, 12, 8, 12 * K)
        assert why is not None and "\n" not in why, why
        assert "kv heads (8)" in why and "tp x ulysses (12)" in why and "multiple" in why, why
    # TP itself splits whole K/V heads (Megatron-LM's num_query_groups % tp): tp 8 over 4 K/V heads is refused
    assert "not divisible by tp (8)" in kv_heads_why_not(8, 2, 4)


@pytest.mark.parametrize("u", [16, 64])
def test_alltoall_bytes_carry_the_repeated_kv_heads(u):
    """Per GPU each all-to-all sends its s/u tokens of q (64·128 wide) and of K and V with every head
    repeated r = u/8 times: s/u x (8192 + r·2·1024) x 2 bytes, forward and backward (dq, dk, dv)."""
    s, r = 256 * K, u // 8
    want = s / u * (M70.q_dim + r * (M70.kv_dim + M70.v_dim)) * BF16
    lay = Layout(ulysses=u)
    for costs in (forward_costs(M70, lay, 1, s, A100), backward_costs(M70, lay, 1, s, A100)):
        assert _op(costs, "alltoall_qkv").nbytes == pytest.approx(want)
    assert want > s / u * (M70.q_dim + M70.kv_dim + M70.v_dim) * BF16  # the un-repeated bytes are less


def test_query_heads_rule_sends_and_holds_kv_at_the_query_heads():
    """Llama-2-70B at ulysses 8 under XTuner 2024's rule: K and V each go out at the 64 query heads
    (r = 8; 1 under the minimal rule), so the all-to-all moves s/8 x 3·8192 x 2 bytes, and each rank
    holds 8 K and 8 V heads for the whole sequence after it."""
    s, u = 128 * K, 8
    lay, minimal = Layout(ulysses=u, ulysses_kv="query_heads"), Layout(ulysses=u)
    want = s / u * 3 * M70.q_dim * BF16
    assert _op(forward_costs(M70, lay, 1, s, A100), "alltoall_qkv").nbytes == pytest.approx(want)
    assert _op(forward_costs(M70, minimal, 1, s, A100), "alltoall_qkv").nbytes < want
    assert _sizes(layer_forward_trace(M70, lay, 1, s), "ulysses_qkv_alltoall") == \
        [_aligned(s * 3 * M70.q_dim / u * BF16)]


def test_head_sharded_kv_buffers_hold_one_repeated_head():
    """After the all-to-all each of the 16 ranks holds one K and one V head (r = 2 copies of 8 heads)
    for the whole sequence: the q, k, v all-to-all buffer is s x (8192/16 + 2·128) x 2 bytes, in the
    forward and (dq, dk, dv) in the backward."""
    s, u = 64 * K, 16
    want = s * (M70.q_dim / u + 2 * M70.qk_head_dim) * BF16
    lay = Layout(ulysses=u)
    assert _sizes(layer_forward_trace(M70, lay, 1, s), "ulysses_qkv_alltoall") == [_aligned(want)]
    assert _sizes(layer_backward_trace(M70, lay, 1, s), "ulysses_dqkv_alltoall") == [_aligned(want)]
    # 8 ranks: one whole head each, no repeat
    assert _sizes(layer_forward_trace(M70, Layout(ulysses=8), 1, s), "ulysses_qkv_alltoall") == \
        [_aligned(s * (M70.q_dim / 8 + 2 * M70.qk_head_dim) * BF16)]


def test_ring_cp_passes_the_repeated_heads_on():
    """Ulysses 16 x ring CP 2: each rank's K/V chunk (s/2 tokens, one repeated K and V head) is what the
    ring carries and double-buffers: cp - 1 = 1 transfer of s/2 x 2·128 x 2 bytes forward, twice that
    backward (K/V and dK/dV); the double buffer 2 x that chunk."""
    s, u, cp = 64 * K, 16, 2
    chunk = s / cp * 2 * M70.qk_head_dim * BF16
    lay = Layout(ulysses=u, cp=cp)
    assert _op(forward_costs(M70, lay, 1, s, A100), "cp_ring_kv").nbytes == pytest.approx(chunk)
    assert _op(backward_costs(M70, lay, 1, s, A100), "cp_ring_kv").nbytes == pytest.approx(2 * chunk)
    assert _sizes(layer_forward_trace(M70, lay, 1, s), "cp_kv_double_buffer") == [_aligned(2 * chunk)]
