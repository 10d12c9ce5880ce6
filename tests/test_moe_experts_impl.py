"""memo-exec's routed experts run as one grouped GEMM (``grouped``, what the simulator prices) or as
a loop of per-expert GEMMs (``loop``): both give the same output and gradients, an empty expert
included, and the loop's backward builds one stacked weight gradient, not one full-size gradient
per expert (the H200 measured that at 17x the grouped GEMM's time: reports/gpu-h200-2026-11-26-moe.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memo_exec.moe import experts as X  # noqa: E402


class _W:
    def __init__(self, E, h, w, swiglu, dtype=torch.float32, device="cpu", bias=False):
        g = torch.Generator().manual_seed(3)
        fc1 = 2 * w if swiglu else w
        self.expert_w1 = (torch.randn(E, fc1, h, generator=g) * 0.1).to(device, dtype).requires_grad_()
        self.expert_w2 = (torch.randn(E, h, w, generator=g) * 0.1).to(device, dtype).requires_grad_()
        self.expert_b1 = (torch.randn(E, fc1, generator=g) * 0.1).to(device, dtype).requires_grad_() if bias else None
        self.expert_b2 = None

    def params(self):
        return [p for p in (self.expert_w1, self.expert_w2, self.expert_b1) if p is not None]


def _run(impl, counts, swiglu, h=16, w=24, **kw):
    wts = _W(len(counts), h, w, swiglu, **kw)
    x = torch.randn(sum(counts), h, generator=torch.Generator().manual_seed(5)).to(wts.expert_w1).requires_grad_()
    y = X.run_experts(x, counts, wts, swiglu, impl)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y)
    y.backward(gy)
    return [y.detach(), x.grad] + [p.grad for p in wts.params()], y


def _grouped_runs_here() -> bool:
    if X._GROUPED_MM is None:
        return False
    try:
        _run("grouped", [8, 0, 8], True)
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("swiglu", [True, False])
@pytest.mark.parametrize("counts", [[8, 0, 16, 8], [0, 0, 24, 0], [5, 11, 0, 2]])
def test_grouped_equals_loop(swiglu, counts):
    if not _grouped_runs_here():
        pytest.skip("this torch has no grouped_mm on the CPU")
    want, _ = _run("loop", counts, swiglu)
    got, _ = _run("grouped", counts, swiglu)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), float((a - b).abs().max())


def test_loop_builds_one_stacked_gradient_per_weight():
    """No autograd node selects one expert from the stacked parameter (a full-size gradient each)."""
    _, y = _run("loop", [4, 0, 4, 4, 4], True)
    seen, stack, names = set(), [y.grad_fn], []
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        stack.extend(f for f, _ in fn.next_functions)
    assert names.count("UnbindBackward0") == 2, names
    assert not any(n.startswith("SelectBackward") for n in names), names


def test_loop_gives_an_empty_expert_zero_gradient():
    grads, _ = _run("loop", [4, 0, 4], True)
    w1g = grads[2]
    assert torch.count_nonzero(w1g[1]) == 0 and torch.count_nonzero(w1g[0]) > 0


def test_impl_choice_on_the_cpu_and_bad_name():
    wts = _W(2, 16, 24, True)
    assert X.impl_for(torch.zeros(4, 16), wts) == "loop"
    with pytest.raises(ValueError, match="one of grouped, loop"):
        X.run_experts(torch.zeros(4, 16), [2, 2], wts, True, "fused")


def test_loop_with_biases():
    want, _ = _run("loop", [4, 4], False, bias=True)
    assert want[-1] is not None and want[-1].abs().sum() > 0


@pytest.mark.gpu
def test_grouped_on_cuda_bf16_is_chosen_and_matches_the_loop():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    wts = _W(4, 64, 96, True, dtype=torch.bfloat16, device="cuda")
    assert X.impl_for(torch.zeros(4, 64, device="cuda", dtype=torch.bfloat16), wts) == "grouped"
    counts = [40, 0, 72, 16]
    want, _ = _run("loop", counts, True, h=64, w=96, dtype=torch.bfloat16, device="cuda")
    got, _ = _run("grouped", counts, True, h=64, w=96, dtype=torch.bfloat16, device="cuda")
    for a, b in zip(got, want, strict=True):
        assert float((a.float() - b.float()).abs().max()) <= 2e-2 * float(b.float().abs().max())


def test_moe_block_note_names_the_policies_that_run_the_block_otherwise():
    """memo and full_offload re-run the MoE block whole in memo-exec (the simulator prices their
    token-wise rule): the validation report says so for a MoE model, and only there."""
    from memo_exec import validate as V
    from memo_exec.activations.registry import moe_block_note
    from memo_sim.model.config import PRESETS

    moe, dense = PRESETS["mixtral-8x7b"], PRESETS["gpt-7b"]
    assert moe_block_note(moe, "memo") and moe_block_note(moe, "full_offload")
    for name in ("store_all", "full_recompute", "selective_recompute", "recompute_moe", "checkpoint_offload"):
        assert moe_block_note(moe, name) is None, name
    assert moe_block_note(dense, "memo") is None
    plans = V.plan_set([1024], ["store_all", "memo"], [0.5])
    notes = V.moe_block_notes(moe, plans)
    assert len(notes) == 1 and notes[0].startswith("memo: memo-exec keeps an offloaded MoE layer's routing only")
    assert V.moe_block_notes(dense, plans) == []


def test_swiglu_gradient_and_what_it_keeps():
    """The SwiGLU of the experts keeps only its input for the backward (not silu(gate) beside it) and
    its gradient is the composition's."""
    g = torch.Generator().manual_seed(11)
    a = torch.randn(6, 10, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: X.act(t, True), (a,))
    want = torch.nn.functional.silu(a[:, :5]) * a[:, 5:]
    assert torch.allclose(X.act(a, True), want)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        X.act(a, True)
    assert len(kept) == 1 and kept[0].shape == a.shape


