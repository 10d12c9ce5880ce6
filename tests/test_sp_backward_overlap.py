"""Megatron-LM's column-parallel backward under sequence parallelism (``sp_regather_overlap``): the input re-gathered
beside the data-gradient matmul, the input gradient reduce-scattered beside the weight-gradient matmul
(LinearWithGradAccumulationAndAsyncCommunication.backward; TransformerEngine's linears alike), so the GEMM is priced
as its two kernels and each collective hides under one of them; memo's executor (the flag off) runs both before the
GEMM that needs them."""

import pytest

from memo_sim.cost.layer_time import backward_costs, critical_time
from memo_sim.layout.parallel import Layout
from memo_sim.model.config import get_model
from memo_sim.profile import load_profile

MODEL = get_model("llama-3.1-8b")
PROF = load_profile("h100-sxm5-80gb")


def _costs(**kw):
    return backward_costs(MODEL, Layout(tp=8, sp=True, **kw), 1, 8192, PROF)


def test_the_gemm_is_split_and_each_collective_sits_beside_one_kernel():
    off, on = _costs(), _costs(sp_regather_overlap=True)
    names = [c.name for c in on]
    by = {c.name: c for c in off}
    for gemm, norm in (("fc1", "ln2"), ("qkv", "ln1")):
        i = names.index(gemm)
        assert names[i - 1] == f"allgather_{gemm}_input" and on[i - 1].overlaps == 1
        assert names[i + 1] == f"reducescatter_{norm}" and on[i + 1].overlaps == 1
        assert names[i + 2] == f"{gemm}_wgrad" and names[i + 3] == norm
        assert on[i].seconds + on[i + 2].seconds == pytest.approx(by[gemm].seconds)
        assert on[i].seconds == pytest.approx(on[i + 2].seconds)
    assert not any(n.endswith("_wgrad") for n in (c.name for c in off))
    assert all(c.overlaps == 0 for c in off)


def test_the_critical_path_loses_what_each_kernel_hides():
    off, on = _costs(), _costs(sp_regather_overlap=True)
    by = {c.name: c.seconds for c in off}
    hidden = sum(min(by[f"allgather_{g}_input"], by[g] / 2) + min(by[f"reducescatter_{n}"], by[g] / 2)
                 for g, n in (("fc1", "ln2"), ("qkv", "ln1")))
    assert hidden > 0
    assert critical_time(on) == pytest.approx(critical_time(off) - hidden)


def test_async_tp_and_kept_inputs_are_not_split():
    assert not any(c.name.endswith("_wgrad") and c.name.startswith("fc1")
                   for c in _costs(sp_regather_overlap=True, sp_input_kept=True))
    async_tp = backward_costs(MODEL, Layout(tp=8, sp=True, tp_mode="async_tp", sp_regather_overlap=True), 1, 8192,
                              PROF)
    assert all(c.name != "reducescatter_ln2" or c.overlaps == 0 for c in async_tp)


def test_tp_alone_runs_the_input_gradients_all_reduce_beside_the_weight_gradient():
    # megatron/mpu/layers.py at bbab79f869: without SP, async_grad_allreduce issues the all-reduce of the input
    # gradient before the weight-gradient matmul (on unless --no-async-tensor-model-parallel-allreduce)
    off = backward_costs(MODEL, Layout(tp=8, sp=False), 1, 8192, PROF)
    on = backward_costs(MODEL, Layout(tp=8, sp=False, sp_regather_overlap=True), 1, 8192, PROF)
    names = [c.name for c in on]
    by = {c.name: c.seconds for c in off}
    for gemm, norm in (("fc1", "ln2"), ("qkv", "ln1")):
        i = names.index(gemm)
        assert names[i + 1] == f"allreduce_{norm}" and on[i + 1].overlaps == 1 and names[i + 2] == f"{gemm}_wgrad"
    hidden = sum(min(by[f"allreduce_{n}"], by[g] / 2) for g, n in (("fc1", "ln2"), ("qkv", "ln1")))
    assert critical_time(on) == pytest.approx(critical_time(off) - hidden)
