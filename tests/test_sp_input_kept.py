"""torch's tensor parallelism keeps the all-gathered input of a column-parallel GEMM for its weight gradient
(``Layout.sp_input_kept``: torchtitan's ColwiseParallel after a PrepareModuleInput / in_dst_shardings all-gather):
no backward re-gather is priced, and the layer keeps the full-length tensor where Megatron-LM keeps the rank's shard.
memo's executor runs either as the plan says (dense layers, store-all and full recompute) and refuses the rest in one
line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.activations import kept_scale, skeletal_bytes, tensor_bytes
from memo_sim.cost.layer_time import backward_costs, forward_costs
from memo_sim.frameworks import load_frameworks, mechanism_changes
from memo_sim.layout.parallel import Layout
from memo_sim.memplan.trace_gen import layer_backward_trace, layer_forward_trace
from memo_sim.model.config import PRESETS
from memo_sim.model.layer_graph import layer_tensors, sp_kept_inputs
from memo_sim.plan.executor_scope import plan_why_not
from memo_sim.policy import get_policy
from memo_sim.profile.loader import load_profile

H100 = load_profile("h100-sxm5-80gb")
MODEL = PRESETS["llama-3.1-8b"]
MEGATRON = Layout(tp=4, sp=True)
KEPT = replace(MEGATRON, sp_input_kept=True)
SEQ = 8192


def _names(costs) -> set[str]:
    return {c.name for c in costs}


@pytest.mark.parametrize("name", ["torchtitan", "torchtitan@2024-12"])
def test_torchtitan_keeps_the_gathered_inputs_and_megatron_does_not(name):
    fws = load_frameworks()
    assert fws[name].adapt(MEGATRON).sp_input_kept
    for other in ("megatron", "any", "deepspeed"):
        assert not fws[other].adapt(MEGATRON).sp_input_kept
    # and an export between the two says so
    changes = mechanism_changes(fws["megatron"].adapt(MEGATRON), fws[name].adapt(MEGATRON), H100)
    assert "sp_input_kept False -> True" in changes
    assert not any(c.startswith("sp_regather_overlap") for c in changes)  # moot: nothing is gathered again


def test_no_backward_regather_where_the_gathered_input_is_kept():
    bwd_meg = _names(backward_costs(MODEL, MEGATRON, 1, SEQ, H100))
    bwd_kept = _names(backward_costs(MODEL, KEPT, 1, SEQ, H100))
    regathers = {n for n in bwd_meg if n.startswith("allgather_") and n.endswith("_input")}
    assert regathers  # Megatron's re-gather of the qkv and fc1 inputs
    assert bwd_kept == bwd_meg - regathers
    # the forward is the same: one all-gather per gathered input either way
    fwd_meg, fwd_kept = forward_costs(MODEL, MEGATRON, 1, SEQ, H100), forward_costs(MODEL, KEPT, 1, SEQ, H100)
    assert [(c.name, c.seconds) for c in fwd_meg] == [(c.name, c.seconds) for c in fwd_kept]


def test_the_layer_keeps_the_full_length_input_in_place_of_its_shard():
    assert dict(sp_kept_inputs(MODEL)) == {"ln1": 0, "ln2": 0}
    tens = layer_tensors(MODEL)
    shard = sum(tensor_bytes(tens[n], MEGATRON, 1, SEQ) for n in ("ln1", "ln2"))
    more = skeletal_bytes(MODEL, KEPT, 1, SEQ)["total"] - skeletal_bytes(MODEL, MEGATRON, 1, SEQ)["total"]
    assert more == pytest.approx(shard * (MEGATRON.tp - 1))
    assert kept_scale("ln1", MODEL, KEPT) == MEGATRON.tp and kept_scale("q", MODEL, KEPT) == 1
    # nothing changes without TP or without SP
    for lay in (Layout(tp=1, sp_input_kept=True), Layout(tp=4, sp=False, sp_input_kept=True)):
        assert kept_scale("ln1", MODEL, lay) == 1


def test_a_router_beside_shared_experts_keeps_its_shard_too():
    """A MoE layer with shared experts gathers the pre-MLP norm's output for them while its router reads the rank's
    own shard: the layer keeps both."""
    model = PRESETS["qwen2-moe-a2.7b"]
    assert sp_kept_inputs(model).get("ln2") == 1
    assert kept_scale("ln2", model, KEPT) == KEPT.tp + 1


def test_the_traces_allocate_no_gather_buffer_the_saved_tensor_already_is():
    def gathers(trace):
        return {b.name for b in trace.buffers if b.name and ("_input_gathered" in b.name or "_regathered" in b.name)}

    assert gathers(layer_forward_trace(MODEL, MEGATRON, 1, SEQ)) == {"qkv_input_gathered", "fc1_input_gathered"}
    assert gathers(layer_backward_trace(MODEL, MEGATRON, 1, SEQ)) == {"qkv_input_regathered", "fc1_input_regathered"}
    assert not gathers(layer_forward_trace(MODEL, KEPT, 1, SEQ))
    assert not gathers(layer_backward_trace(MODEL, KEPT, 1, SEQ))


def test_latent_attention_gathers_only_what_sequence_parallelism_gathers():
    """The traces' gather buffers follow `layer_graph.sp_regathered`, the cost's rule: MLA's up-projections read the
    latents, computed on the gathered tokens already, so nothing is gathered for them (the trace gave each a
    hidden-wide buffer before)."""
    model = PRESETS["deepseek-v2-lite"]
    names = {b.name for b in layer_forward_trace(model, MEGATRON, 1, 4096).buffers if b.name}
    assert not {n for n in names if n.startswith(("kv_up", "q_up")) and n.endswith("_input_gathered")}
    assert any(n.endswith("_input_gathered") for n in names)


def test_the_executor_runs_kept_dense_layers_and_refuses_the_rest_in_one_line():
    """memo's executor keeps the gathered inputs in a dense layer's storage under store-all and full recompute
    (`memo_exec.layer.storage_shapes`; tests/test_dist_exec.py checks their gradients on gloo ranks); a token-wise
    policy, a MoE block or multi-token-prediction modules are refused in one line naming the field."""
    for pol in ("store_all", "full_recompute"):
        assert plan_why_not(MODEL, KEPT, get_policy(pol), "single_stage", 1, 1, SEQ) is None
    refused = [(MODEL, "memo", "policy memo"), (PRESETS["qwen3-30b-a3b"], "store_all", "experts = 128"),
               (replace(MODEL, mtp_layers=1), "store_all", "mtp_layers = 1")]
    for model, pol, words in refused:
        why = plan_why_not(model, KEPT, get_policy(pol, 0.5 if pol == "memo" else None), "single_stage", 1, 1, SEQ)
        assert why and "\n" not in why and f"sp_input_kept with {words}" in why and "--framework any or megatron" in why
    assert plan_why_not(MODEL, MEGATRON, get_policy("memo", 0.5), "single_stage", 1, 1, SEQ) is None


def test_the_plan_field_round_trips_and_is_left_out_when_off():
    assert "sp_input_kept" not in MEGATRON.to_dict()
    d = KEPT.to_dict()
    assert d["sp_input_kept"] is True
    assert Layout.from_dict(d) == KEPT
    assert "sp-kept" in KEPT.label() and "sp-kept" not in MEGATRON.label()
