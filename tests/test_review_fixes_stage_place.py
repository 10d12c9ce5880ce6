"""A pipeline stage's shard (`stage_shard`, pp = dp = 1: what one GPU of a stage runs, the layout the pipeline and
the search price a stage's layers on) keeps where its whole layout puts the stage's groups. It had lost it: a later
stage's expert group of 16 (GPUs 64-79 of 64-GPU stages) or CP group across a 72-GPU NVLink domain was priced as
the first stage's, inside the domain, and a single-stage CP 16 over 144 GPUs looked at its first group only."""

from __future__ import annotations

from memo_sim.cost import collectives as coll
from memo_sim.cost.moe import ep_alltoall_time, step_link
from memo_sim.engine.schedules.single_stage import collective_link
from memo_sim.engine.schedules.microbatch import pipeline_costs
from memo_sim.layout.parallel import Layout, expert_group_placements, placed_gpus, stage_shard
from memo_sim.model.config import PRESETS
from memo_sim.cost.layer_time import forward_costs
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile
from dataclasses import replace

NVL72 = load_profile("gb200-nvl72")  # racks of 72 GPUs, one NVLink domain each
QWEN3 = replace(PRESETS["qwen3-30b-a3b"], layers=4)
LLAMA = replace(PRESETS["llama-3.1-8b"], layers=4)


def test_a_stage_shard_places_its_expert_groups_as_the_whole_layout():
    """EP 16 over two stages of 64 GPUs: stage 1's GPUs 64-127 hold the group 64-79, 8 GPUs on each side of
    rank 72; the shard's placements are the whole layout's, not its first stage's alone (``(16,)``)."""
    whole = Layout(dp=64, pp=2, zero=1, ep=16)
    shard = stage_shard(whole)
    assert expert_group_placements(whole, 16, 1, 72) == ((8, 8), (16,))
    assert expert_group_placements(shard, 16, 1, 72) == ((8, 8), (16,))
    assert step_link("ep", shard, NVL72) is NVL72.internode
    inside = stage_shard(Layout(dp=64, pp=1, zero=1, ep=16))  # one stage: every group inside rack 0
    assert step_link("ep", inside, NVL72) is NVL72.nvlink
    size = 64 << 20
    assert ep_alltoall_time(size, shard, NVL72) == ep_alltoall_time(size, whole, NVL72)
    assert ep_alltoall_time(size, shard, NVL72) > 2 * ep_alltoall_time(size, inside, NVL72)


def test_a_later_stages_cp_group_across_the_domain_rides_the_internode_link():
    """CP 16 over 64-GPU stages: stage 1's first CP group is GPUs 64-79 (across 72); a single stage of CP 16 x
    DP 9 has it too. Both shards' ring collectives ride the inter-node link, as the whole layouts' groups do."""
    for whole in (Layout(cp=16, dp=4, pp=2, zero=1), Layout(cp=16, dp=9, zero=3)):
        lay = stage_shard(whole) if whole.pp > 1 else whole
        assert placed_gpus(lay) == whole.gpus
        assert coll.layout_group_link(NVL72, lay, 16, 1) is NVL72.internode
        ring = [c for c in forward_costs(LLAMA, lay, 1, 256 * 1024, NVL72) if c.stream == "cp_comm"]
        assert ring and all(collective_link(c, lay, NVL72) == "internode" for c in ring)
    one_rack = Layout(cp=16, dp=4, zero=3)  # 64 GPUs: every group inside rack 0
    assert coll.layout_group_link(NVL72, one_rack, 16, 1) is NVL72.nvlink


def test_the_pipeline_prices_the_later_stages_expert_dispatch():
    """The micro-batch pipeline's layer costs (on the stage's shard) price stage 1's dispatch across racks:
    slower than the same stages' with every group inside a rack (EP 8: 8 divides 64 and 72)."""
    policy = get_policy("store_all")
    cross = Layout(dp=64, pp=2, zero=1, ep=16)
    inside = Layout(dp=64, pp=2, zero=1, ep=8)
    t_cross = pipeline_costs(QWEN3, cross, 1, 4096, policy, NVL72)
    t_inside = pipeline_costs(QWEN3, inside, 1, 4096, policy, NVL72)
    a2a = lambda pc: sum(c.seconds for c in pc.forward if c.name.startswith("moe_"))  # noqa: E731
    assert a2a(t_cross) > 2 * a2a(t_inside)


def test_a_plan_file_never_holds_a_shards_place():
    """``stage_place`` is derived each time a shard is made: never written to a plan, and a whole layout given
    one drops it."""
    whole = Layout(dp=64, pp=2, zero=1, ep=16)
    assert "stage_place" not in stage_shard(whole).to_dict()
    assert replace(stage_shard(whole), pp=2, dp=64).stage_place == ()
    assert Layout.from_dict(whole.to_dict()) == whole
