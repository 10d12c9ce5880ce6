"""The P2P primitive every ring and pipeline uses: ring shift, delayed sends, waiting on every request.

Each spawn of gloo processes costs seconds, so one spawn per world size runs every case.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.dist_harness import spawn  # noqa: E402


def _ring(delay: float):
    from memo_exec.distributed.p2p import ring_shift

    rank = torch.distributed.get_rank()
    send = torch.full((4,), float(rank))
    recv = torch.full((4,), -1.0)
    ring_shift(send, recv, delay_s=delay).wait()
    return recv[0].item()


def _read_before_wait():
    """Read the receive buffer before wait: the delayed send has not arrived yet."""
    from memo_exec.distributed.p2p import ring_shift

    rank = torch.distributed.get_rank()
    recv = torch.full((4,), -1.0)
    tr = ring_shift(torch.full((4,), float(rank)), recv, delay_s=0.5)
    seen = recv[0].item()
    tr.wait()
    return seen


def _two_delayed_same_peer():
    """Two delayed transfers of the same size to the same peer arrive in their own buffers."""
    from memo_exec.distributed.p2p import post

    rank = torch.distributed.get_rank()
    peer = 1 - rank
    a_recv, b_recv = torch.zeros(8), torch.zeros(8)
    ta = post([(peer, torch.full((8,), 10.0 + rank))], [(peer, a_recv)], delay_s=0.2)
    tb = post([(peer, torch.full((8,), 20.0 + rank))], [(peer, b_recv)], delay_s=0.01)
    tb.wait()
    ta.wait()
    return a_recv[0].item(), b_recv[0].item()


def _cases(rank: int, world: int):
    out = {"ring": _ring(0.0)}
    if world == 2:
        out["ring_delayed"] = _ring(0.3)
        out["read_before_wait"] = _read_before_wait()
        out["two_delayed"] = _two_delayed_same_peer()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_p2p_cases(world):
    got = spawn(_cases, world, timeout=60)
    assert [g["ring"] for g in got] == [float((r - 1) % world) for r in range(world)]
    if world == 2:
        assert [g["ring_delayed"] for g in got] == [1.0, 0.0]  # a late send changes nothing after wait
        assert [g["read_before_wait"] for g in got] == [-1.0, -1.0]  # ... but is stale before it
        assert [g["two_delayed"] for g in got] == [(11.0, 21.0), (10.0, 20.0)]  # in posting order
