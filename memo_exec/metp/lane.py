"""Where METP's transfers are issued and waited, with a measured span per transfer.

Every send/recv of a ring goes through `memo_exec.distributed.p2p.ring_shift` (one fixed order
of operations on both ends, every request waited on); the MHA's weight broadcasts and gradient
reduces are ``torch.distributed`` collectives issued with ``async_op``. The lane only decides on
which stream they are issued and when the consumer waits:

- CUDA (NCCL): a transfer is issued on a side stream that first waits for everything the compute
  stream issued so far (the buffer to send is written, the buffer to receive into is no longer
  read); its wait makes the compute stream wait for the side stream, so the step that reads the
  received block runs after the transfer, while the step that computes meanwhile overlaps it.
- CPU (gloo): the transfer is issued from the calling thread and gloo's worker threads move the
  data while the caller computes; ``wait`` blocks until every request has completed.

The ring functions call ``wait`` before a received buffer is read and before a sent buffer is
overwritten. Every transfer -- the rings' shifts, the MHA's broadcasts and reduces (an in-place
collective owns its buffer on every rank until its wait) -- is posted under its name to the lane's
`memo_exec.happens_before.TransferGuard` (``guard``), which the ring functions also tell about
their reads and writes of the double buffers (``use``: the FFN ring, the MHA's weight and
gradient buffers, the W_proj ring and the inner K/V ring): a read of a buffer whose receive was
not waited on, a second transfer into a busy buffer or a buffer of the wrong block is a
`RaceError` naming the transfer at once, never a hang. ``half`` is the one place every METP ring
chooses the half of a double buffer (tests swap it per site).

``RingOptions.wait_before_use = False`` (tests only) moves every wait to the end of
the ring (`drain`) and fills every receive buffer with NaN before its receive is posted, to show
that the double buffer is then read before its block arrived.

Each transfer is a span on its stream (``tp_p2p`` for the rings, ``tp_bcast`` for broadcasts and
reduces: `memo_sim.timeline.TP_RING_STREAMS`, the simulator's names) from its issue to the return
of its wait. On CUDA both ends of that span are events on the side stream the transfer runs on:
the start after the side stream has waited for the compute stream, the end after the side stream
has waited for the transfer (inside the side stream's context), before the compute stream is made
to wait for the side stream (outside it). The wait itself is a ``stall`` span on the compute stream (``wait_tp_p2p`` /
``wait_tp_bcast``): the time the compute stream sat idle for the ring, which
`exposed_ring_seconds` sums into the measured counterpart of the simulator's ``exposed_p2p_s``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from memo_exec.distributed.p2p import Transfer, post, ring_shift
from memo_exec.happens_before import Region, transfer_guard
from memo_exec.wait_switch import wait_primitive
from memo_sim.timeline import TP_RING_STREAMS

P2P_STREAM, BCAST_STREAM = TP_RING_STREAMS  # METP's ring send/recv; its weight broadcasts and reduces
# the compute stream's wait on a transfer: a ``stall`` span (phase "stall", like the executor's
# wait_offload / wait_prefetch), the measured exposed time of the ring
STALL_OP = {P2P_STREAM: "wait_tp_p2p", BCAST_STREAM: "wait_tp_bcast"}


def exposed_ring_seconds(events) -> dict[str, float]:
    """Measured exposed time per METP stream: the summed stall spans of the compute stream's waits
    (``events``: `memo_sim.timeline.TimelineEvent` or anything with ``op`` and ``duration``)."""
    out = {s: 0.0 for s in TP_RING_STREAMS}
    for e in events:
        for stream, op in STALL_OP.items():
            if e.op == op:
                out[stream] += e.duration
    return out


class _NullTimer:
    @contextlib.contextmanager
    def span(self, op, layer, phase, stream="compute", nbytes=0, flops=0):
        yield


@dataclass
class RingOptions:
    """How a ring runs: its process group, measurement and the test hooks."""

    group: Any = None  # the TP process group (None: the default group)
    timer: Any = field(default_factory=_NullTimer)  # span(op, layer, phase, stream, nbytes, flops)
    layer: int | None = None
    delay_s: float = 0.0  # tests: the sends of every ring transfer start this late (p2p's delay hook)
    wait_before_use: bool = True  # tests only: False defers every wait to the end of the ring

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)


_SIDE: dict = {}


def _side_stream(device: torch.device):
    """One side stream per device for every METP transfer (issue order = ring order)."""
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SIDE:
        _SIDE[key] = torch.cuda.Stream(device=key)
    return _SIDE[key]


class _CudaSide:
    """The side stream a CUDA lane issues its transfers on."""

    def __init__(self, device: torch.device) -> None:
        self.stream = _side_stream(device)

    @contextlib.contextmanager
    def issue(self):
        """The side stream first waits for everything the compute stream issued, then runs the block."""
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield

    def on(self):
        return torch.cuda.stream(self.stream)

    def join(self) -> None:
        """The compute stream waits for the side stream (called outside the side stream's context)."""
        torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)


