"""Tier 2's summaries of a few candidates known before the analytic tier ends, simulated in
forked processes while this one goes on pricing.

A what-if with SPPO simulates some SPPO candidates whatever the proved bound says
(`memo_sim.search.whatif.rank`: the SPPO vs MEMO verdict's SPPO side in the bound search; with
``--simulate-top all`` or N also SPPO's heuristic choice and its best few points); they are known
once SPPO's search is done, which `candidates_for` runs before it prices anything
else, and each takes seconds to simulate. `SimulatedAhead` simulates them in up to ``children`` children forked
then (`os.fork`, a pipe back from each, no thread), the candidates shared out longest first by
their ``weights`` (what each is expected to cost: the one that `whatif` gives is SPPO's unit
count), so that two long ones run side by side rather than one after the other. Tier 2
(`memo_sim.search.whatif.simulate_candidates`) takes a summary from there where it asks for that
candidate, instead of simulating it again: the same deterministic simulation of the same
objects, so the same summary (all but its host seconds), in the same batch and order as without
it. Where the platform cannot fork, nothing is simulated ahead.
"""

from __future__ import annotations

from typing import Callable, Sequence

from memo_sim.forked import FORKS, ForkedChild


def share_out(weights: Sequence[float], children: int) -> list[list[int]]:
    """The indices of ``weights`` shared out among at most ``children`` lists, longest first to
    the least loaded (ties to the lowest index); empty lists left out, each list in index order."""
    shares: list[list[int]] = [[] for _ in range(max(1, min(children, len(weights))))]
    load = [0.0] * len(shares)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        k = min(range(len(shares)), key=lambda k: (load[k], k))
        shares[k].append(i)
        load[k] += weights[i]
    return [sorted(s) for s in shares if s]


class SimulatedAhead:
    """``fn(args)`` of each of ``work`` (one per candidate of ``candidates``), in up to
    ``children`` forked children, shared out by ``weights`` (default: all alike; `share_out`)."""

    def __init__(self, candidates: list, work: list[tuple], fn: Callable[[tuple], dict], *, children: int = 1,
                 weights: Sequence[float] | None = None):
        if len(work) != len(candidates) or (weights is not None and len(weights) != len(candidates)):
            raise ValueError("SimulatedAhead: one work item and one weight per candidate")
        self._ids = {id(c): i for i, c in enumerate(candidates)}
        self._keep = list(candidates)  # their ids stay theirs while this lives
        self._children: list[ForkedChild] = []
        self._of: dict[int, ForkedChild] = {}  # work item -> the child simulating it
        if not candidates or not FORKS:
            self._ids = {}
            return
        try:
            for items in share_out(list(weights) if weights is not None else [1.0] * len(work), children):
                child = ForkedChild(items, work, fn)
                self._children.append(child)
                for i in items:
                    self._of[i] = child
        except BaseException:
            self.close()
            raise

    def has(self, candidate) -> bool:
        return id(candidate) in self._ids

    def take(self, candidate) -> dict | None:
        """The summary of ``candidate`` (one that `has`), waiting for its child where it is not
        done; None where the child died without one (the caller simulates it)."""
        i = self._ids[id(candidate)]
        return self._of[i].result(i)

    def close(self) -> None:
        """End the children whose summaries were never read."""
        for child in self._children:
            child.close()
