"""Micro-batch pipelines folded: a 1F1B or interleaved steady state simulated a few windows long.

In the steady state of a micro-batch pipeline (`memo_sim.engine.schedules.microbatch`) every rank
runs the same steps for micro-batch after micro-batch: 1F1B one forward and one backward per
micro-batch, interleaved 1F1B one group of ``pp`` micro-batches through every chunk. So the
runner lays out ``micro_batches_short`` micro-batches instead of the iteration's m, runs that
short schedule once with the engine's event log and no memory limit, and
`memo_sim.engine.periodic.unfold_window` (the layer fold's machinery: one mechanism) checks that
its windows repeat (each window between the first ops of rank 0's forwards of consecutive
groups: the same events in the same order on every rank, one period later, micro-batch index
``step`` up, memory shifted by the same bytes) and unfolds it, inserting ``copies`` windows at
the cut. A run that fails the check runs whole.

`plan_window_fold` checks what the run cannot: that the whole iteration's per-rank step orders
are the short ones with the copies inserted at the cut (`order_with_copies`), and that every
unit's place in the rounding-buffer rule and the policy's recompute choice (which look at the
rank's unit count) is the short schedule's, copied likewise.

Ops of micro-batch k are named ``<op>@m<k>`` and their tensors ``mb<k>.<...>`` (`mb_name`,
`mb_tensor`: the one place those names are made); `MicroBatchLabels` reads the index back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from memo_sim.engine.graph import Op
from memo_sim.engine.periodic import CHECKED, MIN_COPIES, Labels
from memo_sim.policy.rounding_buffers import is_offloaded, output_write_waits_for

MB_TAG = "@m"
SETTLE = 1  # windows after rank 0's warm-up before the first checked one
TAIL = 1  # windows after the last checked one, before the short schedule's cool-down


def mb_name(base: str, mb: int) -> str:
    """The name of op ``base`` of micro-batch ``mb``."""
    return f"{base}{MB_TAG}{mb}"


def mb_tensor(mb: int, rest: str) -> str:
    """The name of a tensor of micro-batch ``mb``."""
    return f"mb{mb}.{rest}"


@lru_cache(maxsize=1 << 16)
def split_mb(name: str) -> tuple[str, int | None]:
    """(base name, micro-batch) of an op's name; None for an op of no one micro-batch."""
    base, sep, k = name.rpartition(MB_TAG)
    if sep and k.isdigit():
        return base, int(k)
    return name, None


class MicroBatchLabels(Labels):
    """The micro-batch fold's index: the micro-batch in an op's name (its layer stays)."""

    def index(self, op: Op) -> int | None:
        return split_mb(op.name)[1]

    def same(self, a: Op, b: Op, step: int) -> bool:
        if a.layer != b.layer:
            return False
        (na, ka), (nb, kb) = split_mb(a.name), split_mb(b.name)
        return na == nb and (ka is None) == (kb is None) and (ka is None or kb - ka == step)

    def name(self, op: Op, d: int) -> str:
        base, k = split_mb(op.name)
        return op.name if k is None or d == 0 else mb_name(base, k + d)

    def layer(self, op: Op, d: int) -> int | None:
        return op.layer

    def tensor(self, tensor: str, op: Op | None, d: int) -> str:
        head, dot, rest = tensor.partition(".")
        if d == 0 or not dot or not head.startswith("mb") or not head[2:].isdigit():
            return tensor
        return mb_tensor(int(head[2:]) + d, rest)


MICRO_BATCHES = MicroBatchLabels()


@dataclass(frozen=True)
class WindowFold:
    """``short`` micro-batches laid out for the iteration's ``whole``: windows of ``step``
    micro-batches; the one before window ``cut`` is copied ``copies`` times."""

    whole: int
    short: int
    step: int
    cut: int

    @property
    def copies(self) -> int:
        return (self.whole - self.short) // self.step

    def anchor_windows(self) -> range:
        """The windows whose first ops are the check's anchors (`periodic.unfold_window`)."""
        return range(self.cut - 1 - CHECKED, self.cut + 3)


