"""The routed experts of one rank over the contiguous rows routed to each local expert (SwiGLU or
GELU as the model's ``ffn_type``; biases with ``moe_bias``), with autograd, in one of two ways:

- ``grouped``: one grouped GEMM per projection over every local expert (``F.grouped_mm``, or
  ``torch._grouped_mm`` in a torch without the public name; offsets are the cumulative counts), the
  activation once over all rows: the kernels the simulator prices (`memo_sim.cost.moe`: the local
  experts as one grouped GEMM, each expert's share at its own size). Chosen on CUDA where the
  input and both weights are bf16 and contiguous, every width is a multiple of 8 and every
  operand's storage starts on 16 bytes (the kernel's alignment rule: a weight that is a view into a flat buffer, as
  under ZeRO, may not), the experts have no biases and at least one row is routed here.
- ``loop``: a loop of per-expert GEMMs (everywhere else: the CPU, fp32, biases, no rows). Each
  expert's weights come from one ``unbind`` of the stacked parameter, whose backward writes every
  expert's gradient into one stacked tensor (an expert that received no rows gets zeros there;
  when no expert received any, the weights stay out of the graph and their gradients untouched);
  indexing the parameter per expert would make autograd build and sum a full-size gradient per
  expert.

The activation is SwiGLU, GELU or GPT-OSS's clamped SwiGLU (``swiglu`` the model's ``swiglu_limit``, a float:
gate * sigmoid(1.702 gate) * (up + 1), the gate clamped above at the limit and up to [-limit, limit], as
transformers' GptOssExperts and Megatron-LM's quick_geglu with --glu-linear-offset 1 and
--activation-func-clamp-value run it; its backward is autograd's over the same formula, recomputed from fc1's
output, which is all the activation keeps either way). The SwiGLU between the two GEMMs (weighted by the router
probability where the experts apply it) runs as one Triton kernel each way on CUDA in bf16/fp16
(`memo_exec.moe.fused_swiglu`, plain SwiGLU only; its eager composition below everywhere else): on an H200 it
took Mixtral-8x7B's block at 8K tokens from 37.4 to 30.1 ms (reports/gpu-h200-2026-11-27.md).

Measured on an H200 (reports/gpu-h200-2026-11-26-moe.md; benchmarks/gpu/probe_moe_host.py): 60
experts of Qwen2-MoE at 8K tokens, forward + backward, 76.6 ms as the loop with per-expert indexing
(1,473 kernels) against 4.13 ms grouped (23 kernels), results identical.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from memo_exec.moe import fused_swiglu

IMPLS = ("grouped", "loop")
_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


class _Rebuild:
    """What autograd keeps of the experts' activation output under `rebuilt_act`: how to compute it again."""

    def __init__(self, fn) -> None:
        self.fn = fn


