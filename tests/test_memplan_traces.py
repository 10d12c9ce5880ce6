"""Request traces from the layer graph, the bi-level plan, and the caching-allocator baseline."""

import pytest

from memo_sim.memplan.footprint import memory_breakdown
from memo_sim.layout import Layout
from memo_sim.memplan.baseline import caching_allocator_layer_report, layer_fwd_bwd_trace
from memo_sim.memplan.planner import plan_memory
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace, model_trace
from memo_sim.memplan.placement_check import validate_placement
from memo_sim.model import get_model
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile

M7 = get_model("gpt-7b")
K = 1024


def test_forward_trace_tp_sp_sizes():
    lay = Layout(tp=8)
    fwd = layer_forward_trace(M7, lay, 1, 256 * K)
    full = 256 * K * 4096 * 2  # one gathered sequence-parallel input, bf16
    gathered = [b for b in fwd.buffers if b.name.endswith("_input_gathered")]
    assert {b.name for b in gathered} == {"qkv_input_gathered", "fc1_input_gathered"}
    assert all(b.size == full for b in gathered)
    # without SP, no gathers, and the row-parallel outputs are all-reduced at full size
    nosp = layer_forward_trace(M7, Layout(tp=8, sp=False), 1, 256 * K)
    assert not [b for b in nosp.buffers if "gathered" in b.name]


def test_backward_trace_recompute_scratch_scales_with_alpha():
    lay = Layout(tp=8)
    full = layer_backward_trace(M7, lay, 1, 256 * K, get_policy("memo", 0.0))
    half = layer_backward_trace(M7, lay, 1, 256 * K, get_policy("memo", 0.5))
    none = layer_backward_trace(M7, lay, 1, 256 * K, get_policy("store_all"))
    rs = lambda t: sum(b.size for b in t.buffers if b.name.startswith("recompute_"))  # noqa: E731
    assert rs(none) == 0 and rs(full) == pytest.approx(2 * rs(half), rel=1e-3)


def test_bilevel_plan_valid_and_at_bound():
    plan = plan_memory(M7, Layout(tp=8), 1, 256 * K, get_policy("memo", 0.5), time_limit_s=5)
    for sol, tr in ((plan.fwd, plan.fwd_trace), (plan.bwd, plan.bwd_trace), (plan.model, plan.model_trace)):
        assert validate_placement(tr, sol.offsets, int(sol.peak_bytes)) == []
        assert sol.peak_bytes <= 1.01 * tr.max_live_bytes()
    mp = plan.to_plan_json()
    assert mp["arena_bytes"] == plan.arena_bytes and set(mp["phases"]) == {"fwd", "bwd"}
    # level 2 carries one pseudo block per layer phase of the level-1 peaks
    pseudo = [b for b in plan.model_trace.buffers if b.kind == "pseudo"]
    assert len(pseudo) == 2 * M7.layers
    assert {b.size for b in pseudo if b.phase == "fwd"} == {plan.fwd.peak_bytes}


@pytest.mark.parametrize("seq", [256 * K, 1024 * K])
def test_caching_allocator_fragments_unplanned_7b(seq):
    lay = Layout(tp=8)
    rep = caching_allocator_layer_report(M7, lay, 1, seq, get_policy("full_recompute"))
    trace = layer_fwd_bwd_trace(M7, lay, 1, seq, get_policy("full_recompute"))
    assert rep.fragmentation_at_peak > 0
    assert rep.peak_reserved_bytes > trace.max_live_bytes()


def test_breakdown_uses_plan_for_memo_and_allocator_for_others():
    p = load_profile("a800-80gb")
    memo = memory_breakdown(M7, Layout(tp=8), 1, 256 * K, get_policy("memo", 0.5), p)
    off = memory_breakdown(M7, Layout(tp=8), 1, 256 * K, get_policy("full_offload"), p)
    assert memo.transient_peak_bytes == memo.transient_planned_bytes
    assert off.transient_peak_bytes == off.transient_caching_allocator_bytes > off.transient_planned_bytes


def test_model_trace_policies():
    for pol, kind_count in (("store_all", M7.layers), ("full_recompute", M7.layers), ("full_offload", 2)):
        t = model_trace(M7, Layout(tp=8), 1, 64 * K, get_policy(pol), 10 * 2**20, 20 * 2**20)
        sk = [b for b in t.buffers if b.kind == "skeletal" and not b.id.endswith(".lse")]
        assert len(sk) >= kind_count


def test_pipeline_level2_holds_memos_rounding_blocks_once_per_rank():
    """Level 2 of a pipelined MEMO plan counts the rank's four rounding blocks (two forward, two prefetch) once,
    through the step, whatever the micro-batches in flight (the executor's instances on a rank share them:
    `memo_exec.activations.pipeline_rounding`); before, it took two per (chunk, micro-batch), so stage 0 of a
    1F1B pipeline held 2 x (pp - s) of them. A recompute buffer stays per (chunk, micro-batch), each one
    backward long, so the micro-batches' copies never overlap."""
    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.memplan.stage_plan import StageStep, stage_model_trace
    from memo_sim.engine.schedules.microbatch import pipeline_order

    model = get_model("gpt-7b")
    lay = Layout(pp=4)
    sk = skeletal_bytes(model, lay, 1, 4096)
    for m in (4, 8):
        order = [StageStep(st.kind, st.mb, st.chunk) for st in pipeline_order("1f1b")(4, m, 1, 0)]
        tr = stage_model_trace(model, lay, 1, 4096, get_policy("memo", 0.3), 1 << 20, 1 << 20, order, 0)
        rb = [b for b in tr.buffers if "rounding" in b.id]
        assert sorted(b.id for b in rb) == ["rounding_forward0", "rounding_forward1", "rounding_prefetch0",
                                            "rounding_prefetch1"], [b.id for b in rb]
        assert all(b.size >= sk["total"] and b.lower == 0 for b in rb)
        tr = stage_model_trace(model, lay, 1, 4096, get_policy("full_recompute"), 1 << 20, 1 << 20, order, 0)
        spans = sorted((b.lower, b.upper) for b in tr.buffers if b.id.endswith("recompute_buffer"))
        assert len(spans) == m and all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans


def test_pipeline_level2_gives_no_rounding_blocks_to_a_rank_without_layers():
    """A rank whose chunk holds no layer (the loss alone: 'chunk_layers' (16, 16, 0)) allocates no MEMO buffer in
    the executor; level 2 takes none for it (the review of 2026-11-29 found four there)."""
    from memo_sim.engine.schedules.microbatch import pipeline_order
    from memo_sim.memplan.stage_plan import StageStep, stage_model_trace

    lay = Layout(pp=3, chunk_layers=(16, 16, 0))
    for stage, want in ((0, 4), (2, 0)):
        order = [StageStep(st.kind, st.mb, st.chunk) for st in pipeline_order("1f1b")(3, 4, 1, stage)]
        tr = stage_model_trace(M7, lay, 1, 4096, get_policy("memo", 0.3), 1 << 20, 1 << 20, order, stage)
        assert len([b for b in tr.buffers if "rounding" in b.id]) == want, stage
