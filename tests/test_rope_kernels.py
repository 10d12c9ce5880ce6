"""The rotary embedding as a priced op (`memo_sim.model.rope_kernels`, `memo_sim.cost.rope`): its eager formulas'
counted kernels, the elements a GPU turns, each framework's kernels, where recompute re-runs it, and the models and
exports with learned positions."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memo_sim.cost.layer_time import forward_costs, full_recompute_costs, recompute_costs
from memo_sim.cost.rope import rope_cost, rope_elements
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.model.eager_kernels import EAGER_OPS
from memo_sim.model.hf_config import hf_model_fields
from memo_sim.model.layer_graph import forward_ops, recompute_ops
from memo_sim.model.rope_kernels import rope_counts, rope_kernel, rotary_layer_share, rotary_widths
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework

A100 = load_profile("a100-sxm4-80gb")
LLAMA2 = PRESETS["llama-2-7b"]
S = 32768


def _rope(costs):
    return [c for c in costs if c.name == "rope"]


@pytest.mark.parametrize("name,dtype", [(n, d) for n in ("rope_hf", "rope_complex") for d in ("bf16", "fp32")])
def test_the_eager_formulas_count_what_the_table_holds(name, dtype):
    """The counts memo prices are the ones the dispatcher runs (benchmarks/eager_kernels.py, 8 heads of 128)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from eager_kernels import count_eager_kernels

    c = count_eager_kernels(name, dtype, 512, 1024)
    held = EAGER_OPS[(name, 2 if dtype == "bf16" else 4)]
    assert (c.fwd_kernels, c.bwd_kernels) == (held.fwd_kernels, held.bwd_kernels)
    assert (c.fwd_bytes, c.bwd_bytes, c.saved_bytes) == pytest.approx(
        (held.fwd_bytes, held.bwd_bytes, held.saved_bytes), abs=1e-6)


def test_each_framework_runs_its_own_kernels():
    """memo's executor none, Megatron-LM fused, XTuner and DeepSpeed transformers' formula, torchtitan the complex
    multiply, one fused kernel once compiled; Megatron-LM of 2021 / 2022 none (learned positions only)."""
    want = {"any": "none", "megatron": "fused", "megatron@2021": "none", "megatron@2022": "none",
            "megatron@2023": "hf", "xtuner": "hf", "deepspeed": "hf", "torchtitan": "complex"}
    for fw, rope in want.items():
        assert get_framework(fw).adapt(Layout()).rope == rope, fw
    titan = get_framework("torchtitan@2024-12").adapt(Layout())
    assert (titan.rope, titan.kernel_fusion) == ("complex", "compiled")
    assert rope_kernel(titan.rope, titan.kernel_fusion) == "fused"
    assert rope_kernel("complex", "eager") == "complex" and rope_kernel("none", "compiled") == "none"
    assert rope_counts("fused", 2).phase("fwd") == (4.0, 1) and rope_counts("fused", 4).phase("bwd") == (8.0, 1)
    assert rope_counts("none", 2) is None


def test_the_op_prices_its_bytes_and_kernels():
    """Llama-2-7B at 32K on one GPU: 8,192 query and key elements a token, at the formula's bytes per element and
    one launch per kernel per tensor."""
    elements = S * (4096 + 4096)
    assert rope_elements(LLAMA2, Layout(), 1, S) == elements
    lat, bw = float(A100.efficiency.kernel_latency), float(A100.gpu.hbm_bandwidth) * float(A100.efficiency.elementwise)
    for rope, fusion, per, kernels in (("hf", "eager", 20.5, 5), ("fused", "fused", 4.0, 1),
                                       ("complex", "eager", 20.5, 3), ("hf", "compiled", 4.0, 1)):
        c = rope_cost(LLAMA2, Layout(rope=rope, kernel_fusion=fusion), 1, S, A100, "fwd")
        assert c.nbytes == pytest.approx(per * elements)
        assert c.seconds == pytest.approx(per * elements / bw + 2 * kernels * lat)
    b = rope_cost(LLAMA2, Layout(rope="hf", kernel_fusion="eager"), 1, S, A100, "bwd")
    assert b.nbytes == pytest.approx(32.5 * elements)
    assert rope_cost(LLAMA2, Layout(), 1, S, A100, "fwd").seconds == 0.0  # memo's executor: none


