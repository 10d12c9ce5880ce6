"""The experts' SwiGLU, optionally weighted by each row's router probability, as one Triton kernel
forward and one backward on CUDA: ``y = silu(g) * u * p`` for ``a = [g | u]`` computed in fp32 and
stored in ``a``'s dtype; the backward reads ``a``, ``p`` and ``dy`` once and writes both halves of
``da`` and ``dp`` (the row sums of ``dy * silu(g) * u``). This is what the simulator prices for the
experts' activation (one fused elementwise kernel each way, as Megatron-Core's
``weighted_bias_swiglu_impl``); the eager composition it replaces ran, for Mixtral-8x7B's experts
at 8K tokens on an H200, about ten kernels with 4.6 ms of multiplies, 1.9 ms of silu and 0.7 ms of
its backward (reports/gpu-h200-2026-11-27.md).

`usable` says where it runs: a CUDA tensor in bf16 or fp16 with Triton importable. Elsewhere
(the CPU, fp32, no Triton) `memo_exec.moe.experts` keeps its eager composition."""

from __future__ import annotations

import functools

import torch

BLOCK = 1024


@functools.lru_cache(maxsize=1)
def _kernels():
    """The two compiled Triton kernels, or None where Triton does not import."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def fwd(a_ptr, p_ptr, y_ptr, F, stride_a, stride_y, HAS_P: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < F
        g = tl.load(a_ptr + r * stride_a + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(a_ptr + r * stride_a + F + cols, mask=m, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        if HAS_P:
            y = y * tl.load(p_ptr + r).to(tl.float32)
        tl.store(y_ptr + r * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def bwd(a_ptr, p_ptr, dy_ptr, da_ptr, dp_ptr, F, stride_a, stride_dy, stride_da,
            HAS_P: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        p = 1.0
        if HAS_P:
            p = tl.load(p_ptr + r).to(tl.float32)
        for c0 in range(0, F, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            m = cols < F
            g = tl.load(a_ptr + r * stride_a + cols, mask=m, other=0.0).to(tl.float32)
            u = tl.load(a_ptr + r * stride_a + F + cols, mask=m, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + r * stride_dy + cols, mask=m, other=0.0).to(tl.float32)
            sig = 1.0 / (1.0 + tl.exp(-g))
            s = g * sig
            if HAS_P:
                acc += dy * s * u
            dyw = dy * p
            tl.store(da_ptr + r * stride_da + F + cols, (dyw * s).to(da_ptr.dtype.element_ty), mask=m)
            dg = dyw * u * sig * (1.0 + g * (1.0 - sig))
            tl.store(da_ptr + r * stride_da + cols, dg.to(da_ptr.dtype.element_ty), mask=m)
        if HAS_P:
            tl.store(dp_ptr + r, tl.sum(acc, axis=0))

    return triton, fwd, bwd


def usable(a: torch.Tensor) -> bool:
    """Whether the fused kernels run on ``a`` (module docs)."""
    return a.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and a.dim() == 2 and _kernels() is not None


def forward(a: torch.Tensor, p: torch.Tensor | None) -> torch.Tensor:
    """``silu(g) * u`` (times ``p`` per row when given) for ``a = [g | u]`` [rows, 2f] -> [rows, f]."""
    triton, fwd, _ = _kernels()
    a = a.contiguous()
    rows, f = a.shape[0], a.shape[1] // 2
    y = a.new_empty(rows, f)
    if rows and f:
        pp = p.contiguous() if p is not None else a
        fwd[(rows, triton.cdiv(f, BLOCK))](a, pp, y, f, a.stride(0), y.stride(0), HAS_P=p is not None, BLOCK=BLOCK)
    return y


def backward(a: torch.Tensor, p: torch.Tensor | None, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(``da`` [rows, 2f] in ``a``'s dtype, ``dp`` [rows] in ``p``'s dtype or None) for the output gradient ``dy``."""
    triton, _, bwd = _kernels()
    a, dy = a.contiguous(), dy.contiguous()
    rows, f = a.shape[0], a.shape[1] // 2
    da = torch.empty_like(a)
    dp = torch.empty(rows, dtype=torch.float32, device=a.device) if p is not None else None
    if rows and f:
        pp = p.contiguous() if p is not None else a
        bwd[(rows,)](a, pp, dy, da, dp if dp is not None else a, f, a.stride(0), dy.stride(0), da.stride(0),
                     HAS_P=p is not None, BLOCK=BLOCK)
    elif dp is not None:
        dp.zero_()
    return da, (dp.to(p.dtype) if dp is not None else None)