@pytest.mark.parametrize("swiglu", [True, False])
def test_weighted_activation_matches_autograd_and_keeps_only_its_inputs(swiglu):
    """The experts apply each row's router weight inside the activation (Megatron-Core's weighted SwiGLU):
    the same output and gradients as autograd's ``act(a) * p``, and only ``a`` and ``p`` are kept, where
    autograd's product would also keep ``act(a)`` (the rows the simulator does not count)."""
    g = torch.Generator().manual_seed(11)
    a = torch.randn(7, 12, dtype=torch.float64, generator=g).requires_grad_()
    p = torch.rand(7, dtype=torch.float64, generator=g).requires_grad_()
    dy = torch.randn(7, 6 if swiglu else 12, dtype=torch.float64, generator=g)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = X.act(a, swiglu, p)
    assert len(kept) == 2 and kept[0] is a and kept[1] is p
    ga, gp = torch.autograd.grad(y, (a, p), dy)
    plain = X._plain_act(a, swiglu) * p.unsqueeze(1)
    wa, wp = torch.autograd.grad(plain, (a, p), dy)
    assert torch.allclose(y, plain, rtol=1e-13) and torch.allclose(ga, wa, rtol=1e-12) and torch.allclose(gp, wp)
    assert torch.autograd.gradcheck(lambda a_, p_: X.act(a_, swiglu, p_), (a, p))


def test_weighted_experts_with_biases_weight_the_second_bias_too():
    """``p * ffn(x)`` = ``ffn(x, probs=p)``: the second bias is weighted with the activation."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 8, dtype=torch.float64, generator=g)
    w1, w2 = torch.randn(12, 8, dtype=torch.float64, generator=g), torch.randn(8, 6, dtype=torch.float64, generator=g)
    b1, b2 = torch.randn(12, dtype=torch.float64, generator=g), torch.randn(8, dtype=torch.float64, generator=g)
    p = torch.rand(5, dtype=torch.float64, generator=g)
    want = p.unsqueeze(1) * X.ffn(x, w1, w2, b1, b2, True)
    assert torch.allclose(X.ffn(x, w1, w2, b1, b2, True, p), want, rtol=1e-12)


@pytest.mark.parametrize("counts", [[8, 0, 16, 8], [0, 0, 0, 0]])
def test_weighted_loop_gives_the_rows_weights_a_gradient(counts):
    wts = _W(len(counts), 16, 24, True, dtype=torch.float64)
    x = torch.randn(sum(counts), 16, dtype=torch.float64).requires_grad_()
    p = torch.rand(sum(counts), dtype=torch.float64).requires_grad_()
    y = X.run_experts(x, counts, wts, True, "loop", probs=p)
    y.backward(torch.ones_like(y))
    assert p.grad is not None and p.grad.shape == p.shape
    if sum(counts):
        want = (X.run_experts(x.detach(), counts, wts, True, "loop") * p.detach().unsqueeze(1)).sum(1)
        assert torch.allclose(p.grad, want.detach() / p.detach(), rtol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("rows,f", [(3001, 1000), (517, 2500), (0, 64)])
def test_fused_swiglu_on_cuda_matches_a_float64_reference(weighted, rows, f):
    """On CUDA in bf16 the experts' (weighted) SwiGLU runs as one Triton kernel each way
    (`memo_exec.moe.fused_swiglu`): its output, ``da`` and ``dp`` agree with a float64 computation on
    the same bf16 inputs to bf16's rounding, rows not a multiple of anything and widths over and
    under the kernel's block, an empty input included."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from memo_exec.moe import fused_swiglu

    g = torch.Generator().manual_seed(13)
    a = (torch.randn(rows, 2 * f, generator=g) * 2).to("cuda", torch.bfloat16).requires_grad_()
    p = torch.rand(rows, generator=g).to("cuda").requires_grad_() if weighted else None
    dy = torch.randn(rows, f, generator=g).to("cuda", torch.bfloat16)
    assert fused_swiglu.usable(a)
    y = X.act(a, True, p)
    y.backward(dy)
    a64, dy64 = a.detach().double().requires_grad_(), dy.double()
    p64 = p.detach().double().requires_grad_() if weighted else None
    want = torch.nn.functional.silu(a64[:, :f]) * a64[:, f:]
    if weighted:
        want = want * p64.unsqueeze(1)
    want.backward(dy64)
    pairs = [(y, want), (a.grad, a64.grad)] + ([(p.grad, p64.grad)] if weighted else [])
    assert y.dtype == a.grad.dtype == torch.bfloat16 and (not weighted or p.grad.dtype == torch.float32)
    for got, ref in pairs:
        assert got.shape == ref.shape
        if ref.numel():
            err = float((got.detach().double() - ref).abs().max())
            assert err <= 1e-2 * float(ref.abs().max()), (err, float(ref.abs().max()))
