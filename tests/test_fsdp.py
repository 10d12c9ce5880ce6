"""[modern-training] FSDP as its own data-parallel flavour (`memo_sim.dp.fsdp`): HSDP shard groups,
resharding after the forward or not, in memory and time (both tiers), the frameworks that run it,
the torchtitan export."""

from __future__ import annotations

import dataclasses

import pytest

from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.memory import model_state_parts
from memo_sim.cost import collectives as coll
from memo_sim.cost.param_split import layer_gpu_params
from memo_sim.layout.parallel import Layout, check_layout
from memo_sim.model.config import PRESETS, ModelConfig
from memo_sim.profile.loader import load_profile
from memo_sim.search.bound import lower_bound
from memo_sim.search.whatif import candidates_for, simulate_candidates

from bound_check import bounds_hold, sample

H100 = load_profile("h100-sxm5-80gb")
M = PRESETS["llama-3.1-8b"]
TOY = ModelConfig("toy", layers=8, hidden=2048, heads=16, ffn=8192, vocab=32000)


@pytest.mark.parametrize("layout,needle", [
    (Layout(dp=16, zero=1, dp_mode="fsdp"), "zero 3"),
    (Layout(dp=16, zero=3, dp_mode="fsdp", fsdp_shard=3), "must divide"),
    (Layout(dp=16, zero=3, fsdp_shard=4), "belong to dp_mode fsdp"),
    (Layout(dp=8, pp=2, zero=3, dp_mode="fsdp"), "reshard_after_forward off"),  # beside stages: tests/test_fsdp_pipeline.py
])
def test_fsdp_layouts_are_refused_in_one_line(layout, needle):
    why = check_layout(layout, M, 16, 8, 8192)
    assert why and needle in why and "\n" not in why, why


def test_fsdp_over_the_whole_group_is_zero3_but_for_the_working_weights_shard():
    """The same shards and collectives as ZeRO 3; FSDP2 keeps no bf16 shard beside the fp32 master (its fp32 shard is
    the parameter, cast to bf16 as it is all-gathered: a review found torchtitan's states 2 bytes a parameter over)."""
    z3, f = Layout(dp=32, zero=3), Layout(dp=32, zero=3, dp_mode="fsdp")
    a, b = model_state_parts(M, z3), model_state_parts(M, f)
    assert b["weights"] == 0 and a["weights"] == pytest.approx(M.recipe.weight_bytes * M.params() / 32, rel=1e-3)
    assert {k: v for k, v in a.items() if k != "weights"} == {k: v for k, v in b.items() if k != "weights"}
    assert sum(b.values()) == pytest.approx((4 + 4 + 8) * M.params() / 32 + b["gathered_layers"] + b["gathered_head"]
                                            + b["unsharded_grads"], rel=1e-3)
    # the output head gathered whole for the classifier, as ZeRO 3 gathers every unit it runs (a review: torchtitan
    # keeps its [norm, output] unit gathered through the loss, which memo counted nowhere)
    assert b["gathered_head"] == a["gathered_head"] == M.recipe.weight_bytes * M.vocab * M.hidden
    assert model_state_parts(M, Layout(dp=32, zero=2))["gathered_head"] == 0
    # the same collectives but the head's: ZeRO 3 (DeepSpeed) gathers it again for its backward, torchtitan keeps its
    # [norm, output] unit gathered (`memo_sim.dp.fsdp.Fsdp.regathers_head`)
    sz, sf = grad_sync(M, z3, H100), grad_sync(M, f, H100)
    assert sz.head_gather == pytest.approx(2 * sf.head_gather) and sf.head_gather > 0
    assert dataclasses.replace(sz, head_gather=0) == dataclasses.replace(sf, head_gather=0)
    # with the optimizer on the host the device keeps the working shard the host's step copies up (a review: FSDP with
    # optimizer offload held its weights nowhere)
    off = model_state_parts(M, Layout(dp=32, zero=3, dp_mode="fsdp", optimizer_offload=True))
    assert off["weights"] == a["weights"] and off["master_and_optimizer"] == 0


