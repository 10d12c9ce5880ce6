"""One precision recipe for plan and executor (issue 25): the executor keeps the model states the
plan's recipe counts. Megatron's bf16 recipe (the default for 16-bit models) keeps fp32 main
gradients: 2 + 4 + 4 + 8 = 18 bytes per parameter, as the simulator counts them; the ZeRO paper's
recipe keeps 16-bit gradients (16 bytes); fp32 models 16 bytes with no master copy."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from exec_helpers import executor_grads, make_plan  # noqa: E402
from memo_exec.runner import Executor, RunOptions  # noqa: E402
from memo_sim.api import Layout, load_profile, memory_breakdown  # noqa: E402
from memo_sim.model.config import ModelConfig  # noqa: E402
from memo_sim.policy import get_policy  # noqa: E402

SEQ = 64


def _plan(dtype: str, precision: str | None):
    model = ModelConfig("tiny", 2, 64, 4, 256, vocab=128, dtype=dtype, precision=precision)
    return make_plan(model, SEQ, get_policy("store_all"), chunk=64)


def _sim_model_states(plan) -> float:
    mem = memory_breakdown(plan.model, Layout(), 1, SEQ, plan.policy, load_profile(plan.profile),
                           plan.classifier_chunk_tokens)
    return mem.model_states_bytes


@pytest.mark.parametrize("dtype, precision, run_dtype, per_param", [
    ("bf16", None, "bf16", 18),  # Megatron's recipe by default: fp32 main gradients
    ("bf16", "megatron", "bf16", 18),
    ("bf16", "zero", "bf16", 16),  # 16-bit gradients
    ("fp32", None, "fp32", 16),  # fp32 weights, gradients and Adam, no master
])
def test_plan_and_executor_agree_on_bytes_per_parameter(dtype, precision, run_dtype, per_param):
    plan = _plan(dtype, precision)
    assert plan.model.recipe.bytes_per_param == per_param
    ex = Executor(plan, RunOptions(device="cpu", dtype=run_dtype, steps=1))
    P = plan.model.params()
    assert ex.estimate.terms["model_states"] == per_param * P
    assert ex.estimate.terms["model_states"] == pytest.approx(_sim_model_states(plan), rel=1e-12)
    ex.allocate()
    try:
        weights = sum(p.numel() * p.element_size() for p in ex.gpt.parameters())
        if ex.main_grads is not None:
            grads = sum(g.numel() * g.element_size() for g in ex.main_grads.main.values())
            assert all(p.grad is None for p in ex.gpt.parameters())  # 16-bit grads only inside a backward
        else:
            grads = sum(p.grad.numel() * p.grad.element_size() for p in ex.gpt.parameters())
        states = weights + grads + ex.optimizer.state_bytes()
        assert states == per_param * P  # what is allocated, not only what is estimated
    finally:
        ex.close()


def test_fp32_main_gradients_match_16_bit_gradients_and_train():
    """The main-gradient path computes the same gradients (within bf16 rounding) and its optimizer
    step reads them."""
    mega = _plan("bf16", "megatron")
    zero = dataclasses.replace(mega, model=dataclasses.replace(mega.model, precision="zero"))
    loss_m, g_m, ex_m = executor_grads(mega, dtype="bf16")
    loss_z, g_z, ex_z = executor_grads(zero, dtype="bf16")
    assert ex_m.main_grads is not None and ex_z.main_grads is None
    assert loss_m == loss_z
    for name, g in g_m.items():
        assert g.dtype == torch.float32 and g_z[name].dtype == torch.bfloat16
        ref = g_z[name].float()
        assert torch.linalg.vector_norm(g - ref) <= 2e-2 * torch.linalg.vector_norm(ref) + 1e-6, name
        assert torch.count_nonzero(g) > 0, name
    # one optimizer step from the same weights moves them alike under both recipes
    moved = {}
    for plan in (mega, zero):
        ex = Executor(plan, RunOptions(device="cpu", dtype="bf16", steps=1))
        try:
            ex.allocate()
            names = [n for n, _ in ex.gpt.named_parameters()]  # the optimizer's order; fp32 master weights
            before = {n: m.clone() for n, m in zip(names, ex.optimizer.master)}
            ex.run()
            moved[plan.model.precision] = {n: m - before[n] for n, m in zip(names, ex.optimizer.master)}
            if ex.main_grads is not None:
                assert all(p.grad is None for p in ex.gpt.parameters())
                assert all(torch.count_nonzero(g) == 0 for g in ex.main_grads.main.values())  # zeroed after the step
        finally:
            ex.close()
    for name, d in moved["megatron"].items():
        dz = moved["zero"][name]
        assert torch.count_nonzero(d) > 0, name
        assert torch.linalg.vector_norm(d - dz) <= 0.1 * torch.linalg.vector_norm(dz), name
