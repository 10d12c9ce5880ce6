"""Review fixes: a policy that re-runs the attention forward before the backward keeps no layer's lse across the
forward; it rebuilds one layer's with the recompute (Megatron-LM's full recompute, torch.utils.checkpoint)."""

from __future__ import annotations

from memo_sim.cost.activations import skeletal_bytes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.model.config import get_model
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile

M = get_model("gpt-7b")
A100 = load_profile("a100-sxm4-80gb")
LAY = Layout(tp=8)
SEQ = 32 * 1024


def test_full_recompute_keeps_no_lse_across_the_forward():
    sk = skeletal_bytes(M, LAY, 1, SEQ)
    p = get_policy("full_recompute")
    assert all(name != "lse" for name, _b in p.forward_kept(sk))
    assert ("lse", sk["lse"]) in p.recompute_allocated(sk)


def test_footprint_counts_one_layers_lse_under_full_recompute():
    sk = skeletal_bytes(M, LAY, 1, SEQ)
    fr = memory_breakdown(M, LAY, 1, SEQ, get_policy("full_recompute"), A100)
    sa = memory_breakdown(M, LAY, 1, SEQ, get_policy("store_all"), A100)
    assert fr.lse_bytes == sk["lse"]
    assert sa.lse_bytes == M.layers * sk["lse"]
    assert fr.peak_gpu_bytes == fr.peak_with()


def test_pipeline_full_recompute_lse():
    from memo_sim.search.pipeline import pipeline_memory

    sk = skeletal_bytes(M, Layout(tp=8), 1, SEQ)
    mem, _rows = pipeline_memory(M, Layout(tp=8, pp=2), 4, 1, SEQ, get_policy("full_recompute"), A100, "1f1b")
    assert mem.lse_bytes < 2 * sk["lse"] + 1


def test_a_stage_with_no_layer_holds_no_layer_buffers_or_working_block():
    from dataclasses import replace

    from memo_sim.search.pipeline import pipeline_memory

    m = replace(M, layers=4)
    lay = Layout(pp=2, chunk_layers=(0, 4))  # 'E|t*4L': the first stage holds the embedding alone
    mem, _rows = pipeline_memory(m, lay, 2, 1, 1024, get_policy("memo", 0.5), A100, "1f1b", stage=0)
    assert mem.peak_gpu_bytes == mem.model_states_bytes
    assert mem.rounding_buffer_bytes == 0 and mem.transient_peak_bytes == 0
    assert mem.peak_gpu_bytes == mem.peak_with()
