"""[fidelity] Memory mechanisms, each against a closed form derived here."""

import pytest

from memo_sim.cost.memory import model_state_bytes, model_state_parts
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.trace_gen import ALIGN, layer_backward_trace, layer_forward_trace
from memo_sim.model.config import ModelConfig, get_model

K = 1024
M7 = get_model("gpt-7b")


def _aligned(n: float) -> int:
    return max(ALIGN, -(-int(round(n)) // ALIGN) * ALIGN)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("precision,w,g,m,o", [("megatron", 2, 4, 4, 8), ("zero", 2, 2, 4, 8), ("fp32", 4, 4, 0, 8)])
def test_model_state_bytes_per_parameter(zero, precision, w, g, m, o):
    """Per GPU, with P/t parameters after TP and n = DP x CP x Ulysses ranks holding the same weights:

        weights  w·P/t  (/n from ZeRO-3)
        grads    g·P/t  (/n from ZeRO-2)
        master + Adam (m + o)·P/t  (/n from ZeRO-1)
        ZeRO-3 also holds two gathered layers, 2·w·P_layer/t, and the output head gathered for the classifier,
        w·V·h/t; ZeRO-2 and 3 two layers' (the one being reduce-scattered and the next being made, the
        reductions overlapping the backward) and the head's whole gradients before their reduce-scatter,
        g·(2·P_layer + V·h)/t.
    Megatron bf16: w=2, g=4 (fp32 main grads), m=4, o=8: 18 bytes per parameter unsharded."""
    model = ModelConfig("m", 4, 1024, 8, 4096, precision=precision)
    lay = Layout(tp=2, cp=2, dp=2, zero=zero)
    p, n = model.params() / 2, 4
    want = (w * p / (n if zero >= 3 else 1) + g * p / (n if zero >= 2 else 1)
            + (m + o) * p / (n if zero >= 1 else 1)
            + (2 * w * model.layer_params() / 2 + w * model.vocab * model.hidden / 2 if zero >= 3 else 0)
            + (g * (2 * model.layer_params() + model.vocab * model.hidden) / 2 if zero >= 2 else 0))
    assert model_state_bytes(model, lay) == pytest.approx(want)
    assert sum(model_state_parts(model, lay).values()) == pytest.approx(want)


def test_default_recipe_follows_dtype():
    assert ModelConfig("a", 2, 256, 4, 1024).recipe.bytes_per_param == 18
    assert ModelConfig("b", 2, 256, 4, 1024, dtype="fp32").recipe.name == "fp32"


def _sizes(trace, name):
    return [b.size for b in trace.buffers if b.name == name]


def test_ring_cp_buffers():
    """Ring CP over c GPUs, TP t with SP, s tokens, bf16 (d = 2): each GPU holds s/(c·t) tokens of
    k and v, each kv_dim wide, so one K/V chunk is k + v = 2·(s/(c·t))·kv_dim·d bytes.
    Forward: the chunk in use and the one being received, 2·(k + v), plus the fp32 output
    accumulator of the merged partial results, (s/(c·t))·h·4. Backward: the K/V double buffer
    again, plus dK/dV in use and in flight, 2·(k + v)·a/d: a = d for TransformerEngine's ring (Megatron-LM's
    layouts), a = 4 where the framework accumulates them in fp32 (memo's executor: ``ring_dkv_fp32``)."""
    s, c, t, h, kvd, d = 256 * K, 4, 2, 4096, 4096, 2
    lay = Layout(tp=t, cp=c)
    toks = s / (c * t)
    kv = 2 * toks * kvd * d
    fwd, bwd = layer_forward_trace(M7, lay, 1, s), layer_backward_trace(M7, lay, 1, s)
    assert _sizes(fwd, "cp_kv_double_buffer") == [_aligned(2 * kv)]
    assert _sizes(fwd, "cp_out_accumulator_fp32") == [_aligned(toks * h * 4)]
    assert _sizes(bwd, "cp_kv_double_buffer") == [_aligned(2 * kv)]
    assert _sizes(bwd, "cp_dkv_in_flight") == [_aligned(2 * kv)]
    ours = layer_backward_trace(M7, Layout(tp=t, cp=c, ring_dkv_fp32=True), 1, s)
    assert _sizes(ours, "cp_dkv_in_flight") == [_aligned(2 * kv * 4 / d)]
    # without CP none of them
    assert not _sizes(layer_forward_trace(M7, Layout(tp=t), 1, s), "cp_kv_double_buffer")


def test_flash_dq_accumulator():
    """FlashAttention's backward accumulates dQ in fp32: q's tokens x hidden x 4 bytes on one GPU,
    beside the kernel's 2·lse scratch (lse: tokens x heads x 4 bytes), in one workspace buffer."""
    s, t = 128 * K, 8
    toks = s / t  # TP + SP: every activation split by t
    lse = s * M7.heads / t * 4
    want = 2 * lse + toks * M7.hidden * 4
    bwd = layer_backward_trace(M7, Layout(tp=t), 1, s)
    assert _sizes(bwd, "attention_bwd_workspace") == [_aligned(want)]


def test_ulysses_alltoall_buffers():
    """Ulysses u: the all-to-all outputs hold the same bytes as their inputs (sequence-sharded to
    head-sharded): q + k + v before attention, attn after; each GPU has s/u tokens of each."""
    s, u = 64 * K, 4
    toks = s / u
    fwd = layer_forward_trace(M7, Layout(ulysses=u), 1, s)
    assert _sizes(fwd, "ulysses_qkv_alltoall") == [_aligned(3 * toks * M7.hidden * 2)]
    assert _sizes(fwd, "ulysses_attn_alltoall") == [_aligned(toks * M7.hidden * 2)]
