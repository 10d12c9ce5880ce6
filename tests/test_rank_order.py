"""The rank order (`memo_sim.layout.rank_order`): where a layout's pipeline stages and data-parallel replicas sit,
against the frameworks' own rules written out here, and what it changes: stage hops, gradient groups, expert
groups, hosts' stage mixes, the framework data, the exports and the executor's mesh."""

from collections import Counter
from dataclasses import replace

import pytest

from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.moe import step_link
from memo_sim.cost.sppo import p2p_link, stage_grad_sync
from memo_sim.errors import MemoError
from memo_sim.layout.parallel import (
    Layout, expert_group_ranks, node_stage_gpus, stage_first_rank, stage_hop_crosses_nodes, stage_rank,
)
from memo_sim.layout.rank_order import DEFAULT_RANK_ORDER, RANK_ORDER_NAMES, data_group_stride, stage_of_rank
from memo_sim.model.config import get_model
from memo_sim.profile.loader import load_profile
from memo_sim.search.frameworks import get_framework

H100 = load_profile("h100-sxm5-80gb")
OLD = "tp-cp-pp-dp"  # Megatron-LM's --use-tp-pp-dp-mapping


def megatron_2021_groups(world: int, tp: int, pp: int) -> tuple[list[list[int]], list[list[int]]]:
    """Megatron-LM's initialize_model_parallel (mpu/initialize.py, 2021), written out: the pipeline groups are
    range(i, world, world // pp); stage i's ranks are the block [i * world/pp, (i+1) * world/pp), whose data
    groups take every tp-th rank."""
    per_stage = world // pp
    pipes = [list(range(i, world, per_stage)) for i in range(per_stage)]
    data = [list(range(i * per_stage + j, (i + 1) * per_stage, tp)) for i in range(pp) for j in range(tp)]
    return pipes, data


def groups_from_coords(lay: Layout, vary: str) -> list[list[int]]:
    """The groups of ranks differing only in dimension ``vary`` under memo's order."""
    out: dict = {}
    for r in range(lay.gpus):
        key = (stage_of_rank(lay, r), r % lay.stage_stride) if vary == "dp" else (r % stage_first_rank(lay, 1)
                                                                                  if lay.pp > 1 else r)
        out.setdefault(key, []).append(r)
    return sorted(sorted(g) for g in out.values())


@pytest.mark.parametrize("tp,pp,dp", [(2, 4, 4), (8, 4, 2), (1, 2, 8), (4, 3, 2)])
def test_the_default_order_numbers_ranks_as_megatron_lm(tp, pp, dp):
    lay = Layout(tp=tp, pp=pp, dp=dp)
    pipes, data = megatron_2021_groups(lay.gpus, tp, pp)
    assert groups_from_coords(lay, "pp") == sorted(pipes)
    assert groups_from_coords(lay, "dp") == sorted(data)
    # stage 0's GPUs over every replica (where expert groups fold) are its block of consecutive ranks
    assert [stage_rank(lay, i) for i in range(tp * dp)] == list(range(tp * dp))


def test_data_parallelism_outermost_keeps_a_replicas_stages_consecutive():
    lay = Layout(tp=2, pp=4, dp=4, rank_order=OLD)
    assert [stage_first_rank(lay, s) for s in range(4)] == [0, 2, 4, 6]
    assert [stage_rank(lay, i) for i in range(8)] == [0, 1, 8, 9, 16, 17, 24, 25]
    assert [stage_of_rank(lay, r) for r in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0]
    assert data_group_stride(lay) == 8 and data_group_stride(Layout(tp=2, pp=4, dp=4)) == 2


def test_stage_hops_and_data_groups_follow_the_order():
    """tp2 x pp4 x dp4 on 8-GPU nodes: stages outermost put a stage's 4 replicas in one node (its gradients over
    NVLink, every stage hop across nodes); data parallelism outermost the reverse."""
    llama = get_model("llama-3.1-8b")
    new, old = Layout(tp=2, pp=4, dp=4), Layout(tp=2, pp=4, dp=4, rank_order=OLD)
    assert all(stage_hop_crosses_nodes(new, s, 8) for s in range(3))
    assert not any(stage_hop_crosses_nodes(old, s, 8) for s in range(3))
    assert p2p_link(new, H100, 0) == "internode" and p2p_link(old, H100, 0) == "nvlink"
    assert stage_grad_sync(llama, new, H100).link == "nvlink"
    assert stage_grad_sync(llama, old, H100).link == "internode"
    assert stage_grad_sync(llama, new, H100).layer_grad < stage_grad_sync(llama, old, H100).layer_grad
    # a single stage: the order changes nothing
    one = Layout(tp=2, dp=16)
    assert grad_sync(llama, one, H100) == grad_sync(llama, replace(one, rank_order=OLD), H100)