def _shift(steps, d: int) -> list:
    return [replace(st, mb=st.mb + d) for st in steps]


def _first_forward(steps, mb: int) -> int | None:
    return next((i for i, st in enumerate(steps) if st.kind == "F" and st.mb == mb and st.chunk == 0), None)


def order_with_copies(short: list, fold: WindowFold) -> tuple[list, int] | None:
    """A rank's short order with ``fold.copies`` copies of its window before the cut inserted
    there (every step after the cut ``copies * step`` micro-batches on), and the cut's position
    in the short order; None where the rank has no such window. The cut on each rank is its
    first forward of micro-batch ``cut * step`` through chunk 0."""
    a = _first_forward(short, (fold.cut - 1) * fold.step)
    b = _first_forward(short, fold.cut * fold.step)
    if a is None or b is None or b <= a:
        return None
    out = list(short[:b])
    for k in range(1, fold.copies + 1):
        out += _shift(short[a:b], k * fold.step)
    return out + _shift(short[b:], fold.copies * fold.step), b


def _unit_signatures(policy, n_units: int, slot: bool) -> list[tuple]:
    """What the builder does differently from one forward unit of a rank to the next, relative
    to the unit: offloaded, which offload its output write waits for, recomputed."""
    out = []
    for u in range(n_units):
        w = output_write_waits_for(u, n_units) if slot else None
        out.append((slot and is_offloaded(u, n_units), None if w is None else u - w,
                    policy.recomputes_layer(u, n_units)))
    return out


def plan_window_fold(order, pp: int, micro_batches: int, vpp: int, layers_per_chunk: int, policy,
                     slot: bool) -> WindowFold | None:
    """The fold of a micro-batch pipeline's steady state, or None where there is none to make:
    the whole orders and unit rules must be the short ones with copies of one window inserted
    (see the module docs), and the short run at most half the whole one. Windows of 1
    micro-batch (1F1B), else of ``pp`` (interleaved)."""
    m = micro_batches
    rank0 = order(pp, m, vpp, 0)
    warmup = next((i for i, st in enumerate(rank0) if st.kind == "B"), len(rank0))
    for step in dict.fromkeys((1, pp)):
        per_window = step * vpp  # rank 0's forward steps per window
        first = -(-warmup // per_window) + SETTLE
        cut = first + CHECKED + 1
        short = (cut + 3 + TAIL) * step
        # a short run that does not repeat is run whole after it: worth trying where it saves at
        # least half the micro-batches (and MIN_COPIES windows)
        if m % step or (m - short) // step < MIN_COPIES or 2 * short > m:
            continue
        fold = WindowFold(m, short, step, cut)
        try:
            fits = _orders_fold(order, pp, vpp, fold)
        except ValueError:  # the schedule has no order of ``short`` micro-batches
            continue
        if fits and _units_fold(order, pp, vpp, layers_per_chunk, policy, slot, fold):
            return fold
    return None


def _orders_fold(order, pp: int, vpp: int, fold: WindowFold) -> bool:
    for s in range(pp):
        got = order_with_copies(order(pp, fold.short, vpp, s), fold)
        if got is None or got[0] != order(pp, fold.whole, vpp, s):
            return False
    return True


def _units_fold(order, pp: int, vpp: int, lc: int, policy, slot: bool, fold: WindowFold) -> bool:
    short = _unit_signatures(policy, fold.short * vpp * lc, slot)
    whole = _unit_signatures(policy, fold.whole * vpp * lc, slot)
    for s in range(pp):
        steps = order(pp, fold.short, vpp, s)
        got = order_with_copies(steps, fold)
        if got is None:
            return False
        at = sum(1 for st in steps[:got[1]] if st.kind == "F") * lc  # forward units before the cut
        width = fold.step * vpp * lc  # a window's forward units
        if at < width or whole != short[:at] + short[at - width:at] * fold.copies + short[at:]:
            return False
    return True
