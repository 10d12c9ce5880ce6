"""Qwen3's QK norms under a framework's autograd keep their outputs beside their inputs (a review: Megatron-LM's
TransformerEngine RMSNorm saves the un-normed q and k, and the attention kernel the normed, rotated ones: q + k kept
twice, 2 x (4096 + 1024) bytes a token a layer for Qwen3-8B, +5.6 GiB at 128K on 8 GPUs, where memo counted Llama's
11h). memo's executor (the ``any`` framework's plans) keeps the projections alone and normalises them again where
the kernel runs, as before."""

from __future__ import annotations

import pytest

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.trace_gen import layer_forward_trace
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.model.layer_graph import DTYPE_BYTES, layer_tensors
from memo_sim.search.frameworks import get_framework

QWEN3 = PRESETS["qwen3-8b"]


@pytest.mark.parametrize("framework,kept", [("megatron", True), ("torchtitan", True), ("any", False)])
def test_a_frameworks_autograd_keeps_the_normed_queries_and_keys(framework, kept):
    m = get_framework(framework).for_model(QWEN3)
    assert m.qk_norm_kept is kept
    saved = [n for n, t in layer_tensors(m).items() if t.saved]
    assert (("q_normed" in saved) and ("k_normed" in saved)) is kept
    lay, seq = Layout(cp=8), 128 * 1024
    plain = skeletal_bytes(get_framework("any").for_model(QWEN3), lay, 1, seq)["total"]
    extra = (QWEN3.q_dim + QWEN3.kv_dim) * DTYPE_BYTES[QWEN3.dtype] * seq / 8
    assert skeletal_bytes(m, lay, 1, seq)["total"] == pytest.approx(plain + (extra if kept else 0.0))
    transient = {b.name for b in layer_forward_trace(m, lay, 1, seq).buffers}
    assert ("q_normed" in transient) is not kept  # normalised again in scratch only where not kept


def test_a_model_without_qk_norms_is_unchanged_and_plans_read_back():
    llama = get_framework("megatron").for_model(PRESETS["llama-3.1-8b"])
    assert not llama.qk_norm_kept and "q_normed" not in layer_tensors(llama)
    m = get_framework("megatron").for_model(QWEN3)
    assert m.to_dict()["qk_norm_kept"] is True and ModelConfig.from_dict(m.to_dict()) == m
    assert "qk_norm_kept" not in get_framework("any").for_model(QWEN3).to_dict()  # the default left out