def test_zero2_and_3_hold_two_layers_and_the_heads_whole_gradients_before_their_reduce_scatter():
    """ZeRO 2 and 3 shard the gradients, but the backward writes each one whole before it is reduce-scattered into
    its shard: memo's executor keeps two layer workspaces (one being reduce-scattered under the next layer's
    backward) and its first unit (embedding, head) whole (`memo_exec.distributed.zero.GradSync`), DeepSpeed copies
    them into its two buckets, FSDP2 casts the unsharded gradient to its reduce dtype and keeps the reduce-scatter
    input until the next layer's post-backward; the simulator counted the shards alone once (the executor's estimate
    did not), then one layer's whole gradients (`memo_sim.cost.memory.unsharded_grad_units`)."""
    lay = Layout(dp=32, tp=2, zero=2)
    whole = M.recipe.grad_bytes * (2 * layer_gpu_params(M, lay).local + M.vocab * M.hidden / 2)
    for z, mode in ((2, "zero"), (3, "zero"), (3, "fsdp")):
        parts = model_state_parts(M, dataclasses.replace(lay, zero=z, dp_mode=mode))
        assert parts["unsharded_grads"] == pytest.approx(whole)
    assert model_state_parts(M, dataclasses.replace(lay, zero=1))["unsharded_grads"] == 0
    # a mixture of experts: the experts' share is two layers' routed experts (no head)
    moe = PRESETS["qwen3-30b-a3b"]
    ep = Layout(dp=16, ep=8, zero=2)
    assert model_state_parts(moe, ep, experts_only=True)["unsharded_grads"] == pytest.approx(
        moe.recipe.grad_bytes * 2 * layer_gpu_params(moe, ep).expert_local)
    assert model_state_parts(moe, ep)["unsharded_grads"] == pytest.approx(
        moe.recipe.grad_bytes * (2 * layer_gpu_params(moe, ep).local + moe.vocab * moe.hidden))
    # reduced one after the other, not beside the backward: one layer's
    serial = dataclasses.replace(lay, grad_overlap=False)
    assert model_state_parts(M, serial)["unsharded_grads"] == pytest.approx(
        M.recipe.grad_bytes * (layer_gpu_params(M, lay).local + M.vocab * M.hidden / 2))


def test_hsdp_shards_inside_the_node_and_reduces_across():
    lay = Layout(dp=32, zero=3, dp_mode="fsdp", fsdp_shard=8)
    g = grad_sync(M, lay, H100)
    nbytes = M.recipe.grad_reduce_bytes * layer_gpu_params(M, lay).local
    nv, ib = H100.nvlink, H100.internode
    want = (coll.ring_reduce_scatter_time(nbytes, 8, float(nv.bandwidth), float(nv.latency))
            + coll.allreduce_time(nbytes / 8, 4, float(ib.bandwidth), float(ib.latency)))
    assert g.layer_grad == pytest.approx(want)
    assert g.layer_gather == pytest.approx(coll.ring_allgather_time(
        M.recipe.weight_bytes * layer_gpu_params(M, lay).local, 8, float(nv.bandwidth), float(nv.latency)))
    whole = grad_sync(M, Layout(dp=32, zero=3, dp_mode="fsdp"), H100)
    assert g.layer_gather < whole.layer_gather  # NVLink inside the node, not the inter-node link
    # states: sharded 8 ways, not 32
    a, b = model_state_parts(M, lay), model_state_parts(M, Layout(dp=32, zero=3))
    assert a["master_and_optimizer"] == pytest.approx(4 * b["master_and_optimizer"])


def test_without_resharding_every_layer_keeps_its_weights_and_gathers_once():
    keep = Layout(dp=32, zero=3, dp_mode="fsdp", reshard_after_forward=False)
    on = Layout(dp=32, zero=3, dp_mode="fsdp")
    one = M.recipe.weight_bytes * layer_gpu_params(M, keep).local
    assert model_state_parts(M, keep)["gathered_layers"] == pytest.approx(M.layers * one)
    assert model_state_parts(M, on)["gathered_layers"] == pytest.approx(2 * one)
    assert grad_sync(M, on, H100).gather_in_backward and not grad_sync(M, keep, H100).gather_in_backward


def test_the_search_tries_fsdp_where_the_framework_runs_it_and_the_bound_holds():
    r = candidates_for(TOY, 16 * 1024, 16, H100, framework="torchtitan", policies=("store_all", "full_recompute"))
    modes = {(c.layout.dp_mode, c.layout.zero) for c in r.candidates}
    assert ("zero", 3) not in modes and ("fsdp", 3) in modes and ("zero", 0) in modes  # torchtitan: FSDP2 or DDP
    assert {c.layout.fsdp_shard for c in r.candidates if c.layout.dp_mode == "fsdp"} >= {0, 8}
    ok = [c for c in r.candidates if c.memory.status == "OK" and c.layout.dp_mode == "fsdp"]
    ok = sample(ok)
    assert len(bounds_hold(ok)) == len(ok)
    mega = candidates_for(TOY, 16 * 1024, 16, H100, framework="megatron")
    assert all(c.layout.dp_mode == "zero" for c in mega.candidates)


def test_torchtitan_export_sets_the_shard_and_replicate_degrees():
    from memo_sim.export import export_plan
    from memo_sim.plan.schema import Plan
    from memo_sim.policy import get_policy

    lay = Layout(dp=32, zero=3, dp_mode="fsdp", fsdp_shard=8, reshard_after_forward=False)
    plan = Plan(model=M, batch=1, seq_tokens=8192, gpus=32, layout=lay, policy=get_policy("full_recompute"),
                profile="h100-sxm5-80gb", predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.5},
                layer_timings_s={"forward": 0.1, "backward": 0.2})
    src = export_plan(plan, "torchtitan", price=False, nearest=True).files["memo_torchtitan.py"]
    assert "data_parallel_shard_degree = 8" in src and "data_parallel_replicate_degree = 4" in src
    assert "fsdp_reshard_after_forward = 'never'" in src


