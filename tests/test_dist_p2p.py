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
