"""FSDP beside pipeline stages, as torchtitan runs it (`memo_sim.dp.fsdp`): no resharding after the
forward, every weight gathered once per step, a stage's whole gradients kept (in the reduce dtype)
and reduce-scattered chunk by chunk after the chunk's last micro-batch backward; what the layout
rules, the memory, the event schedule, the search, the exports and the executor say of it."""

from __future__ import annotations

import pytest

from memo_sim.cost.sppo import stage_gpu_params, stage_model_state_bytes
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout, check_layout, enumerate_layouts
from memo_sim.model.config import ModelConfig
from memo_sim.policy.registry import get_policy
from memo_sim.profile.loader import load_profile
from memo_sim.search.whatif import candidates_for

from bound_check import bounds_hold, sample

H100 = load_profile("h100-sxm5-80gb")
TOY = ModelConfig("toy", layers=8, hidden=2048, heads=16, ffn=8192, vocab=32000, dtype="bf16")
KEEP = dict(zero=3, dp_mode="fsdp", reshard_after_forward=False)


@pytest.mark.parametrize("layout,needle", [
    (Layout(dp=8, pp=2, zero=3, dp_mode="fsdp"), "reshard_after_forward off"),
    (Layout(dp=8, pp=2, zero=3, dp_mode="fsdp", reshard_after_forward=False, fsdp_shard=4), "HSDP"),
    (Layout(dp=8, pp=2, zero=3), "ZeRO at most 1 with pp"),
    (Layout(dp=8, pp=2, zero=2), "ZeRO at most 1 with pp"),
])
def test_what_does_not_run_beside_stages_is_refused_in_one_line(layout, needle):
    why = check_layout(layout, TOY, 16, 8, 8192)
    assert why and needle in why and "\n" not in why, why


def test_fsdp_without_resharding_runs_beside_stages_and_the_search_offers_it():
    assert check_layout(Layout(dp=8, pp=2, **KEEP), TOY, 16, 8, 8192) is None
    valid, _ = enumerate_layouts(TOY, 16, 8, 8192, pp=2, zero=3, dp_modes=("fsdp",))
    assert valid and all(lay.dp_mode == "fsdp" and not lay.reshard_after_forward for lay in valid)
    valid, rejected = enumerate_layouts(TOY, 16, 8, 8192, pp=2, zero=3, dp_modes=("zero",))
    assert not valid and rejected


def test_a_stage_keeps_its_gathered_weights_and_its_gradients_in_the_reduce_dtype(monkeypatch):
    """A recipe keeping bf16 gradients but reducing in fp32 (every built-in one reduces in its gradient
    width): beside stages FSDP holds the whole gradients at the reduce width, ZeRO-1 at the gradient's."""
    from memo_sim.model import precision

    # the ZeRO paper's 16-bit gradients, reduced in fp32 here (the registry's entry swapped for the test)
    recipe = precision.PrecisionRecipe("zero", 2, 2, 4, 8, 4, "test: 16-bit gradients reduced in fp32")
    monkeypatch.setitem(precision.RECIPES, "zero", recipe)
    model = ModelConfig("toy", layers=8, hidden=2048, heads=16, ffn=8192, vocab=32000, dtype="bf16", precision="zero")
    assert model.recipe is recipe
    fsdp, z1 = Layout(dp=8, pp=2, **KEEP), Layout(dp=8, pp=2, zero=1)
    for s in range(2):
        local = stage_gpu_params(model, fsdp, s).local
        assert stage_model_state_bytes(model, fsdp, s) - stage_model_state_bytes(model, z1, s) == pytest.approx(
            2 * local)


