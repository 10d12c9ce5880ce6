"""One GPU's allocator request stream over a training iteration (`IterationStream`): the request
kinds, the static requests made once and the iteration's, checked to balance. Built from a model,
layout and policy by `memo_sim.memplan.iteration_requests`; replayed through the caching-allocator
model by `memo_sim.memplan.iteration_replay`."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from memo_sim.errors import MemoError
from memo_sim.request_trace import Buffer, RequestTrace

MALLOC, FREE, FREE_STREAM = 1, 0, 2  # FREE_STREAM: the buffer was used by a collective (record_stream)
ROLES = ("input", "attn", "other", "lse")

# One request: (MALLOC, FREE or FREE_STREAM, buffer id, bytes; 0 for a free).
Request = tuple[int, str, int]


@dataclass(frozen=True)
class IterationStream:
    """The requests of one GPU: ``static`` once before the first iteration, ``iteration`` per
    iteration (it frees everything it allocates). ``phase_of[j]`` numbers the phase request j
    belongs to, in order (``embedding``, ``L<i>.fwd`` for each layer, ``classifier``,
    ``L<i>.bwd`` (recompute and backward) from the last layer down, ``embedding.bwd``: the names
    in ``phase_names``); empty means one phase."""

    static: tuple[Request, ...]
    iteration: tuple[Request, ...]
    phase_of: tuple[int, ...] = ()
    name: str = ""
    phase_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.phase_of and (len(self.phase_of) != len(self.iteration)
                              or sorted(self.phase_of) != list(self.phase_of)):  # non-decreasing
            raise MemoError("IterationStream.phase_of must give each request a phase, in non-decreasing order")
        if self.phase_names and len(self.phase_names) != self.phases:
            raise MemoError("IterationStream.phase_names must name every phase")
        _check_balanced(self)

    def phase_name(self, k: int) -> str:
        return self.phase_names[k] if self.phase_names else f"phase{k}"

    @property
    def static_bytes(self) -> int:
        return sum(r[2] for r in self.static)

    @property
    def phases(self) -> int:
        return (self.phase_of[-1] + 1) if self.phase_of else 1

    def max_live_bytes(self) -> int:
        """Largest sum of live request sizes (static included): the lower bound on any allocator."""
        return self.static_bytes + _iteration_facts(self.iteration).max_live

    @property
    def mallocs(self) -> int:
        """Requests that allocate, per iteration."""
        return _iteration_facts(self.iteration).mallocs

    def to_trace(self) -> RequestTrace:
        """One iteration as a `RequestTrace` (step j = request j; the static buffers live through
        it), for the DSA tools and plots."""
        n = len(self.iteration)
        bufs = [Buffer(bid, size, 0, n + 1, kind="other", name=bid) for _k, bid, size in self.static]
        open_: dict[str, tuple[int, int]] = {}
        for j, (kind, bid, size) in enumerate(self.iteration):
            if kind == MALLOC:
                open_[bid] = (j, size)
            else:
                lo, sz = open_.pop(bid)
                bufs.append(Buffer(f"it.{bid}", sz, lo, j, name=bid))
        return RequestTrace(bufs, name=self.name)


def _check_balanced(stream: IterationStream) -> None:
    static: set[str] = set()
    for kind, bid, size in stream.static:
        if kind != MALLOC or not isinstance(size, int) or size <= 0:
            raise MemoError(f"iteration stream: static request {bid!r} must be a malloc of a positive size")
        static.add(bid)
    clash = _iteration_facts(stream.iteration).allocated & static
    if clash:  # allocated while allocated, or freed by the iteration
        raise MemoError(f"iteration stream: {sorted(clash)[0]!r} is a static buffer: the iteration cannot "
                        f"allocate or free it")


@dataclass(frozen=True)
class _IterationFacts:
    allocated: frozenset  # every buffer id the iteration allocates
    max_live: int  # the most bytes its requests hold at once
    mallocs: int


_FACTS: OrderedDict[int, tuple[tuple, _IterationFacts]] = OrderedDict()


def _iteration_facts(iteration: tuple[Request, ...]) -> _IterationFacts:
    """Check that an iteration's requests balance (every buffer allocated once at a time with a
    positive integer size, freed only while allocated, nothing left at the end) and return what
    the stream reads of them. Remembered by identity (the entry keeps the tuple alive): streams
    built from one recipe share their iteration's tuple (`_iteration_requests`)."""
    hit = _FACTS.get(id(iteration))
    if hit is not None and hit[0] is iteration:
        return hit[1]
    live: dict[str, int] = {}
    allocated: set[str] = set()
    cur = peak = mallocs = 0
    for kind, bid, size in iteration:
        if kind == MALLOC:
            if bid in live:
                raise MemoError(f"iteration stream: {bid!r} allocated while allocated")
            if not isinstance(size, int) or size <= 0:
                raise MemoError(f"iteration stream: {bid!r} needs a positive integer size, got {size!r}")
            live[bid] = size
            allocated.add(bid)
            mallocs += 1
            cur += size
            if cur > peak:
                peak = cur
        elif kind == FREE or kind == FREE_STREAM:
            if bid not in live:
                raise MemoError(f"iteration stream: {bid!r} freed while not allocated in the iteration")
            cur -= live.pop(bid)
        else:
            raise MemoError(f"iteration stream: unknown request kind {kind!r}")
    if live:
        raise MemoError(f"iteration stream: {sorted(live)[:3]} still allocated at the end of the iteration")
    facts = _IterationFacts(frozenset(allocated), peak, mallocs)
    _FACTS[id(iteration)] = (iteration, facts)
    if len(_FACTS) > 256:
        _FACTS.popitem(last=False)
    return facts