@contextlib.contextmanager
def rebuilt_act(y: torch.Tensor, a: torch.Tensor, swiglu: bool, probs: torch.Tensor | None, on: bool):
    """Around the GEMM that reads the experts' activation output ``y`` (``on``: Megatron-LM's ``--recompute-modules
    moe_act``, the executor's ``recompute_norm_act``): autograd keeps no copy of ``y`` for that GEMM's weight
    gradient, only how to rebuild it from ``a`` (fc1's output) and ``probs``, which the activation's own backward
    keeps anyway; the backward recomputes the activation when it reads it (`memo_exec.moe.memory`: ``eact`` not
    kept)."""
    if not on:
        yield
        return
    key = (y.data_ptr(), tuple(y.shape), y.dtype)  # not y itself: autograd keeps the hooks as long as what they saved

    def pack(t: torch.Tensor):
        if (t.data_ptr(), tuple(t.shape), t.dtype) == key:
            return _Rebuild(lambda: _act_values(a, swiglu, probs))
        return t, t._version  # hooked tensors skip autograd's own check of in-place changes: this one keeps it

    def unpack(saved):
        if isinstance(saved, _Rebuild):
            return saved.fn()
        t, version = saved
        if t._version != version:
            raise RuntimeError(f"the experts' second GEMM saved a tensor {tuple(t.shape)} that was modified in place "
                               f"before its backward (version {t._version}, saved at {version})")
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def _act_values(a: torch.Tensor, swiglu: bool, probs: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        return act(a.detach(), swiglu, None if probs is None else probs.detach())


def ffn(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1, b2, swiglu: bool,
        probs: torch.Tensor | None = None, recompute_act: bool = False) -> torch.Tensor:
    """``act(x W1^T + b1) W2^T + b2``; with ``probs`` [rows] each row's output times its router weight,
    applied to the activation (`act`) and to the second bias, so nothing h-wide is kept for the weight's
    gradient (module docs); ``recompute_act``: the activation's output not kept (`rebuilt_act`)."""
    a = F.linear(x, w1, b1)
    y = act(a, swiglu, probs)
    with rebuilt_act(y, a, swiglu, probs, recompute_act):
        out = F.linear(y, w2)
    del y
    if b2 is None:
        return out
    return out + (b2 if probs is None else probs.unsqueeze(1).to(out.dtype) * b2)


GPT_OSS_ALPHA = 1.702  # GPT-OSS's sigmoid slope (transformers' GptOssExperts.alpha; Megatron-LM's quick_gelu)


def act(a: torch.Tensor, swiglu: bool | float, probs: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU (`_SwiGLU`: ``silu(gate) * up`` over the two halves of ``a``; a float ``swiglu``: GPT-OSS's clamped one,
    module docs) or GELU (False); with ``probs`` ([rows], the router's dtype) each row times its router weight,
    keeping only ``a`` and ``probs`` (`_WeightedAct`)."""
    if probs is not None:
        return _WeightedAct.apply(a, probs, swiglu)
    if swiglu:
        return _SwiGLU.apply(a, swiglu)
    return F.gelu(a)


def _limit(swiglu: bool | float) -> float:
    """GPT-OSS's clamp (a float ``swiglu``), or 0.0 for plain SwiGLU (True) and GELU (False)."""
    return float(swiglu) if isinstance(swiglu, float) else 0.0


def _gpt_oss(a: torch.Tensor, limit: float) -> torch.Tensor:
    """GPT-OSS's activation over ``a = [gate | up]`` (module docs)."""
    f = a.shape[1] // 2
    g, u = a[:, :f].clamp(max=limit), a[:, f:].clamp(min=-limit, max=limit)
    return g * torch.sigmoid(GPT_OSS_ALPHA * g) * (u + 1)


def _gpt_oss_grad(a: torch.Tensor, dy: torch.Tensor, limit: float) -> torch.Tensor:
    """d a of `_gpt_oss` for the output gradient ``dy`` (autograd's, recomputed from ``a``)."""
    with torch.enable_grad():
        x = a.detach().requires_grad_(True)
        (da,) = torch.autograd.grad(_gpt_oss(x, limit), x, dy)
    return da


class _SwiGLU(torch.autograd.Function):
    """``silu(g) * u`` for ``a = [g | u]`` that keeps only ``a`` for its backward and writes both halves
    of the gradient into one tensor, as Megatron-Core's fused SwiGLU does: autograd's own composition
    would also keep ``silu(g)`` (a third of the block's expert activations more than the simulator
    counts: its ``efc1`` and ``eact``, the second kept by the GEMM after) and build the gradient from
    two zero-filled halves and their sum (four kernels here, with aten's own rounding: silu recomputed,
    two products, silu's backward)."""

    @staticmethod
    def forward(ctx, a, swiglu=True):
        ctx.save_for_backward(a)
        ctx.limit = _limit(swiglu)
        if not ctx.limit and fused_swiglu.usable(a):
            return fused_swiglu.forward(a, None)
        return _plain_act(a, swiglu)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (a,) = ctx.saved_tensors
        if ctx.limit:
            return _gpt_oss_grad(a, dy, ctx.limit), None
        if fused_swiglu.usable(a):
            return fused_swiglu.backward(a, None, dy)[0], None
        return _SwiGLU.grad(a, dy), None

    @staticmethod
    def grad(a: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        """d a for ``silu(g) * u``'s output gradient ``dy``, both halves in one tensor."""
        f = a.shape[1] // 2
        g, u = a[:, :f], a[:, f:]
        da = torch.empty_like(a)
        torch.mul(dy, F.silu(g), out=da[:, f:])  # d/du = dy * silu(g)
        # d/dg = (dy * u) * silu'(g): aten's silu backward (its rounding as autograd's), into the first half
        torch.ops.aten.silu_backward.grad_input(dy * u, g, grad_input=da[:, :f])
        return da


class _WeightedAct(torch.autograd.Function):
    """``act(a) * p`` per row (``p`` [rows], the copy's router weight, in the router's dtype), as Megatron-Core's experts
    apply the routing probabilities inside their fused activation (``weighted_bias_swiglu_impl``): the
    product is taken in fp32 and cast to ``a``'s dtype, and only ``a`` and ``p`` are kept. Weighting
    the experts' outputs after the second GEMM instead (the combine's multiply) would keep those
    outputs, k rows of h per token, for ``p``'s gradient: memory the simulator does not count
    (`memo_sim.model.layer_graph`: efc2 is transient)."""

    @staticmethod
    def forward(ctx, a, p, swiglu):
        ctx.save_for_backward(a, p)
        ctx.swiglu = swiglu
        if swiglu and not _limit(swiglu) and fused_swiglu.usable(a):
            return fused_swiglu.forward(a, p)
        ct = _compute_dtype(a)
        return (_plain_act(a, swiglu).to(ct) * p.to(ct).unsqueeze(1)).to(a.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        a, p = ctx.saved_tensors
        limit = _limit(ctx.swiglu)
        if ctx.swiglu and not limit and fused_swiglu.usable(a):
            da, dp = fused_swiglu.backward(a, p, dy)
            return da, dp, None
        ct = _compute_dtype(a)
        y = _plain_act(a, ctx.swiglu)  # recomputed from a, as the fused kernel does
        dp = (dy.to(ct) * y.to(ct)).sum(1).to(p.dtype)
        dyw = (dy.to(ct) * p.to(ct).unsqueeze(1)).to(a.dtype)
        if limit:
            return _gpt_oss_grad(a, dyw, limit), dp, None
        if ctx.swiglu:
            return _SwiGLU.grad(a, dyw), dp, None
        return torch.ops.aten.gelu_backward(dyw, a), dp, None


def _compute_dtype(a: torch.Tensor) -> torch.dtype:
    """fp32, or ``a``'s dtype where wider (fp64 on the CPU)."""
    return torch.promote_types(a.dtype, torch.float32)


def _plain_act(a: torch.Tensor, swiglu: bool | float) -> torch.Tensor:
    """The activation alone, no autograd bookkeeping of its own: ``silu(g) * u`` over ``a = [g | u]``, GPT-OSS's
    (a float ``swiglu``: `_gpt_oss`) or GELU."""
    if _limit(swiglu):
        return _gpt_oss(a, _limit(swiglu))
    if swiglu:
        f = a.shape[1] // 2
        return F.silu(a[:, :f]) * a[:, f:]
    return F.gelu(a)


def impl_for(xe: torch.Tensor, weights) -> str:
    """``grouped`` where the grouped GEMM kernel runs these experts (module docs), else ``loop``."""
    w1, w2 = weights.expert_w1, weights.expert_w2
    ops = (xe, w1, w2)
    aligned = (all(d % 8 == 0 for d in (xe.shape[1], *w1.shape[1:], *w2.shape[1:]))
               and all(t.data_ptr() % 16 == 0 and t.is_contiguous() for t in ops))
    if (_GROUPED_MM is not None and xe.is_cuda and xe.shape[0] > 0 and all(t.dtype == torch.bfloat16 for t in ops)
            and aligned and weights.expert_b1 is None and weights.expert_b2 is None):
        return "grouped"
    return "loop"


def run_experts(xe: torch.Tensor, counts: list[int], weights, swiglu: bool, impl: str | None = None,
                probs: torch.Tensor | None = None, recompute_act: bool = False) -> torch.Tensor:
    """``xe`` [sum(counts), h] grouped by local expert (``counts[j]`` rows of expert j, in order);
    ``impl`` one of `IMPLS` (default: `impl_for`); ``probs`` ([sum(counts)]): each row's router
    weight, applied inside the activation (`_WeightedAct`); ``recompute_act``: the activation's output is rebuilt
    for the backward instead of kept (`rebuilt_act`)."""
    impl = impl or impl_for(xe, weights)
    if impl == "grouped":
        if _GROUPED_MM is None:
            raise RuntimeError("grouped experts need torch's grouped_mm (torch >= 2.8)")
        offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device=xe.device, dtype=torch.int32)
        a = _GROUPED_MM(xe, weights.expert_w1.transpose(-2, -1), offs=offs)
        y = act(a, swiglu, probs)
        with rebuilt_act(y, a, swiglu, probs, recompute_act):
            return _GROUPED_MM(y, weights.expert_w2.transpose(-2, -1), offs=offs)
    if impl != "loop":
        raise ValueError(f"experts impl {impl!r}: one of {', '.join(IMPLS)}")
    w1s, w2s = weights.expert_w1.unbind(0), weights.expert_w2.unbind(0)
    b1s = weights.expert_b1.unbind(0) if weights.expert_b1 is not None else None
    # fc2's bias: under expert tensor parallelism added by one rank of the group (`memo_exec.moe.weights`)
    b2s = weights.expert_b2.unbind(0) if weights.expert_b2 is not None and getattr(weights, "adds_b2", True) else None
    outs, off = [], 0
    for j, n in enumerate(counts):
        if n == 0:
            continue
        outs.append(ffn(xe[off:off + n], w1s[j], w2s[j], b1s[j] if b1s else None, b2s[j] if b2s else None, swiglu,
                        None if probs is None else probs[off:off + n], recompute_act))
        off += n
    if not outs:
        keep = 0 * xe.sum() + (0 * probs.sum() if probs is not None else 0)  # keeps xe (and probs) in the graph
        return xe.new_zeros(0, xe.shape[1]) + keep  # (their gradients: zeros)
    return torch.cat(outs, 0)