def test_in_fp32_a_stage_keeps_each_weights_shard_beside_its_gathered_copy():
    """Without a master copy (fp32 working weights) the shard is the parameter FSDP2 gathers from into a new
    buffer: beside stages both are held, the shard over the data group (the executor's model states: reports
    of memo-exec run); with a master (bf16) the master's shard is that shard."""
    fsdp, z1 = Layout(dp=8, pp=2, **KEEP), Layout(dp=8, pp=2, zero=1)
    for dtype, extra in (("fp32", 4 / 8), ("bf16", 0.0)):
        model = ModelConfig("toy", layers=8, hidden=2048, heads=16, ffn=8192, vocab=32000, dtype=dtype)
        for s in range(2):
            # the same whole weights and gradients as ZeRO 1 (their reduce width is theirs) and the same sharded states
            want = stage_model_state_bytes(model, z1, s) + extra * stage_gpu_params(model, fsdp, s).local
            assert stage_model_state_bytes(model, fsdp, s) == pytest.approx(want), (dtype, s)


def test_in_fp32_experts_not_sharded_keep_no_second_copy():
    """Routed experts over an expert-data-parallel group of 1 (ep 2 over dp 2) are not sharded: no shard beside their
    gathered copy (memo-exec runs their states unsharded there), where the dense weights keep one (a review)."""
    moe = ModelConfig("toy-moe", layers=8, hidden=1024, heads=16, ffn=4096, vocab=32000, dtype="fp32", experts=4,
                      top_k=2, expert_ffn=1024)
    fsdp, z1 = Layout(dp=2, pp=2, ep=2, **KEEP), Layout(dp=2, pp=2, ep=2, zero=1)
    for s in range(2):
        assert stage_model_state_bytes(moe, fsdp, s, experts_only=True) == pytest.approx(
            stage_model_state_bytes(moe, z1, s, experts_only=True))
        assert stage_model_state_bytes(moe, fsdp, s) > stage_model_state_bytes(moe, z1, s)


def _grad_ops(layout):
    res = simulate(TOY, layout, 4, 4096, get_policy("full_recompute"), H100, schedule="1f1b", micro_batch=1,
                   record=True, keep_timeline=False)
    assert res.status == "OK"
    return res, res.ops


def test_a_chunks_gradients_are_reduced_after_its_last_backward_not_beside_it():
    res, ops = _grad_ops(Layout(dp=8, pp=2, **KEEP))
    for dev in {op.device for op in ops}:
        bwd_end = max(op.end for op in ops if op.device == dev and op.phase == "bwd" and op.layer is not None
                      and op.stream == "compute")
        grads = [op for op in ops if op.device == dev and op.phase == "grad_sync" and op.layer is not None]
        assert len(grads) == 4 and all(op.start >= bwd_end - 1e-12 for op in grads)
        gathers = [op for op in ops if op.device == dev and op.phase == "weight_gather"]
        # each layer's weights once, not once per micro-batch, and the end stage's unit (embedding or head) once
        assert len([op for op in gathers if op.layer is not None]) == 4 and len(gathers) == 5
        assert not [op for op in ops if op.device == dev and op.phase == "weight_gather_bwd"]
    # ZeRO-1 (Megatron's buckets) sends a layer's bucket beside the rest of the last backward
    _res, z1 = _grad_ops(Layout(dp=8, pp=2, zero=1))
    dev = z1[0].device
    bwd_end = max(op.end for op in z1 if op.device == dev and op.phase == "bwd" and op.stream == "compute")
    assert any(op.start < bwd_end for op in z1 if op.device == dev and op.phase == "grad_sync")


def test_the_search_prices_fsdp_pipelines_for_torchtitan_and_the_bound_holds():
    r = candidates_for(TOY, 8192, 16, H100, framework="torchtitan@2024-12", pp=2, micro_batch=1, global_batch=32,
                       policies=("full_recompute",))
    fsdp = [c for c in r.candidates if c.layout.pp == 2 and c.layout.dp_mode == "fsdp"]
    assert fsdp and all(not c.layout.reshard_after_forward for c in fsdp)
    ok = sample([c for c in fsdp if c.memory.status == "OK"], 3)
    assert ok and len(bounds_hold(ok)) == len(ok)


