"""FSDP2's copies on the compute stream (`Layout.fsdp_copies`, `memo_sim.cost.grad_sync.GradSync.layer_copy_out`):
each layer's gathered weights copied out of the all-gather's buffer before every forward and backward that gathers
them, its gradients copied into the reduce-scatter's input after its backward; set by torchtitan's framework data,
not by memo's own (its executor gathers into its parameters' own flat buffers)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memo_sim.cost.grad_sync import grad_sync
from memo_sim.cost.kernel_time import memory_bound_op_time
from memo_sim.cost.param_split import layer_gpu_params
from memo_sim.engine.simulate import simulate
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import PRESETS
from memo_sim.policy import get_policy
from memo_sim.profile import load_profile
from memo_sim.search.frameworks import get_framework

LLAMA = PRESETS["llama-3.1-8b"]
PROF = load_profile("h100-sxm5-96gb-500w")
FSDP = Layout(dp=8, zero=3, dp_mode="fsdp")


def test_torchtitan_sets_it_for_fsdp_alone_and_memos_own_data_does_not():
    for name in ("torchtitan", "torchtitan@2024-12"):
        fw = get_framework(name)
        assert fw.adapt(FSDP).fsdp_copies
        assert not fw.adapt(replace(FSDP, zero=0, dp_mode="fsdp")).fsdp_copies  # no gather, no reduce-scatter
    assert not get_framework("any").adapt(FSDP).fsdp_copies
    assert not get_framework("megatron").adapt(Layout(dp=8, zero=3)).fsdp_copies


def test_the_copies_read_and_write_a_layers_weights_and_gradients_at_their_widths():
    lay = replace(FSDP, fsdp_copies=True)
    m = get_framework("torchtitan@2024-12").for_model(LLAMA)
    sync, plain = grad_sync(m, lay, PROF), grad_sync(m, FSDP, PROF)
    p = layer_gpu_params(m, lay).local
    w, gr = m.recipe.weight_bytes, m.recipe.grad_reduce_bytes
    assert (w, gr) == (2, 4)  # bf16 gathers, fp32 reductions (torchtitan's mixed_precision_reduce)
    assert sync.layer_copy_out == pytest.approx(memory_bound_op_time(2 * w * p, PROF))
    assert sync.layer_copy_in == pytest.approx(memory_bound_op_time((w + gr) * p, PROF))
    assert plain.layer_copy_out == plain.layer_copy_in == 0
    assert sync.layer_gather == plain.layer_gather and sync.layer_grad == plain.layer_grad  # the collectives as before
    # ZeRO 1 over the same GPUs gathers once per step into Megatron's buffers: nothing
    z1 = grad_sync(m, Layout(dp=8, zero=1, fsdp_copies=True), PROF)
    assert z1.layer_copy_out == z1.layer_copy_in == 0


def test_the_simulated_step_runs_them_on_the_compute_stream_and_the_estimate_counts_them():
    from memo_sim.search.estimate import estimate_iteration

    m = get_framework("torchtitan@2024-12").for_model(LLAMA)
    lay = get_framework("torchtitan@2024-12").adapt(FSDP)
    pol = get_policy("full_recompute")
    on = simulate(m, lay, 2, 8192, pol, PROF, keep_timeline=True)
    off = simulate(m, replace(lay, fsdp_copies=False), 2, 8192, pol, PROF, keep_timeline=False)
    sync = grad_sync(m, lay, PROF)
    per_pass = m.layers * (2 * sync.layer_copy_out + sync.layer_copy_in)  # gathered again for the backward
    assert on.status == off.status == "OK"
    assert on.iteration_s - off.iteration_s == pytest.approx(per_pass, rel=0.05)
    copies = [e for e in on.timeline.events if e.op in ("fsdp_copy_out", "fsdp_copy_in")]
    assert len(copies) == 3 * m.layers and {e.stream for e in copies} == {"compute"}
    est_on = estimate_iteration(m, lay, 2, 8192, pol, PROF).iteration_s
    est_off = estimate_iteration(m, replace(lay, fsdp_copies=False), 2, 8192, pol, PROF).iteration_s
    assert est_on - est_off == pytest.approx(per_pass, rel=1e-6)


def test_the_plan_keeps_the_mechanism_and_memo_exec_names_it():
    from memo_exec.report import fsdp_copies_note

    lay = replace(FSDP, fsdp_copies=True)
    assert lay.to_dict()["fsdp_copies"] is True and "fsdp_copies" not in FSDP.to_dict()
    assert Layout.from_dict(lay.to_dict()) == lay

    class Plan:
        layout = lay

    assert "FSDP copies" in fsdp_copies_note(Plan())
    Plan.layout = FSDP
    assert fsdp_copies_note(Plan()) is None


def test_torchtitan_2024_12_steps_adam_as_foreach_kernels_and_memo_exec_names_it():
    from memo_exec.report import optimizer_impl_note

    assert get_framework("torchtitan@2024-12").adapt(FSDP).optimizer_impl == "foreach"
    assert get_framework("torchtitan").adapt(FSDP).optimizer_impl == "fused"  # b5bcd76c: implementation "fused"
    assert get_framework("any").adapt(FSDP).optimizer_impl == "fused"
    lay = replace(FSDP, optimizer_impl="foreach")
    assert lay.to_dict()["optimizer_impl"] == "foreach" and "optimizer_impl" not in FSDP.to_dict()

    class Plan:
        layout = lay

    assert "foreach" in optimizer_impl_note(Plan())
    Plan.layout = FSDP
    assert optimizer_impl_note(Plan()) is None