def test_the_default_search_keeps_the_frameworks_first_flavour_and_dp_mode_widens_it():
    r = candidates_for(TOY, 16 * 1024, 16, H100, policies=("store_all",))
    assert {c.layout.dp_mode for c in r.candidates} == {"zero"}  # any: ZeRO by default
    r = candidates_for(TOY, 16 * 1024, 16, H100, policies=("store_all",), dp_mode="all")
    fsdp = [c.layout for c in r.candidates if c.layout.dp_mode == "fsdp"]
    assert any(lay.fsdp_shard == 0 and lay.reshard_after_forward for lay in fsdp)  # plain FSDP, not ZeRO-3's twin
    from click.testing import CliRunner
    from memo_sim.cli import cli

    bad = CliRunner().invoke(cli, ["whatif", "--model", "llama-3.1-8b", "--gpus", "16", "--seq", "8K", "--no-plan",
                                   "--framework", "megatron", "--dp-mode", "fsdp"])
    assert bad.exit_code == 2 and "--dp-mode fsdp" in bad.output and "Traceback" not in bad.output


def test_a_mixture_of_experts_shards_under_fsdp_as_under_zero3_and_torchtitan_searches_it():
    """FSDP with MoE experts (torchtitan's default for its MoE models) is priced as ZeRO 3 shards it:
    the dense weights over the data group, the routed experts over their expert-data-parallel ranks;
    it was refused ('FSDP is priced for dense models'), so torchtitan's MoE search had no FSDP layout
    while `export --to torchtitan --nearest` wrote one. HSDP with experts is refused in one line; memo-exec runs
    FSDP with experts (tests/test_exec_moe.py)."""
    from memo_sim.plan.executor_scope import data_parallel_why_not
    from memo_sim.plan import Plan
    from memo_sim.policy import get_policy

    moe = dataclasses.replace(PRESETS["qwen3-30b-a3b"], layers=4)
    z3, f = Layout(dp=16, zero=3, ep=8), Layout(dp=16, zero=3, dp_mode="fsdp", ep=8)
    assert check_layout(f, moe, 16, 8, 8192) is None
    a, b = model_state_parts(moe, z3), model_state_parts(moe, f)  # but FSDP2's working weights (no bf16 shard)
    assert b["weights"] == 0 < a["weights"] and {k: v for k, v in a.items() if k != "weights"} == {
        k: v for k, v in b.items() if k != "weights"}
    assert dataclasses.replace(grad_sync(moe, z3, H100), head_gather=0) == dataclasses.replace(
        grad_sync(moe, f, H100), head_gather=0)  # but the head's gathers (above)
    why = check_layout(Layout(dp=16, zero=3, dp_mode="fsdp", fsdp_shard=8, ep=8), moe, 16, 8, 8192)
    assert why and "HSDP" in why and "\n" not in why
    r = candidates_for(moe, 8192, 16, H100, framework="torchtitan", policies=("full_recompute",), zero=3)
    assert r.candidates and all(c.layout.dp_mode == "fsdp" for c in r.candidates)
    assert any(c.layout.ep > 1 and c.layout.dp > 1 for c in r.candidates)
    plan = Plan(model=moe, batch=1, seq_tokens=8192, gpus=16, layout=f, policy=get_policy("full_recompute"),
                profile="h100-sxm5-80gb", predicted={"status": "OK", "iteration_s": 1.0, "mfu": 0.1},
                layer_timings_s={"forward": 0.1, "backward": 0.2})
    assert data_parallel_why_not(plan.layout, moe) is None  # memo-exec runs it


def test_torchtitan_shards_weights_over_its_context_parallel_ranks():
    """torchtitan applies FSDP over dp_replicate x (dp_shard x cp) whenever CP is on (parallelize.py at b5bcd76c,
    parallelize_llama.py at 9dec370): a plan of replicated weights beside CP 4 (ZeRO 0) was ranked first for
    torchtitan and exported as data_parallel_replicate_degree 4 while torchtitan shards the weights over the four
    CP ranks (a review). Such layouts, and shard groups that split the CP ranks, are not torchtitan's."""
    from memo_sim.layout.parallel import Layout
    from memo_sim.search.frameworks import get_framework

    for name in ("torchtitan", "torchtitan@2024-12"):
        fw = get_framework(name)
        assert "replicated over the 4 context-parallel ranks" in fw.why_not(Layout(tp=2, sp=True, cp=4, dp=4))
        assert fw.allows(Layout(tp=2, sp=True, cp=4, dp=4, zero=3, dp_mode="fsdp"))
        assert fw.allows(Layout(tp=2, sp=True, cp=4, dp=4, zero=3, dp_mode="fsdp", fsdp_shard=4))
        assert "not a multiple" in fw.why_not(Layout(tp=2, sp=True, cp=4, dp=4, zero=3, dp_mode="fsdp",
                                                     fsdp_shard=2))
        # no CP: replicated weights are torchtitan's HSDP over a shard group of one (replicate_fsdp); 9dec370's DDP
        # ran on a one-dimensional mesh in fp32 only, so torchtitan@2024-12 refuses them (layouts.ddp false)
        assert fw.allows(Layout(tp=2, sp=True, dp=4)) == (name == "torchtitan")
    assert get_framework("megatron").allows(Layout(tp=2, sp=True, cp=4, dp=4))
