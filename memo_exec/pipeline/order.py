"""The order in which one pipeline rank runs its forwards and backwards: Megatron-LM's 1F1B and
interleaved 1F1B, as pure functions (no torch), plus what follows from an order: the activation
slots a rank needs and the order in which its neighbours' messages arrive.

An action is ``Action(kind, chunk, mb)``: ``kind`` "fwd" or "bwd", ``chunk`` the rank's model
chunk (virtual stage ``chunk * pp + rank``; always 0 without interleaving), ``mb`` the
micro-batch. Orders follow Megatron-LM's ``schedules.py``:

- 1F1B (`forward_backward_pipelining_without_interleaving`): rank r runs
  ``w = min(pp - r - 1, m)`` warm-up forwards, then ``m - w`` times one forward and one backward,
  then the ``w`` remaining backwards.
- interleaved (`forward_backward_pipelining_with_interleaving`): the rank's ``m * v`` virtual
  micro-batches k; the forward of k runs chunk ``(k mod (pp v)) // pp`` on micro-batch
  ``(k // (pp v)) pp + k mod pp``, the backward of k the same micro-batch on chunk
  ``v - 1 - (k mod (pp v)) // pp``; warm-up ``(pp - r - 1) 2 + (v - 1) pp`` forwards, capped at
  ``m v`` (also where m = pp, as Megatron-LM since 4295be1a6c and torch's ScheduleInterleaved1F1B); then one
  forward and one backward alternately; then the remaining backwards.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    kind: str  # fwd | bwd
    chunk: int
    mb: int

    def tag(self) -> str:
        return f"c{self.chunk}.mb{self.mb}"


def one_f_one_b(pp: int, m: int, rank: int) -> list[Action]:
    w = min(pp - rank - 1, m)
    out = [Action("fwd", 0, k) for k in range(w)]
    for i in range(m - w):
        out += [Action("fwd", 0, w + i), Action("bwd", 0, i)]
    out += [Action("bwd", 0, k) for k in range(m - w, m)]
    return out


def _chunk(k: int, pp: int, v: int, forward: bool) -> int:
    c = (k % (pp * v)) // pp
    return c if forward else v - 1 - c


def _mb(k: int, pp: int, v: int) -> int:
    return (k // (pp * v)) * pp + k % pp


def interleaved(pp: int, v: int, m: int, rank: int) -> list[Action]:
    if m % pp:
        raise ValueError(f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple of pp ({pp})")
    total = m * v
    w = min((pp - rank - 1) * 2 + (v - 1) * pp, total)  # the simulator's rule (`memo_sim.engine.schedules.interleaved`)
    fwd = lambda k: Action("fwd", _chunk(k, pp, v, True), _mb(k, pp, v))  # noqa: E731
    bwd = lambda k: Action("bwd", _chunk(k, pp, v, False), _mb(k, pp, v))  # noqa: E731
    out = [fwd(k) for k in range(w)]
    for k in range(total - w):
        out += [fwd(k + w), bwd(k)]
    out += [bwd(k) for k in range(total - w, total)]
    return out


def stage_order(schedule: str, pp: int, vpp: int, m: int, rank: int) -> list[Action]:
    if schedule == "1f1b":
        return one_f_one_b(pp, m, rank)
    if schedule == "interleaved_1f1b":
        return interleaved(pp, vpp, m, rank)
    raise ValueError(f"no micro-batch order for schedule {schedule!r}")


def virtual_stage(chunk: int, rank: int, pp: int) -> int:
    return chunk * pp + rank


def slots(order: list[Action]) -> tuple[dict[tuple[int, int], int], int]:
    """Activation slot of every (chunk, mb) of one rank's order and the number of slots: a forward
    takes the lowest free slot, its backward frees it. A slot is one set of the policy's storage
    for one chunk's layers (saved tensors, rounding buffers, host slots), so two (chunk, mb)
    share a slot only when the first one's backward ran before the second one's forward."""
    free: list[int] = []
    n = 0
    held: dict[tuple[int, int], int] = {}
    out: dict[tuple[int, int], int] = {}
    for a in order:
        key = (a.chunk, a.mb)
        if a.kind == "fwd":
            if free:
                s = min(free)
                free.remove(s)
            else:
                s, n = n, n + 1
            held[key] = out[key] = s
        else:
            free.append(held.pop(key))
    if held:
        raise ValueError(f"forwards without a backward: {sorted(held)}")
    return out, n


def in_flight_peak(order: list[Action]) -> int:
    """The most (chunk, mb) whose forward ran and backward did not (= `slots`' count)."""
    return slots(order)[1]


def messages_from(schedule: str, pp: int, vpp: int, m: int, rank: int) -> dict[int, list[tuple[str, int, int]]]:
    """The messages this rank receives in one step, per sending rank in the order that rank sends
    them: ``("fwd", chunk, mb)`` for the input activation of this rank's forward of (chunk, mb)
    (sent by virtual stage ``vs - 1`` after its forward), ``("bwd", chunk, mb)`` for the output
    gradient of this rank's backward (sent by ``vs + 1`` after its backward)."""
    v = vpp if schedule == "interleaved_1f1b" else 1
    last = pp * v - 1
    out: dict[int, list[tuple[str, int, int]]] = {}
    for src in sorted({(rank - 1) % pp, (rank + 1) % pp} - {rank}):
        msgs = []
        for a in stage_order(schedule, pp, vpp, m, src):
            vs = virtual_stage(a.chunk, src, pp)
            if a.kind == "fwd" and vs < last and (vs + 1) % pp == rank:
                msgs.append(("fwd", (vs + 1) // pp, a.mb))
            elif a.kind == "bwd" and vs > 0 and (vs - 1) % pp == rank:
                msgs.append(("bwd", (vs - 1) // pp, a.mb))
        out[src] = msgs
    return out
