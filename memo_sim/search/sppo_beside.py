"""SPPO's search run beside the rest of the analytic tier, in a forked child, and the SPPO
candidates tier 2 simulates whatever the bound says simulated there as soon as it ends.

SPPO's branch and bound (`memo_sim.search.sppo.candidates.sppo_candidates`) shares nothing with
the pricing of the single-stage and micro-batch pipeline candidates but the model and the
profile, and the SPPO candidates tier 2 always simulates (the SPPO vs MEMO verdict's SPPO side; with
``--simulate-top all`` or N also the heuristic's choice and the best few) are known as soon as it
ends. On a machine with a second core `SppoBeside` runs the search, then those simulations, in one
forked child (`memo_sim.forked.ForkedStream`) while this process prices the rest: the search's
result comes back first (the candidates, with this process's own model and profile objects in
them), then one summary per simulated candidate, each as it is made. The what-if lists the
candidates where it listed them when the search ran here, in the same order, so its answer does
not change (tests/test_sppo_beside.py); only the wall time does.

Where the platform cannot fork, or the child dies, the search runs here and tier 2 simulates the
candidates itself.
"""

from __future__ import annotations

from typing import Callable, Sequence

from memo_sim.forked import FORKS, ForkedStream


class SppoBeside:
    """``search()`` (returning ``(search, candidates, rejected layouts, why none)``) in a forked
    child, then ``simulate(c)`` of each candidate ``choose(candidates)`` picks; `result` and
    `has` / `take` (what `memo_sim.search.whatif.simulate_candidates` reads as ``ahead``) here.
    ``shared``: the objects the candidates refer to that this process holds (model, profile)."""

    def __init__(self, search: Callable[[], tuple], choose: Callable[[list], list],
                 simulate: Callable[[object], dict], shared: Sequence = ()):
        self._search = search
        self._result: tuple | None = None
        self._ids: dict[int, int] = {}  # id of a chosen candidate (this process's) -> its index
        self._summaries: dict[int, dict] = {}
        self._keep: list = []  # the chosen candidates: their ids stay theirs while this lives
        self._stream = None

        def run():
            out = search()
            cands = out[1]
            chosen = choose(cands)
            picked = [next(i for i, c in enumerate(cands) if c is x) for x in chosen]
            yield out, picked
            for i in picked:
                yield i, simulate(cands[i])

        if FORKS:
            self._stream = ForkedStream(run, shared)

    def result(self) -> tuple:
        """The search's ``(search, candidates, rejected layouts, why none)``, waiting for the child;
        run here where there is no child or it died."""
        if self._result is None:
            got = self._stream.next() if self._stream is not None else None
            if got is None:
                self.close()
                self._result = self._search()
            else:
                self._result, picked = got
                cands = self._result[1]
                self._keep = [cands[i] for i in picked]
                self._ids = {id(cands[i]): i for i in picked}
        return self._result

    def has(self, candidate) -> bool:
        return id(candidate) in self._ids

    def take(self, candidate) -> dict | None:
        """The summary of ``candidate`` (one that `has`), waiting for the child where it is not
        made yet; None where the child died first (the caller simulates it)."""
        i = self._ids[id(candidate)]
        while i not in self._summaries and self._stream is not None:
            got = self._stream.next()
            if got is None:
                self.close()
                break
            self._summaries[got[0]] = got[1]
        return self._summaries.get(i)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


__all__ = ["SppoBeside"]
