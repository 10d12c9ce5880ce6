"""The block attention kernel and its log-sum-exp merge (`memo_exec.block_attention`), the one block
kernel of ring CP, METP and SPPO: a causal sequence cut into blocks (below the diagonal full,
on it causal, above it skipped), merged, equals plain autograd attention in fp32 within 1e-5
(output and dQ/dK/dV), on the CPU flash kernel and on the math kernel (query-chunked)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from memo_exec import block_attention as BA  # noqa: E402

B, H, HK, D = 2, 4, 2, 16


def _qkv(s: int, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, s, D, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, HK, s, D, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, HK, s, D, generator=g, dtype=torch.float64).to(dtype)
    do = torch.randn(B, H, s, D, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, do


def _reference(q, k, v, do):
    """Plain autograd over the whole causal sequence (scores materialised)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    g = H // HK
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q.shape[2]
    sc = (q @ kk.transpose(-1, -2)) / math.sqrt(D)
    sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = sc.softmax(-1) @ vv
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


def _blockwise(q, k, v, do, n_blocks: int, order=None, budget=BA.MATH_BUDGET_BYTES):
    """Forward block by block (merging), then every block's backward from the final o and lse."""
    s = q.shape[2]
    c = s // n_blocks
    sl = [slice(i * c, (i + 1) * c) for i in range(n_blocks)]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)
    pairs = [(i, j) for i in range(n_blocks) for j in range(n_blocks) if j <= i]
    for i, j in (order(pairs) if order else pairs):
        ob, lb = BA.block_forward(q[:, :, sl[i]], k[:, :, sl[j]], v[:, :, sl[j]], i == j, budget=budget)
        assert ob.dtype == q.dtype and lb.dtype == acc and lb.shape == (B, H, c)
        BA.merge_(o[:, :, sl[i]], lse[:, :, sl[i]], ob, lb)
    out = o.to(q.dtype)
    dq, dk, dv = (torch.zeros(t.shape, dtype=acc, device=q.device) for t in (o, k, v))
    for i, j in pairs:
        gq, gk, gv = BA.block_backward(do[:, :, sl[i]], q[:, :, sl[i]], k[:, :, sl[j]], v[:, :, sl[j]],
                                       out[:, :, sl[i]], lse[:, :, sl[i]], i == j, budget=budget)
        assert gk.shape == (B, HK, c, D)  # summed over the GQA group
        dq[:, :, sl[i]] += gq
        dk[:, :, sl[j]] += gk
        dv[:, :, sl[j]] += gv
    return out, dq, dk, dv


def _err(got, want) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("kernel", ["flash_cpu", "math"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_blocks_merged_equal_the_math_reference(kernel, dtype, tol):
    q, k, v, do = _qkv(48, dtype)
    want = _reference(q, k, v, do)
    with BA.use_kernel(kernel):
        got = _blockwise(q, k, v, do, 3)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert _err(g, w) < tol, (kernel, name, _err(g, w))
    assert not BA.FALLBACKS


def test_merge_order_does_not_matter_and_math_chunks():
    """Blocks merged in reverse order, and the math kernel with a budget of a few query rows."""
    q, k, v, do = _qkv(32, torch.float32, seed=3)
    want = _reference(q, k, v, do)
    got = _blockwise(q, k, v, do, 4, order=lambda p: list(reversed(p)))
    with BA.use_kernel("math"):
        chunked = _blockwise(q, k, v, do, 4, budget=3 * 2 * B * H * 8 * 4)  # 3 query rows per chunk
    for g, c, w in zip(got, chunked, want):
        assert _err(g, w) < 1e-5 and _err(c, w) < 1e-5


def test_the_default_kernel_per_device():
    assert BA.kernel_for("cpu", torch.float32, 128) == "flash_cpu"
    assert BA.kernel_for("cuda", torch.bfloat16, 128) == "flash"
    assert BA.kernel_for("cuda", torch.float32, 128) == "efficient"
    assert BA.kernel_for("cuda", torch.bfloat16, 512) == "efficient"
    assert BA.kernel_for("cuda", torch.float64, 128) == "math"


def test_a_refused_block_falls_back_to_math_with_the_reason(monkeypatch):
    def refuse(*a, **kw):
        raise RuntimeError("no kernel for this block")

    monkeypatch.setattr(BA, "FALLBACKS", {})
    monkeypatch.setitem(BA._FORWARD, "flash_cpu", refuse)
    monkeypatch.setitem(BA._BACKWARD, "flash_cpu", refuse)
    q, k, v, do = _qkv(16, torch.float32)
    want = _reference(q, k, v, do)
    with pytest.warns(RuntimeWarning, match="no kernel for this block"):
        got = _blockwise(q, k, v, do, 2)
    assert list(BA.FALLBACKS.values()) == ["no kernel for this block"]
    for g, w in zip(got, want):
        assert _err(g, w) < 1e-5


def test_out_of_memory_is_not_swallowed(monkeypatch):
    def oom(*a, **kw):
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setitem(BA._FORWARD, "flash_cpu", oom)
    q, k, v, _ = _qkv(8, torch.float32)
    with pytest.raises(torch.OutOfMemoryError):
        BA.block_forward(q, k, v, True)


def test_a_causal_block_must_be_square():
    q, k, v, _ = _qkv(8, torch.float32)
    with pytest.raises(ValueError, match="square"):
        BA.block_forward(q[:, :, :4], k, v, True)
    o, lse = BA.block_forward(q[:, :, :4], k, v, False)  # a full rectangular block is fine
    assert o.shape == (B, H, 4, D) and lse.shape == (B, H, 4)


# ---------------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel,dtype,tol", [("flash", torch.bfloat16, 2e-2), ("efficient", torch.float32, 1e-4),
                                              ("efficient", torch.bfloat16, 2e-2), ("math", torch.float32, 1e-5)])
def test_fused_cuda_blocks_match_the_reference(kernel, dtype, tol, monkeypatch):
    """The CUDA flash and memory-efficient ops through their aten forward and backward, blocks merged
    with the lse, against fp64 autograd; a kernel refusing the block fails here (no silent math)."""
    monkeypatch.setattr(BA, "FALLBACKS", {})
    q, k, v, do = (t.cuda() for t in _qkv(256, torch.float64))
    want = [t.cpu() for t in _reference(q.cpu(), k.cpu(), v.cpu(), do.cpu())]
    with BA.use_kernel(kernel):
        got = _blockwise(*(t.to(dtype) for t in (q, k, v, do)), 4)
    assert not BA.FALLBACKS, BA.FALLBACKS
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert _err(g.cpu(), w) < tol, (kernel, name, _err(g.cpu(), w))
