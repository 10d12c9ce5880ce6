"""The dispatchers move rows by gathers whose backward is the inverse gather (no scatter-add):
same values and gradients as plain indexing, a token's k copies summed in its gradient."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memo_exec.moe.dispatchers import LocalDispatcher, gather_rows, inverse  # noqa: E402


def test_inverse():
    p = torch.randperm(50, generator=torch.Generator().manual_seed(0))
    inv = inverse(p)
    assert torch.equal(inv[p], torch.arange(50)) and torch.equal(p[inv], torch.arange(50))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gather_rows_matches_indexing(k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    perm = torch.randperm(7 * k, generator=g)
    y = gather_rows(x, perm, k)
    assert torch.equal(y, x[perm // k])
    gy = torch.randn(y.shape, dtype=torch.float64, generator=g)
    (gx,) = torch.autograd.grad(y, x, gy)
    (want,) = torch.autograd.grad(x[perm // k], x, gy)
    assert torch.allclose(gx, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: gather_rows(t, perm, k), (x,))


def test_local_dispatch_and_combine_round_trip():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    idx = torch.randint(0, 3, (6, 2), generator=g)
    d = LocalDispatcher(3)
    xe, counts, state = d.dispatch(x, idx)
    assert sum(counts) == 12 and xe.shape == (12, 4)
    back = d.combine(xe * 2.0, state)  # copy rows t*k + j in token order
    assert torch.allclose(back.view(6, 2, 4), 2.0 * x.detach().unsqueeze(1).expand(6, 2, 4))
    back.sum().backward()
    assert torch.allclose(x.grad, torch.full_like(x, 4.0))  # 2 copies x 2.0
