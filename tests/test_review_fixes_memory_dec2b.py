"""Review fixes of 2026-12-02 (a hand count of model states): FSDP2's bf16 copies and whole gradients of a block's
routed experts where their expert-data-parallel group is one rank (ep = dp)."""

from __future__ import annotations

import dataclasses

from memo_sim.cost.memory import model_state_parts
from memo_sim.cost.param_split import layer_gpu_params
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS

MIXTRAL = PRESETS["mixtral-8x7b"]


def _parts(layout: Layout) -> dict[str, float]:
    return model_state_parts(MIXTRAL, layout, experts_only=True)


def test_fsdp_casts_a_one_rank_expert_groups_experts():
    """torchtitan puts a block's experts in its fully_shard unit whatever the expert mesh's size, and a one-rank
    mesh's unshard still casts them to bf16 (and its post-backward makes their whole gradient): under FSDP without
    resharding every layer's experts are held in bf16 beside their fp32 shard, one layer's whole fp32 gradient too
    (the review's count: 11.27 GB + 0.70 GB the states left out on Mixtral-8x7B, 8 GPUs, ep 8)."""
    keep = Layout(dp=8, ep=8, zero=3, dp_mode="fsdp", reshard_after_forward=False)
    assert keep.expert_dp == 1
    per_layer = layer_gpu_params(MIXTRAL, keep).expert_local
    assert per_layer == 8 * 3 * 4096 * 14336 / 8
    p = _parts(keep)
    assert p["gathered_layers"] == MIXTRAL.layers * 2 * per_layer  # every layer's bf16 experts, kept to its backward
    assert p["unsharded_grads"] == 4 * per_layer  # one layer's whole gradient in the fp32 reduce dtype
    resharded = _parts(dataclasses.replace(keep, reshard_after_forward=True))
    assert resharded["gathered_layers"] == 2 * 2 * per_layer  # this layer's and the prefetched one's


def test_zero3_with_a_working_copy_counts_a_one_rank_expert_group_once():
    """Where the flavour keeps a bf16 working copy (ZeRO-3 as DeepSpeed and Megatron hold it), a one-rank expert
    group's experts are whole in that copy already: no gathered or unsharded share on top."""
    z3 = Layout(dp=8, ep=8, zero=3)
    p = _parts(z3)
    per_layer = layer_gpu_params(MIXTRAL, z3).expert_local
    assert p["weights"] == 2 * MIXTRAL.layers * per_layer
    assert p["gathered_layers"] == 0 and p["unsharded_grads"] == 0