def test_the_elements_follow_the_heads_a_rank_turns():
    """TP splits the query heads and the K/V heads (a K/V head per rank at least); latent attention turns each query
    head's rope part and the one shared key; partial rotary and NoPE layers turn less."""
    l8 = PRESETS["llama-3.1-8b"]  # 32 query heads, 8 K/V heads of 128
    assert rope_elements(l8, Layout(tp=8), 1, 8192) == 8192 * (4096 / 8 + 128)
    assert rope_elements(l8, Layout(tp=16, sp=True), 1, 8192) == 8192 * (4096 / 16 + 128)  # a K/V head each
    assert rope_elements(l8, Layout(cp=4), 1, 8192) == 2048 * (4096 + 1024)
    ds = PRESETS["deepseek-v3"]
    assert rotary_widths(ds) == (ds.heads * ds.qk_rope_dim, ds.qk_rope_dim)
    glm = PRESETS["glm-4.5-air"]
    assert glm.rotary_fraction == 0.5
    assert rotary_widths(glm) == (glm.heads * glm.qk_head_dim // 2, glm.n_kv_heads * glm.qk_head_dim // 2)
    scout = PRESETS["llama-4-scout"]
    assert rotary_layer_share(scout) == pytest.approx(1 - (scout.layers // scout.nope_period) / scout.layers)


def test_learned_positions_have_no_rotary_op():
    gpt = ModelConfig("g", 4, 1024, 16, 4096, positions="learned")
    assert "rope" not in [op.name for op in forward_ops(gpt)]
    assert "rope" in [op.name for op in forward_ops(replace(gpt, positions="rotary"))]
    assert rope_elements(gpt, Layout(), 1, 4096) == 0.0
    with pytest.raises(MemoError, match="positions learned"):
        ModelConfig("g", 4, 1024, 16, 4096, positions="learned", rotary_fraction=0.5)
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
            "activation_function": "gelu_new"}
    assert ModelConfig.from_dict(hf_model_fields(gpt2, name="gpt2")).positions == "learned"


def test_recompute_reruns_it_where_the_policy_rebuilds_q_and_k():
    """A full recompute and MEMO's token-wise one re-run the rotary op (the rebuilt q and k are turned again); the
    forward prices it once."""
    lay = Layout(rope="hf", kernel_fusion="eager")
    fwd = _rope(forward_costs(LLAMA2, lay, 1, S, A100))
    assert len(fwd) == 1 and fwd[0].seconds > 0
    assert "rope" in [op.name for op in recompute_ops(LLAMA2)]
    full = _rope(full_recompute_costs(LLAMA2, lay, 1, S, A100))
    assert full and full[0].seconds == pytest.approx(fwd[0].seconds)
    part = _rope(recompute_costs(LLAMA2, lay, 1, S, A100, 0.25))
    assert part and part[0].nbytes == pytest.approx(fwd[0].nbytes * 0.25)


def test_op_sac_reruns_it():
    """torchtitan's per-op checkpointing saves mm and SDPA outputs only: the rotary op re-runs before the backward."""
    from memo_sim.policy.registry import get_policy

    lay = Layout(rope="complex", kernel_fusion="eager")
    costs = get_policy("op_sac").recompute_costs(PRESETS["llama-3.1-8b"], lay, 1, 8192, A100)
    assert [c.name for c in costs if c.name == "rope"] == ["rope"]


def test_the_layout_field_round_trips_and_refuses_a_bad_kernel():
    assert "rope" not in Layout().to_dict()
    assert Layout.from_dict(Layout(rope="complex").to_dict()).rope == "complex"
    with pytest.raises(Exception, match="rope"):
        Layout.from_dict({"rope": "cuda"})
    assert "rope must be one of" in check_layout(Layout(rope="cuda"), LLAMA2, 1, 8, S)


def test_the_executor_names_the_rope_it_does_not_run():
    from memo_exec.report import rope_note

    class _Plan:
        def __init__(self, model, layout):
            self.model, self.layout = model, layout

    assert rope_note(_Plan(LLAMA2, Layout())) is None
    assert "rope hf" in rope_note(_Plan(LLAMA2, Layout(rope="hf")))
    assert rope_note(_Plan(replace(PRESETS["gpt-7b"], positions="learned"), Layout(rope="fused"))) is None