def test_the_torchtitan_export_keeps_the_weights_and_the_executor_runs_it():
    """The executor runs FSDP beside stages (tests/test_exec_fsdp.py against one process); it refused it before."""
    from memo_sim.export import export_plan
    from memo_sim.layout.schedule import executor_stage_limit
    from memo_sim.plan.schema import Plan
    from memo_sim.plan.executor_scope import plan_why_not

    lay = Layout(dp=8, pp=2, **KEEP)
    plan = Plan(model=TOY, batch=4, seq_tokens=4096, gpus=16, layout=lay, policy=get_policy("full_recompute"),
                profile="h100-sxm5-80gb", predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, schedule="1f1b")
    src = export_plan(plan, "torchtitan", price=False, nearest=True).files["memo_torchtitan.py"]
    assert "fsdp_reshard_after_forward = 'never'" in src and "pipeline_parallel_degree = 2" in src
    assert plan_why_not(TOY, lay, plan.policy, "1f1b", 4, 1, 4096) is None and executor_stage_limit(lay) is None


def test_a_whatif_fixing_zero3_beside_stages_answers_and_compares_memos_best():
    """ZeRO 3 with --pp under torchtitan is FSDP beside stages; memo's own best beside the framework's
    is searched over both data-parallel flavours then (ZeRO-3 itself does not run beside stages)."""
    from click.testing import CliRunner
    from memo_sim.cli import cli

    r = CliRunner().invoke(cli, ["whatif", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "128",
                                 "--layers", "4", "--pp", "2", "--dp", "2", "--batch", "2", "--schedule", "1f1b",
                                 "--zero", "3", "--framework", "torchtitan@2024-12", "--dtype", "fp32", "--seq", "512",
                                 "--jobs", "1", "--gpus", "4", "--no-plan", "--policy", "full_recompute"])
    assert r.exit_code == 0, r.output
    assert "fsdp-keep" in r.output and "memo's best:" in r.output


def test_the_analytic_tier_exposes_each_ranks_first_chunks_gradients_as_the_engine_does():
    """Interleaved, each chunk reduced after its last backward: the reduction left after a rank's
    backward is its chunk 0's (virtual stage s), so with chunks of 1, 1, 3, 3 layers (chunk 0 of both
    ranks one layer) the analytic tier exposes one layer's gradients where the even split (2 each)
    exposes two; in the engine chunk 0's reduction runs after the rank's last layer backward (beside the first
    stage's embedding backward; the other chunk's start earlier, each after that chunk's last backward, though some
    may wait for the link)."""
    from memo_sim.cost.sppo import stage_grad_sync
    from memo_sim.search.estimate import estimate_pipeline

    pol = get_policy("full_recompute")
    even, uneven = Layout(dp=8, pp=2, vpp=2, **KEEP), Layout(dp=8, pp=2, vpp=2, chunk_layers=(1, 1, 3, 3), **KEEP)
    est = {lay: estimate_pipeline(TOY, lay, 4, 1, 4096, pol, H100) for lay in (even, uneven)}
    grad = stage_grad_sync(TOY, even, H100).layer_grad
    assert grad > 0
    assert est[even].grad_sync_exposed_s - est[uneven].grad_sync_exposed_s == pytest.approx(grad, rel=1e-9)
    res = simulate(TOY, uneven, 4, 4096, pol, H100, schedule="interleaved_1f1b", micro_batch=1, record=True,
                   keep_timeline=False)
    assert res.status == "OK"
    for dev in {op.device for op in res.ops}:
        bwd_end = max(op.end for op in res.ops if op.device == dev and op.phase == "bwd" and op.stream == "compute"
                      and op.layer is not None)
        grads = {op.layer: op for op in res.ops if op.device == dev and op.phase == "grad_sync" and op.layer is not None}
        first = {0: 0, 1: 1}  # chunk 0's layer on each rank (virtual stages 0 and 1)
        chunk0 = [lay for lay in grads if lay in first.values()]
        assert len(chunk0) == 1 and grads[chunk0[0]].start >= bwd_end - 1e-12
        assert any(op.start < bwd_end for lay, op in grads.items() if lay not in first.values())
