"""Ring CP attention (`memo_exec.distributed.attention.RingAttention`) on gloo against plain
autograd over the whole sequence: output and dQ/dK/dV exact (fp64), causal, zig-zag, GQA, with
the ring's sends delayed on purpose (the dK/dV accumulator is waited on only after the next
block's compute, so a late transfer must still land before it is added to or sent on)."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from tests.dist_harness import spawn  # noqa: E402
from tests.exec_reference import causal_gqa_attention  # noqa: E402

B, S, H, HK, D = 2, 32, 4, 2, 8


def _full(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, S, h, D, generator=g, dtype=torch.float64) for h in (H, HK, HK, H))
    return q, k, v, do


def _reference():
    return causal_gqa_attention(*_full())


def _rank(rank: int, world: int, delay_s: float):
    from memo_exec.attention import AttnDims
    from memo_exec.distributed.attention import RingAttention
    from memo_exec.distributed.context import zigzag_positions

    pos = zigzag_positions(S, world, rank)
    s = pos.numel()
    q, k, v, do = (t[:, pos].reshape(B * s, -1).contiguous() for t in _full())
    dims = AttnDims(B, s, H, HK, D)
    ring = RingAttention(None, world, rank, delay_s=delay_s)
    out = torch.empty_like(q)
    aux = ring.forward(q, k, v, out, dims, None)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ring.backward(do, q, k, v, out, aux, dq, dk, dv, dims, None)
    return pos, [t.view(B, s, -1, D) for t in (out, dq, dk, dv)]


def _check(results):
    want = _reference()
    for pos, got in results:
        for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
            err = float((g - w[:, pos]).norm() / w[:, pos].norm())
            assert err < 1e-12, (name, err)


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_ring_attention_matches_autograd_cp2(delay_s):
    _check(spawn(_rank, 2, delay_s, timeout=120))


@pytest.mark.slow
def test_ring_attention_matches_autograd_cp4_delayed():
    _check(spawn(_rank, 4, 0.05, timeout=180))
