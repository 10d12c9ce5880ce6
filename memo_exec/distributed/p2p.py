"""Point-to-point transfers between ranks: post, then wait on every request before use.

Every transfer goes through `post`: it issues the sends and receives of one exchange with
``batch_isend_irecv`` in one fixed order (all sends first, by peer rank, then all receives, by
peer rank), so the two ends of a pair always issue their operations in the same order, and it
returns a `Transfer` whose ``wait`` waits on every request ``batch_isend_irecv`` returned. A
received buffer may only be read, and a sent buffer only be overwritten, after ``wait``: the
double buffers of the ring algorithms rely on it.

A `memo_exec.happens_before.TransferGuard` (``guard``, optional) sees every posted transfer by
name (its send and receive buffers as physical regions, with what the received block holds) until
its ``wait``: a consumer that declares its reads and writes to the guard and skips a wait gets a
`RaceError` naming the transfer at once, instead of a stale block or a hang.

``delay_s`` (tests) makes the sends of this transfer start late, so that a consumer that forgets
``wait`` reads a stale buffer deterministically instead of by chance. Delayed sends go out from one
worker thread per process in the order they were posted: two delayed transfers to the same peer
never overtake each other (they would otherwise land in each other's receive buffers).

Ranks are given in the group's own numbering (0..size-1) and mapped to global ranks here.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from memo_exec.happens_before import Region, TransferGuard
from memo_exec.wait_switch import wait_primitive


@dataclass
class Transfer:
    """The requests of one exchange; ``wait`` is idempotent."""

    works: list = field(default_factory=list)
    sent: threading.Event | None = None  # set by the delayed sender once its sends completed
    error: list = field(default_factory=list)
    done: bool = False
    guard: TransferGuard | None = None
    token: int = 0  # the guard's name for this transfer
    name: str = ""

    @wait_primitive
    def wait(self) -> None:
        if not self.done:
            if self.sent is not None:
                self.sent.wait()
                if self.error:
                    raise self.error[0]
            for w in self.works:
                w.wait()
            self.done = True
        if self.guard is not None:
            self.guard.waited(self.token)

    def settle(self) -> None:
        """Complete the requests without telling the guard: the error path of a step the guard
        refused (`settle_all`), so that a peer still receiving from this rank is not left waiting on
        a rank that stopped. Never an edge the step's data depends on."""
        if not self.done:
            if self.sent is not None:
                self.sent.wait(timeout=60)
            for w in self.works:
                w.wait()
            self.done = True


def finish_or_settle(guard: TransferGuard | None, what: str, transfers) -> None:
    """End a step's transfers: ``guard.finish(what)``; when it refuses the step (a transfer not waited
    on), every one of ``transfers`` is still completed (`Transfer.settle`) before the refusal goes up,
    so the peers get what this rank posted and reach their own checks instead of a timeout."""
    if guard is None:
        return
    try:
        guard.finish(what)
    except Exception:
        for tr in transfers:
            tr.settle()
        raise


class _DelayedSender:
    """One FIFO worker per process that posts delayed sends in issue order (tests only)."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="p2p-delayed-sends", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            start_at, ops, tr = self.jobs.get()
            try:
                time.sleep(max(0.0, start_at - time.monotonic()))
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
            except Exception as e:  # surfaced by Transfer.wait()
                tr.error.append(e)
            finally:
                tr.sent.set()


_sender: _DelayedSender | None = None
_sender_lock = threading.Lock()


def _delayed_sender() -> _DelayedSender:
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = _DelayedSender()
        return _sender


def _global(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _ops(sends, recvs, group) -> list[dist.P2POp]:
    ops = [dist.P2POp(dist.isend, t, _global(group, peer), group) for peer, t in sorted(sends, key=lambda s: s[0])]
    ops += [dist.P2POp(dist.irecv, t, _global(group, peer), group) for peer, t in sorted(recvs, key=lambda r: r[0])]
    return ops


def _guarded(tr: Transfer, guard: TransferGuard | None, name: str, sends, recvs, received) -> Transfer:
    tr.name = name
    if guard is not None:
        tr.guard = guard
        tr.token = guard.posted(name, [Region.of(t, f"the send buffer of {name}") for _, t in sends],
                                [Region.of(t, f"the receive buffer of {name}", c)
                                 for (_, t), c in zip(recvs, received or [None] * len(recvs))])
    return tr


def post(sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]], group=None,
         delay_s: float = 0.0, guard: TransferGuard | None = None, name: str = "p2p",
         received: list[str | None] | None = None) -> Transfer:
    """Start one exchange: ``sends``/``recvs`` are (peer rank in ``group``, tensor) pairs; ``guard``
    (optional) is told about it under ``name``, ``received`` naming what each receive brings."""
    if not sends and not recvs:
        return Transfer(done=True)
    tr = _guarded(Transfer(), guard, name, sends, recvs, received)
    if delay_s <= 0:
        tr.works = dist.batch_isend_irecv(_ops(sends, recvs, group))
        return tr
    # delayed (tests): receives are posted now, sends later, in posting order, by the one sender
    tr.sent = threading.Event()
    if recvs:
        tr.works = dist.batch_isend_irecv(_ops([], recvs, group))
    if sends:
        _delayed_sender().jobs.put((time.monotonic() + delay_s, _ops(sends, [], group), tr))
    else:
        tr.sent.set()
    return tr


def _copy_stream(t: torch.Tensor):
    """The stream a local copy of ``t`` is issued on (None off CUDA)."""
    return torch.cuda.current_stream(t.device) if t.is_cuda else None


def local_copy(send: torch.Tensor, recv: torch.Tensor, guard: TransferGuard | None = None, name: str = "p2p",
               received: str | None = None) -> Transfer:
    """A one-rank ring's shift: ``recv <- send`` on the current stream. That stream may be a side
    stream (METP's lane issues its transfers on one), other than the one the tensors were allocated
    on: both are ``record_stream``ed on it, so the caching allocator does not hand their memory out
    again (when the caller frees them) before the copy has run."""
    tr = _guarded(Transfer(done=True), guard, name, [(0, send)], [(0, recv)], [received])
    recv.copy_(send)
    for t in (send, recv):
        stream = _copy_stream(t)
        if stream is not None:
            t.record_stream(stream)
    return tr


def ring_shift(send: torch.Tensor, recv: torch.Tensor, group=None, delay_s: float = 0.0,
               guard: TransferGuard | None = None, name: str = "p2p", received: str | None = None) -> Transfer:
    """Send ``send`` to the next rank of the ring and receive the previous rank's into ``recv``."""
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if size == 1:
        return local_copy(send, recv, guard, name, received)
    return post([((rank + 1) % size, send)], [((rank - 1) % size, recv)], group, delay_s, guard, name, [received])
