"""The P2P primitive every ring and pipeline uses: ring shift, delayed sends, waiting on every request."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.dist_harness import spawn  # noqa: E402


def _ring(rank: int, world: int, delay: float):
    from memo_exec.distributed.p2p import ring_shift

    send = torch.full((4,), float(rank))
    recv = torch.full((4,), -1.0)
    tr = ring_shift(send, recv, delay_s=delay)
    tr.wait()
    return recv[0].item()


def _no_wait(rank: int, world: int):
    from memo_exec.distributed.p2p import ring_shift

    send = torch.full((4,), float(rank))
    recv = torch.full((4,), -1.0)
    tr = ring_shift(send, recv, delay_s=1.0)
    seen = recv[0].item()  # read before wait: the delayed send has not arrived
    tr.wait()
    return seen


@pytest.mark.parametrize("world", [2, 4])
def test_ring_shift_receives_previous_rank(world):
    got = spawn(_ring, world, 0.0, timeout=60)
    assert got == [float((r - 1) % world) for r in range(world)]


def test_delayed_send_same_result_and_read_before_wait_is_stale():
    assert spawn(_ring, 2, 0.3, timeout=60) == [1.0, 0.0]
    assert spawn(_no_wait, 2, timeout=60) == [-1.0, -1.0]


def _two_delayed_same_peer(rank: int, world: int):
    """Two delayed transfers of the same size to the same peer arrive in their own buffers."""
    from memo_exec.distributed.p2p import post

    peer = 1 - rank
    a_send, b_send = torch.full((8,), 10.0 + rank), torch.full((8,), 20.0 + rank)
    a_recv, b_recv = torch.zeros(8), torch.zeros(8)
    ta = post([(peer, a_send)], [(peer, a_recv)], delay_s=0.2)
    tb = post([(peer, b_send)], [(peer, b_recv)], delay_s=0.01)
    tb.wait()
    ta.wait()
    return a_recv[0].item(), b_recv[0].item()


def test_delayed_sends_keep_their_order():
    got = spawn(_two_delayed_same_peer, 2, timeout=60)
    assert got == [(11.0, 21.0), (10.0, 20.0)]
