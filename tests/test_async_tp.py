"""Async TP (`memo_sim.tp.async_tp`): Megatron TP+SP with each collective decomposed and run beside
the GEMM it feeds or drains (PyTorch's micro-pipeline TP, torchtitan's enable_async_tensor_parallel):
the op lists, the time against Megatron TP, the rules, the frameworks, the exports, the executor's
refusal and the proved bound."""

from __future__ import annotations

import pytest

from memo_sim.cost.layer_time import backward_costs, critical_time, forward_costs
from memo_sim.search.frameworks import get_framework
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.profile.loader import load_profile
from memo_sim.search.whatif import candidates_for

from bound_check import bounds_hold, sample

H100 = load_profile("h100-sxm5-80gb")
M = PRESETS["llama-3.1-70b"]
TOY = ModelConfig("toy", layers=4, hidden=2048, heads=16, ffn=8192, vocab=32000, dtype="bf16")


def _lists(mode: str, model=M, batch: int = 2, seq: int = 8192):
    lay = Layout(tp=8, sp=True, tp_mode=mode)
    return forward_costs(model, lay, batch, seq, H100), backward_costs(model, lay, batch, seq, H100)


def test_the_pairs_the_micro_pipeline_pass_fuses_run_beside_their_gemms_whose_chunks_add_up():
    for phase, sync, asyn in zip(("fwd", "bwd"), _lists("megatron"), _lists("async_tp")):
        coll = [c for c in sync if c.stream == "comm"]
        side = [c for c in asyn if c.stream == "comm"]
        assert sorted(c.name for c in coll) == sorted(c.name for c in side)
        beside = {c.name for c in side if c.overlaps == 1}
        if phase == "fwd":  # every forward pair fuses
            assert beside == {c.name for c in side}
        else:  # the row-parallel GEMMs' output-gradient all-gathers; not the reduce-scatters of a sum, not re-gathers
            assert beside == {"allgather_out_proj", "allgather_fc2"}, beside
        # the GEMMs' FLOPs are the same, split into tp chunks (each priced at its own size)
        assert sum(c.flops for c in asyn if c.kind == "gemm") == pytest.approx(sum(c.flops for c in sync if c.kind == "gemm"))
        for k, c in enumerate(asyn):
            if c.overlaps:  # the chain op after a side op (or after the side ops in a row) is a GEMM's chunk
                nxt = next(d for d in asyn[k:] if d.overlaps == 0)
                assert nxt.kind == "gemm", (c.name, nxt.name)


def test_the_backward_chunks_only_the_data_gradient_and_policies_read_through_the_parts():
    """In backward the fused pair is the output gradient's all-gather and the data-gradient matmul; the
    weight gradient (half of memo's backward GEMM) runs whole after it. Policies that pick ops by name
    (per-op selective checkpointing) take a GEMM's parts as the GEMM."""
    from memo_sim.policy.registry import get_policy

    _f, b = _lists("async_tp")
    _fs, bs = _lists("megatron")
    parts = [c for c in b if c.name.startswith("out_proj")]
    whole = next(c for c in bs if c.name == "out_proj")
    assert [c.name for c in parts] == ["out_proj", "out_proj_last_chunk", "out_proj_wgrad"]
    assert parts[2].flops == pytest.approx(whole.flops / 2) and sum(c.flops for c in parts) == pytest.approx(whole.flops)
    lay, sync = Layout(tp=8, sp=True, tp_mode="async_tp"), Layout(tp=8, sp=True)
    sac = get_policy("op_sac")
    got = sum(c.flops for c in sac.recompute_costs(M, lay, 2, 8192, H100) if c.kind == "gemm")
    want = sum(c.flops for c in sac.recompute_costs(M, sync, 2, 8192, H100) if c.kind == "gemm")
    assert got == pytest.approx(want)


def test_hidden_collectives_shorten_the_layer_and_the_last_chunk_still_waits():
    for sync, asyn in zip(_lists("megatron"), _lists("async_tp")):
        chain = sum(c.seconds for c in asyn if c.overlaps == 0)
        assert chain <= critical_time(asyn) < critical_time(sync)
    # with collectives far longer than the GEMMs (a tiny model), the GEMM waits for them: the pair
    # takes the collective plus the last chunk, so the layer is no faster than its collectives allow
    f_sync, _ = _lists("megatron", TOY, 1, 1024)
    f_async, _ = _lists("async_tp", TOY, 1, 1024)
    assert critical_time(f_async) >= sum(c.seconds for c in f_async if c.stream == "comm")


@pytest.mark.parametrize("layout,needle", [
    (Layout(tp=8, sp=False, tp_mode="async_tp"), "sp must be on"),
    (Layout(tp=1, tp_mode="async_tp", dp=8), "at least 2"),
])
def test_async_tp_is_refused_in_one_line_where_it_cannot_run(layout, needle):
    why = check_layout(layout, M, 8, 8, 8192)
    assert why and needle in why and "\n" not in why, why


def test_only_the_frameworks_that_run_it_offer_it_and_the_search_bound_holds():
    lay = Layout(tp=8, sp=True, tp_mode="async_tp")
    assert get_framework("torchtitan@2024-12").allows(replace_fsdp(lay))
    assert not get_framework("megatron").allows(lay)
    r = candidates_for(TOY, 8192, 8, H100, framework="torchtitan@2024-12", tp=4, policies=("full_recompute",),
                       schedules=("single_stage",))
    asyn = [c for c in r.candidates if c.layout.tp_mode == "async_tp"]
    assert asyn and {c.layout.tp_mode for c in r.candidates} == {"megatron", "async_tp"}
    ok = sample([c for c in asyn if c.memory.status == "OK"], 3)
    assert ok and len(bounds_hold(ok)) == len(ok)


def replace_fsdp(lay: Layout) -> Layout:
    from dataclasses import replace
    return replace(lay, dp=4, zero=3, dp_mode="fsdp")


def _plan(lay):
    from memo_sim.plan.schema import Plan
    from memo_sim.policy import get_policy

    return Plan(model=M, batch=2, seq_tokens=8192, gpus=lay.gpus, layout=lay, policy=get_policy("full_recompute"),
                profile="h100-sxm5-80gb", predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2})


def test_exports_set_torchtitans_flag_and_list_the_gap_elsewhere_and_the_executor_refuses():
    from memo_sim.export import export_plan
    from memo_exec.errors import ExecError
    from memo_exec.distributed.tp import flavour_for

    lay = replace_fsdp(Layout(tp=8, sp=True, tp_mode="async_tp"))
    tt = export_plan(_plan(lay), "torchtitan", price=False, nearest=True)
    src = tt.files["memo_torchtitan.py"]
    assert "enable_async_tensor_parallel = True" in src and "compile.enable = True" in src
    # the blocks compiled for async TP where the plan was priced on hand-fused kernels: said, with why (a review)
    assert lay.kernel_fusion != "compiled"
    assert [g for g in tt.gaps if g.what.startswith("async TP in blocks priced uncompiled")]
    mega = export_plan(_plan(Layout(tp=8, sp=True, tp_mode="async_tp", dp=4, zero=1)), "megatron", price=False,
                       nearest=True)
    assert any("async TP" in g.what for g in mega.gaps)
    with pytest.raises(ExecError) as e:
        flavour_for("async_tp")
    assert "tp_mode" in str(e.value) and "\n" not in str(e.value)
