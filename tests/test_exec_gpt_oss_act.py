"""GPT-OSS's clamped SwiGLU in memo-exec's experts (`memo_exec.moe.experts`): the formula transformers' GptOssExperts
runs, its gradient, with and without the router weight applied inside the activation; where it cannot run (a dense
FFN) the plan is refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memo_sim.model.config import get_model
from memo_sim.plan.executor_scope import ffn_why_not

LIMIT = 7.0


def _hf(a: torch.Tensor, limit: float) -> torch.Tensor:
    """transformers' GptOssExperts over memo's [gate | up] halves (its checkpoint interleaves the two; the same math
    on fc1's output rows permuted): gate clamped above, up both ways, gate * sigmoid(1.702 gate) * (up + 1)."""
    f = a.shape[1] // 2
    gate = a[:, :f].clamp(min=None, max=limit)
    up = a[:, f:].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * 1.702))


def _a(rows: int = 40, f: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return (torch.randn(rows, 2 * f, dtype=torch.float64, generator=g) * 6).requires_grad_(True)  # past the limit too


@pytest.mark.parametrize("weighted", [False, True])
def test_the_experts_activation_is_gpt_oss_s_formula_and_its_gradient(weighted):
    from memo_exec.moe.experts import act

    a = _a()
    assert (a.detach().abs() > LIMIT).any()  # the clamps are exercised
    p = torch.rand(a.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4)).requires_grad_(True)
    dy = torch.randn(a.shape[0], a.shape[1] // 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    y = act(a, LIMIT, p if weighted else None)
    ref_a = a.detach().clone().requires_grad_(True)
    ref_p = p.detach().clone().requires_grad_(True)
    ref = _hf(ref_a, LIMIT) * (ref_p.unsqueeze(1) if weighted else 1)
    assert torch.allclose(y, ref, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y, [a, p] if weighted else [a], dy)
    want = torch.autograd.grad(ref, [ref_a, ref_p] if weighted else [ref_a], dy)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-12, atol=1e-12)
    # plain SwiGLU is another function: the limit is not dropped on the way
    assert not torch.allclose(act(a.detach(), True), ref.detach() / (p.detach().unsqueeze(1) if weighted else 1))


def test_gpt_oss_runs_and_a_dense_ffn_with_the_clamp_is_refused_in_one_line():
    oss = get_model("gpt-oss-20b")
    assert oss.swiglu_limit == LIMIT and ffn_why_not(oss) is None
    dense = dataclasses.replace(get_model("llama-3.1-8b"), swiglu_limit=LIMIT)
    why = ffn_why_not(dense)
    assert why and "swiglu_limit = 7" in why and "\n" not in why and "MoE experts only" in why
