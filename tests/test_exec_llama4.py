"""Llama 4 in the executor: chunked attention (`memo_exec.attention`: the math kernel masks the keys of earlier
chunks, on the layers `ModelConfig.chunk_at` places) against the formula written out in autograd, the kernels that
cannot mask them refused by name, a layer pattern placed as transformers' Llama 4 places it, the plans the executor
refuses in one line, and a Llama 4 Hugging Face config planned by the what-if and run by memo-exec (its router,
`sigmoid_topk`, is checked in tests/test_exec_moe.py beside the other routers, on one process and on gloo ranks)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from memo_exec.arena import CachingScratch  # noqa: E402
from memo_exec.attention import AttnDims, MathAttention, select_backend  # noqa: E402
from memo_exec.errors import BackendError  # noqa: E402
from memo_sim.layout.parallel import Layout  # noqa: E402
from memo_sim.model.config import PRESETS, ModelConfig  # noqa: E402
from tests.test_exec_attention_sinks import reference  # noqa: E402 (the formula: sinks, windows, chunks)

TOL = 1e-9  # fp64


@pytest.mark.parametrize("chunk", [5, 16, 40])
def test_the_math_kernel_masks_earlier_chunks_as_the_formula(chunk):
    """Chunks of 5 (query blocks cross chunk edges), 16 (the whole sequence one chunk: plain causal attention) and
    longer than the sequence; 4 query heads over 2 K/V heads."""
    dims = AttnDims(2, 16, 4, 2, 8, chunk=chunk)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(32, w, generator=g, dtype=torch.float64) for w in (32, 16, 16))
    dout = torch.randn(32, 32, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = reference(*leaves, None, dims)
    grads = torch.autograd.grad(want, leaves, dout)
    kern, scr = MathAttention(score_budget_bytes=2 * 4 * 16 * 8 * 3), CachingScratch(torch.device("cpu"))
    assert kern.chunk_tokens(dims, torch.float64) == 3  # query blocks of 3 rows: blocks straddle the chunk edges
    out = torch.empty(32, 32, dtype=torch.float64)
    aux = kern.forward(q, k, v, out, dims, scr)
    assert float((out - want.detach()).abs().max()) < TOL
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kern.backward(dout, q, k, v, out, aux, dq, dk, dv, dims, scr)
    for got, ref in zip((dq, dk, dv), grads):
        assert float((got - ref).abs().max()) < TOL
    if chunk == 5:  # the chunks change the answer (the formula above could not pass a kernel that ignores them)
        plain = reference(q, k, v, None, dataclasses.replace(dims, chunk=16))
        assert float((plain - out).abs().max()) > 1e-3


def test_kernels_without_chunk_masks_are_refused_by_name():
    with pytest.raises(BackendError, match=r"attention backend sdpa_flash runs no chunked attention .*; use "
                                           r"--attention-backend math"):
        select_backend("sdpa_flash", torch.device("cpu"), torch.float64, AttnDims(1, 16, 4, 2, 8, chunk=8))


def test_the_chunked_layers_are_llama_4s_rotary_layers():
    """Llama 4 Scout: 8192-token chunks on the rotary layers, every fourth layer full (transformers' no_rope_layers
    default); a model that does not place its chunked layers is refused in one line."""
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy.registry import get_policy

    m = PRESETS["llama-4-scout"]
    assert [m.chunk_at(i) for i in range(8)] == [8192, 8192, 8192, 0] * 2
    assert m.chunk_at(m.layers) == m.chunk_at(m.layers - 1) == 0  # an MTP module's layer as the last
    unplaced = ModelConfig("x", 4, 64, 4, 128, attention_chunk=8, chunked_layers=2)
    assert unplaced.chunk_at(0) is None
    why = plan_why_not(unplaced, Layout(), get_policy("store_all"), "single_stage", 1, 1, 32)
    assert why and "give chunked_period" in why and "\n" not in why, why


@pytest.mark.parametrize("lay,needle", [
    (Layout(cp=2), "with cp 2"), (Layout(ulysses=2), "with ulysses 2"),
    (Layout(tp=2, sp=True, tp_mode="metp_ffn"), "tp_mode metp_ffn"),
])
def test_layouts_that_split_the_chunks_are_refused_in_one_line(lay, needle):
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy.registry import get_policy

    model = ModelConfig("chunked", 4, 64, 4, 128, vocab=128, attention_chunk=8, chunked_layers=3, chunked_period=4)
    why = plan_why_not(model, lay, get_policy("store_all"), "single_stage", 1, 1, 32)
    assert why and needle in why and "attention_chunk" in why and "\n" not in why, why
    assert plan_why_not(model, Layout(tp=2, sp=True), get_policy("store_all"), "single_stage", 1, 1, 32) is None


LLAMA4_CONFIG = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 96,
                 "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
                 "vocab_size": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "attention_chunk_size": 64,
                 "tie_word_embeddings": False, "hidden_act": "silu", "use_qk_norm": False}


def test_a_llama_4_config_is_planned_and_run_and_its_chunks_change_the_loss(tmp_path):
    """A Llama 4 (Maverick-shaped: MoE layers alternating with dense ones) Hugging Face config at 256 tokens, chunks of
    64 on three of four layers: the what-if's plan runs in memo-exec (chunked attention and the sigmoid_topk router
    were refused before 2026-11-30), and the same weights without the chunks give another loss."""
    from click.testing import CliRunner

    from memo_exec.cli import cli as exec_cli
    from memo_sim.plan.schema import read_plan
    from tests.exec_helpers import one_process_run, time_limit, whatif_plan_of_config

    with time_limit(120):
        plan = read_plan(whatif_plan_of_config(tmp_path, LLAMA4_CONFIG))
        m = plan.model
        assert (m.router, m.top_k, m.attention_chunk, m.chunked_layers, m.chunked_period, m.dense_period) == \
            ("sigmoid_topk", 1, 64, 3, 4, 2)
        r = CliRunner().invoke(exec_cli, ["run", str(tmp_path / "p" / "plan.json"), "--device", "cpu", "--steps", "1",
                                          "--out", str(tmp_path / "run")])
        assert r.exit_code == 0, r.output
        chunked, _, _ = one_process_run(plan)
        whole = dataclasses.replace(plan, model=dataclasses.replace(m, attention_chunk=0, chunked_layers=0,
                                                                    chunked_period=0))
        unchunked, _, _ = one_process_run(whole)
    assert abs(chunked - unchunked) > 1e-7 * abs(chunked), (chunked, unchunked)


def test_the_routers_weight_on_the_input_is_exported_at_top_1_and_named_a_gap_above():
    """Megatron-LM's --moe-apply-probs-on-input runs top-1 only (experts.py asserts it): a top-2 model with Llama 4's
    router gets no flag and a gap naming what the script runs instead (a review)."""
    from memo_sim.export.megatron import arguments, gaps
    from memo_sim.policy import get_policy
    from tests.exec_helpers import make_plan

    top2 = dataclasses.replace(PRESETS["llama-4-scout"], top_k=2)
    plan = make_plan(top2, 4096, get_policy("store_all"))
    assert "--moe-apply-probs-on-input" not in dict(arguments(plan, []))
    assert any("weight on the experts' input (sigmoid_topk, top-2)" in g.what for g in gaps(plan))
    top1 = make_plan(PRESETS["llama-4-scout"], 4096, get_policy("store_all"))
    assert not any("experts' input" in g.what for g in gaps(top1))


def test_a_capacity_with_expert_biases_under_input_weights_is_refused_in_one_line():
    """A padded copy carries weight 0: on the experts' input it would still add its expert's biases (a review)."""
    from memo_sim.plan.executor_scope import plan_why_not
    from memo_sim.policy.registry import get_policy

    m = ModelConfig("l4b", 4, 64, 4, 128, vocab=128, experts=4, top_k=1, expert_ffn=48, router="sigmoid_topk",
                    moe_bias=True)
    why = plan_why_not(m, Layout(moe_balance="capacity:1.5"), get_policy("store_all"), "single_stage", 1, 1, 32)
    assert why and "expert biases" in why and "plan dropless" in why and "\n" not in why, why
    assert plan_why_not(m, Layout(), get_policy("store_all"), "single_stage", 1, 1, 32) is None
    assert plan_why_not(dataclasses.replace(m, moe_bias=False), Layout(moe_balance="capacity:1.5"),
                        get_policy("store_all"), "single_stage", 1, 1, 32) is None