class _Collective:
    """A ``torch.distributed`` async work handle with p2p.Transfer's ``wait`` (and its guard token)."""

    def __init__(self, work, name: str, guard=None, token: int = 0) -> None:
        self.work, self.name, self.guard, self.token = work, name, guard, token

    @wait_primitive
    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None
        if self.guard is not None:
            self.guard.waited(self.token)


@dataclass
class Pending:
    handle: Any  # Transfer or _Collective
    span: Any  # the open span context (closed when the wait returns)
    stream: str = P2P_STREAM
    waited: bool = False


class Lane:
    """Issues and waits one ring's transfers (see the module docs)."""

    def __init__(self, opts: RingOptions, device: torch.device, phase: str) -> None:
        self.opts, self.phase = opts, phase
        self.cuda = torch.device(device).type == "cuda"
        self.side = _CudaSide(torch.device(device)) if self.cuda else None
        self.deferred: list[Pending] = []
        self.guard = transfer_guard()  # the transfers in flight and the uses of their buffers (None: off)

    @staticmethod
    def half(site: str, t: int) -> int:
        """Which half of a double buffer ``site`` uses at ring step ``t``: the one place every METP
        ring chooses its slots (tests swap it per site)."""
        return t % 2

    def use(self, what: str, reads=(), writes=()) -> None:
        """Tell the guard that ``what`` reads / writes these ``(tensor, content)`` buffers now."""
        if self.guard is None:
            return
        self.guard.access(what, [Region.of(t, f"a ring buffer ({c})", c) for t, c in reads],
                          [Region.of(t, f"a ring buffer ({c})", c) for t, c in writes])

    def mark(self) -> int:
        return 0 if self.guard is None else self.guard.mark()

    def finish(self, what: str, since: int = 0) -> None:
        """End of a ring: no transfer it posted (after ``since``, `mark`) may still be in flight."""
        if self.guard is not None:
            self.guard.finish(what, since)

    def _post_collective(self, name: str, t: torch.Tensor, content: str | None, work) -> _Collective:
        """An in-place collective owns its buffer until its wait, on every rank (`happens_before`)."""
        if self.guard is None:
            return _Collective(work, name)
        token = self.guard.posted(name, (), [Region.of(t, f"the buffer of {name}", content)])
        return _Collective(work, name, self.guard, token)

    @contextlib.contextmanager
    def _issue_ctx(self):
        if self.side is None:
            yield
            return
        with self.side.issue():
            yield

    def _open(self, name: str, stream: str, nbytes: int):
        cm = self.opts.timer.span(name, self.opts.layer, self.phase, stream, nbytes, 0.0)
        cm.__enter__()
        return cm

    def _poison(self, recv: torch.Tensor) -> None:
        """Test hook: with the waits moved after the use, a block read before it arrived reads NaN
        (not whatever the allocator left there, which may be a stale copy of the right block)."""
        if not self.opts.wait_before_use and recv.is_floating_point():
            recv.fill_(float("nan"))

    def ring(self, name: str, send: torch.Tensor, recv: torch.Tensor, received: str | None = None) -> Pending:
        """Send ``send`` to the next rank, receive the previous rank's block (``received`` names
        what it holds, for the guard) into ``recv``."""
        self._poison(recv)
        with self._issue_ctx():
            span = self._open(name, P2P_STREAM, send.numel() * send.element_size())
            tr: Transfer = ring_shift(send, recv, self.opts.group, self.opts.delay_s, self.guard, name, received)
        return Pending(tr, span)

    def ring_many(self, items: list[tuple]) -> list[Pending]:
        """Several ring shifts issued as one exchange (one `post`: the sends leave in list order, also
        when p2p's test delay sends them from a worker thread, so two concurrent transfers of equal
        size can never land in each other's buffer). Waiting on any of them completes all."""
        items = [tuple(it) + (None,) * (4 - len(it)) for it in items if it is not None]
        if not items:
            return []
        if len(items) == 1:
            return [self.ring(*items[0])]
        size, rank = self.opts.size, self.opts.rank
        for _, _, r, _ in items:
            self._poison(r)
        with self._issue_ctx():
            spans = [self._open(name, P2P_STREAM, s.numel() * s.element_size()) for name, s, _, _ in items]
            tr: Transfer = post([((rank + 1) % size, s) for _, s, _, _ in items],
                                [((rank - 1) % size, r) for _, _, r, _ in items], self.opts.group, self.opts.delay_s,
                                self.guard, " + ".join(n for n, _, _, _ in items), [c for _, _, _, c in items])
        return [Pending(tr, sp) for sp in spans]

    def broadcast(self, name: str, t: torch.Tensor, src: int, content: str | None = None) -> Pending:
        """Broadcast ``t`` (holding ``content``) from group rank ``src`` (a weight block of the MHA's
        outer loop); the root checks it sends what it claims."""
        g = self.opts.group
        src_g = src if g is None else dist.get_global_rank(g, src)
        if src == self.opts.rank:
            self.use(name, reads=[(t, content)])
        with self._issue_ctx():
            span = self._open(name, BCAST_STREAM, t.numel() * t.element_size())
            work = dist.broadcast(t, src_g, group=g, async_op=True) if self.opts.size > 1 else None
        return Pending(self._post_collective(name, t, content, work), span, BCAST_STREAM)

    def reduce(self, name: str, t: torch.Tensor, dst: int, content: str | None = None,
               result: str | None = None) -> Pending:
        """Sum ``t`` (holding ``content``) over the group into group rank ``dst`` (a weight-gradient
        block), where it then holds ``result``."""
        g = self.opts.group
        dst_g = dst if g is None else dist.get_global_rank(g, dst)
        self.use(name, reads=[(t, content)])
        with self._issue_ctx():
            span = self._open(name, BCAST_STREAM, t.numel() * t.element_size())
            work = dist.reduce(t, dst_g, op=dist.ReduceOp.SUM, group=g, async_op=True) if self.opts.size > 1 else None
        return Pending(self._post_collective(name, t, result if dst == self.opts.rank else None, work), span,
                       BCAST_STREAM)

    def _finish(self, p: Pending) -> None:
        if p.waited:
            return
        with self.opts.timer.span(STALL_OP[p.stream], self.opts.layer, "stall", "compute"):
            with self.side.on() if self.side is not None else contextlib.nullcontext():
                p.handle.wait()  # CUDA: the side stream waits for the transfer
                p.span.__exit__(None, None, None)  # its end event on the stream it ran on
            if self.side is not None:
                self.side.join()
        p.waited = True

    @wait_primitive
    def wait(self, p: Pending | None) -> None:
        """Before the received buffer is read (or the sent one overwritten)."""
        if p is None:
            return
        if self.opts.wait_before_use:
            self._finish(p)
        else:
            self.deferred.append(p)

    def drain(self) -> None:
        """End of a ring: every transfer has completed (the deferred ones of the test hook too)."""
        for p in self.deferred:
            self._finish(p)
        self.deferred = []