def test_expert_groups_fold_over_the_stages_block():
    new, old = Layout(dp=8, pp=2, ep=8), Layout(dp=8, pp=2, ep=8, rank_order=OLD)
    assert expert_group_ranks(new, 8, 1) == list(range(8))
    assert expert_group_ranks(old, 8, 1) == list(range(0, 16, 2))
    assert step_link("ep", new, H100) is H100.nvlink and step_link("ep", old, H100) is H100.internode


@pytest.mark.parametrize("order", RANK_ORDER_NAMES)
@pytest.mark.parametrize("tp,cp,pp,dp,gpn", [(8, 1, 8, 2048, 8), (2, 1, 16, 3000, 8), (4, 2, 4, 6, 8),
                                            (1, 1, 5, 8, 4), (2, 2, 36, 1000, 8),
                                            (1, 5, 27, 8, 8)])
def test_node_stage_mixes_are_every_nodes(order, tp, cp, pp, dp, gpn):
    """`node_stage_gpus` lists only a few nodes of a big cluster: their mixes are exactly the distinct mixes of
    every node (counted rank by rank here), and the node of every stage's first GPU is among them."""
    lay = Layout(tp=tp, cp=cp, pp=pp, dp=dp, rank_order=order)
    every: dict[int, Counter] = {}
    for r in range(lay.gpus):
        every.setdefault(r // gpn, Counter())[stage_of_rank(lay, r)] += 1
    listed = node_stage_gpus(lay, gpn)
    for n, mix in listed.items():
        assert mix == dict(every[n])
    assert {frozenset(m.items()) for m in listed.values()} == {frozenset(m.items()) for m in every.values()}
    assert all(stage_first_rank(lay, s) // gpn in listed for s in range(pp))


def test_layouts_read_and_write_the_order():
    assert "rank_order" not in Layout(pp=2, dp=2).to_dict()
    assert Layout.from_dict(Layout(pp=2, dp=2, rank_order=OLD).to_dict()).rank_order == OLD
    assert Layout.from_dict({"pp": 2}).rank_order == DEFAULT_RANK_ORDER
    with pytest.raises(MemoError, match="rank_order") as e:
        Layout.from_dict({"pp": 2, "rank_order": "pp-dp-tp"})
    assert "\n" not in str(e.value)
    assert "ranks-tp-cp-pp-dp" in Layout(pp=2, dp=2, rank_order=OLD).label()
    # one replica, or one stage: both orders number ranks alike, so the layout is the default's (one cache key)
    assert Layout(pp=2, rank_order=OLD) == Layout(pp=2) and Layout(dp=4, rank_order=OLD) == Layout(dp=4)


def test_frameworks_offer_the_orders_they_number_ranks_in():
    lay = Layout(pp=2, dp=2, rank_order=OLD)
    assert get_framework("megatron").why_not(lay) is None
    for name in ("torchtitan", "deepspeed"):
        why = get_framework(name).why_not(lay)
        assert why and "rank order tp-cp-pp-dp" in why
        assert get_framework(name).why_not(Layout(pp=2, dp=2)) is None


def test_megatron_export_writes_the_mapping_option_and_torchtitan_prices_its_own_order():
    from memo_sim.export import export_plan
    from memo_sim.plan.schema import Plan
    from memo_sim.policy import get_policy

    def plan(order):
        lay = Layout(tp=4, pp=4, dp=2, zero=1, rank_order=order)
        return Plan(model=get_model("llama-3.1-70b"), batch=8, seq_tokens=8192, gpus=lay.gpus, layout=lay,
                    policy=get_policy("full_recompute"), profile="h100-sxm5-80gb",
                    predicted={"status": "OK", "iteration_s": 10.0, "mfu": 0.5},
                    layer_timings_s={"forward": 0.1, "backward": 0.2}, micro_batch=1, schedule="1f1b")

    assert "--use-tp-pp-dp-mapping" in export_plan(plan(OLD), "megatron", price=False).files["megatron.sh"]
    assert "--use-tp-pp-dp-mapping" not in export_plan(plan(DEFAULT_RANK_ORDER), "megatron",
                                                       price=False).files["megatron.sh"]
    ex = export_plan(plan(OLD), "torchtitan", price=False, nearest=True)
    gap = [g for g in ex.gaps if "ranks numbered" in g.what]
    assert len(gap) == 1 and gap[0].change.layout == {"rank_order": DEFAULT_RANK_ORDER}
    assert not [g for g in export_plan(plan(DEFAULT_RANK_ORDER), "torchtitan", price=False, nearest=True).gaps
                if "ranks numbered" in g.what]


def test_the_executors_mesh_follows_the_order():
    pytest.importorskip("torch")
    from memo_exec.distributed.context import coords_of, mesh_dims, mesh_shape, rank_of

    new, old = Layout(tp=2, pp=2, dp=2), Layout(tp=2, pp=2, dp=2, rank_order=OLD)
    assert mesh_dims(new)[:2] == ("pp", "dp") and mesh_dims(old)[:2] == ("dp", "pp")
    assert mesh_shape(new) == (2, 2, 1, 1, 2)
    for lay in (new, old):
        for r in range(lay.gpus):
            c = coords_of(r, lay)
            assert rank_of(c, lay) == r and stage_of_rank(lay, r) == c["pp"]
            assert r % 2 == c["tp"]
    assert coords_of(2, new)["dp"] == 1 and coords_of(2, old)["pp"] == 1


def test_the_what_if_tries_megatrons_mapping_where_asked_and_refuses_it_where_not_offered():
    """--rank-order all: each pipeline with data parallelism whose stage is smaller than a node is tried in both
    orders (the answer names Megatron-LM's --use-tp-pp-dp-mapping by its label); by default only the framework's
    first; a framework that does not number ranks so refuses it in one line (exit 2)."""
    from click.testing import CliRunner

    from memo_sim.cli import cli

    args = ["whatif", "--model", "gpt-7b", "--gpus", "32", "--seq", "32K", "--tp", "2", "--pp", "4",
            "--profile", "h100-sxm5-80gb", "--no-plan", "--schedule", "1f1b",
            "--policy", "store_all"]  # the rows the test reads (and the answer): one policy keeps it cheap
    both = CliRunner().invoke(cli, args + ["--framework", "megatron", "--rank-order", "all"])
    assert both.exit_code == 0, both.output
    assert "ranks-tp-cp-pp-dp" in both.output and "rank orders tp-cp-dp-pp, tp-cp-pp-dp" in both.output
    rows = [ln for ln in both.output.splitlines() if "-dp4-" in ln and "store_all" in ln and "1f1b" in ln]
    assert any("ranks-tp-cp-pp-dp" in r for r in rows) and any("ranks-" not in r for r in rows)
    plain = CliRunner().invoke(cli, args + ["--framework", "megatron"])
    assert plain.exit_code == 0 and "ranks-" not in plain.output and "rank orders" not in plain.output
    # ... and says what it did not try for its pipeline answer
    assert ("rank order: ranks numbered tp-cp-dp-pp only; this pipeline's stages and replicas sit on other nodes in "
            "tp-cp-pp-dp (--use-tp-pp-dp-mapping): --rank-order all tries it") in plain.output
    assert "rank order: " not in both.output
    bad = CliRunner().invoke(cli, args + ["--framework", "torchtitan", "--rank-order", "tp-cp-pp-dp"])
    assert bad.exit_code == 2 and "--rank-order tp-cp-pp-dp: torchtitan numbers ranks tp-cp-dp-pp" in bad.output
    assert "Traceback" not in bad.output


def test_data_outermost_rules_megatrons_equal_groups_and_memos_expert_groups_inside_a_replica():
    """Megatron-Core (parallel_state.py at d98e8a64) asserts, in an order not ending in pp with stages, equal expert
    and dense data-parallel sizes: etp x ep = tp x cp (a dense model's ETP being TP: cp 1); memo itself prices a
    pipelined MoE layer on a replica's stage shard, so there the expert groups must fit a replica's stage."""
    from memo_sim.layout.parallel import check_layout

    mega = get_framework("megatron")
    assert mega.why_not(Layout(tp=2, pp=2, dp=2, rank_order=OLD)) is None
    assert "must be equal" in mega.why_not(Layout(tp=2, cp=2, pp=2, dp=2, rank_order=OLD))
    assert mega.why_not(Layout(tp=2, pp=2, dp=2, ep=2, rank_order=OLD)) is None
    assert "expert groups of 4 ranks" in mega.why_not(Layout(tp=2, pp=2, dp=2, ep=4, rank_order=OLD))
    assert get_framework("any").why_not(Layout(tp=2, cp=2, pp=2, dp=2, rank_order=OLD)) is None
    qwen = get_model("qwen3-30b-a3b")
    why = check_layout(Layout(tp=2, pp=2, dp=4, ep=4, rank_order=OLD), qwen, 16, 8, 4096)
    assert why and "must divide a replica's 2 GPUs" in why
    assert check_layout(Layout(tp=2, pp=2, dp=4, ep=4), qwen, 16, 8, 4096) is None
    assert check_layout(Layout(tp=2, pp=2, dp=4, ep=2, rank_order=OLD), qwen, 16, 8, 4096) is None


def test_a_data_group_strided_over_stages_spans_its_ranks_nodes():
    """tp1 x cp2 x pp2 x dp2, data parallelism outermost: the data group {0, 1, 4, 5} sits in one 8-GPU node."""
    llama = get_model("llama-3.1-8b")
    lay = Layout(cp=2, pp=2, dp=2, rank_order=OLD)
    ranks = sorted(r for r in range(lay.gpus) if stage_of_rank(lay, r) == 0)
    assert ranks == [0, 1, 4, 5]
    assert stage_grad_sync(llama, lay, H100).link == "nvlink"
    assert stage_grad_sync(llama, Layout(cp=2, pp=2, dp=8, rank_order=OLD), H100).link == "internode"
