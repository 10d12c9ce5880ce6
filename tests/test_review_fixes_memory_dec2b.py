"""Review fixes of 2026-12-02 (a hand count of model states and a monotonicity audit): FSDP2's bf16 copies and whole
gradients of a block's routed experts where their expert-data-parallel group is one rank (ep = dp); torchao eab345c's
FP8 weight copies saved by autograd to each layer's backward (torchtitan@2024-12); the analytic tier's weight gathers
hidden under the whole layer unit they run beside."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner

from memo_sim.cli import cli
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
    resharding every layer's experts are held in bf16 beside their fp32 shard, whole fp32 gradients too: one layer's
    (the review's count: 11.27 GB + 0.70 GB the states left out on Mixtral-8x7B, 8 GPUs, ep 8), two since the
    reduce-scatter input is held until the next layer's post-backward (`memo_sim.cost.memory.unsharded_grad_units`)."""
    keep = Layout(dp=8, ep=8, zero=3, dp_mode="fsdp", reshard_after_forward=False)
    assert keep.expert_dp == 1
    per_layer = layer_gpu_params(MIXTRAL, keep).expert_local
    assert per_layer == 8 * 3 * 4096 * 14336 / 8
    p = _parts(keep)
    assert p["gathered_layers"] == MIXTRAL.layers * 2 * per_layer  # every layer's bf16 experts, kept to its backward
    assert p["unsharded_grads"] == 2 * 4 * per_layer  # two layers' whole gradients in the fp32 reduce dtype
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


# ---- the analytic tier: a layer's weight gather hides under the unit it runs beside -----------------------------

def _analytic(profile: str) -> tuple[float, float]:
    r = CliRunner().invoke(cli, ["whatif", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "64K",
                                 "--tp", "4", "--sp", "--ep", "1", "--etp", "1", "--cp", "1", "--dp", "4", "--zero",
                                 "3", "--policy", "full_offload", "--schedule", "single_stage", "--profile", profile,
                                 "--json", "--no-plan"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["candidates"][0]
    return row["analytic_iteration_s"], row["simulated_iteration_s"]


def test_a_faster_gpu_does_not_lengthen_an_offload_bound_estimate():
    """A ZeRO-3 full-offload plan is host-copy bound: each layer's forward unit lasts as long as its offload, and the
    next layer's weight gather runs beside all of it. The estimate counted the gather exposed beside the compute
    alone, so the B200's shorter compute showed more of it (a review: 6.99 s on a B200 against 6.65 s on an H100,
    where the simulator ran the B200 faster)."""
    h100, b200 = _analytic("h100-sxm5-80gb"), _analytic("b200-180gb")
    assert b200[1] < h100[1]  # the simulator
    assert b200[0] < h100[0]  # and the estimate


# ---- torchtitan@2024-12's FP8 weights: saved by autograd, one copy a layer, held as the policy holds saved tensors --

def test_torchao_eab345c_fp8_weights_follow_the_layers_saved_tensors():
    """torchao eab345c's Float8Linear saves ``weight_fp8_t`` (one 1-byte copy of each linear weight) from the layer's
    forward to its backward: every layer's under store-all, the recomputed layer's alone under full recompute (its
    checkpoint saves nothing inside the block). memo counted two copies of the FSDP-gathered layers' as a per-step
    cache instead (a review: 8.1 GB too little at 22K under store-all on Llama-3.1-70B, FSDP 8 x TP 8, where the run
    would not fit; 17 GB too much under full recompute without resharding)."""
    from memo_sim.cost.activations import skeletal_bytes
    from memo_sim.cost.gemm_format import linear_params_on_gpu, saved_weight_bytes, weight_cache_bytes
    from memo_sim.frameworks import load_frameworks
    from memo_sim.memplan.footprint import memory_breakdown
    from memo_sim.policy.registry import get_policy
    from memo_sim.profile.loader import load_profile

    fw = load_frameworks()["torchtitan@2024-12"]
    assert fw.fp8_weights_saved
    m = fw.for_model(dataclasses.replace(PRESETS["llama-3.1-70b"], gemm_format="fp8-tensorwise"))
    assert m.fp8_weights_saved
    lay = Layout(tp=8, sp=True, dp=8, zero=3, dp_mode="fsdp")
    w = saved_weight_bytes(m, lay)
    assert abs(w - linear_params_on_gpu(m, lay, 1)) <= 8  # one byte an element and a scale
    assert weight_cache_bytes(m, m.layers, lay) == 0  # no per-step cache
    assert skeletal_bytes(m, lay, 1, 8192)["fp8_weights"] == w
    h100 = load_profile("h100-sxm5-80gb")
    store = get_policy("store_all")
    full = get_policy("full_recompute")
    assert store.kept_extras({"fp8_weights": w}) == [("fp8_weights", w)]
    assert full.kept_extras({"fp8_weights": w}) == [] and ("fp8_weights", w) in full.recompute_allocated(
        skeletal_bytes(m, lay, 1, 8192))
    bf = dataclasses.replace(m, gemm_format="bf16")
    kept = memory_breakdown(m, lay, 1, 8192, store, h100).skeletal_resident_bytes
    kept_full = memory_breakdown(m, lay, 1, 8192, full, h100).skeletal_resident_bytes
    # store-all: the FP8 inputs' saved copies as before, and every layer's weight copy beside them
    sk = skeletal_bytes(m, lay, 1, 8192)
    assert kept == m.layers * (sk["total"] + w)
    assert kept_full == m.layers * sk["input"]  # full recompute keeps the inputs alone
    assert memory_breakdown(m, lay, 1, 8192, full, h100).model_states_bytes == \
        memory_breakdown(bf, lay, 1, 8192, full, h100).model_states_bytes
