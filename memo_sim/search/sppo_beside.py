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

The search's bounding pass is shared: right after the fork this process prices its part of the
points and hands it to the child (`memo_sim.search.sppo.shared_bounds`), then goes on with the
rest of the analytic tier while the child finishes the search and the simulations, the longer
path of the two wherever SPPO's side of the verdict is simulated. Where this process would then
wait for a simulation the child makes, it first does the work it was given for that (`idle`: the
what-if builds the best plan's memory plan, `memo_sim.search.plan_build.prebuild_plan`).

Where the platform cannot fork, or the child dies, the search runs here and tier 2 simulates the
candidates itself.
"""

from __future__ import annotations

from typing import Callable, Sequence

from memo_sim.forked import FORKS, ForkedStream, Handoff
from memo_sim.search.sppo.shared_bounds import ChildShare, help_child


class SppoBeside:
    """``search(bounds)`` (returning ``(search, candidates, rejected layouts, why none)``;
    ``bounds``: `memo_sim.search.sppo.exhaustive.exhaustive_search`'s, None for the plain pass) in a
    forked child, its bounding pass shared with this process, then ``simulate(c)`` of each
    candidate ``choose(candidates)`` picks; `result` and `has` / `take` (what
    `memo_sim.search.whatif.simulate_candidates` reads as ``ahead``) here. ``shared``: the objects
    the candidates refer to that this process holds (model, profile)."""

    def __init__(self, search: Callable[..., tuple], choose: Callable[[list], list],
                 simulate: Callable[[object], dict], shared: Sequence = ()):
        self._search = search
        self._result: tuple | None = None
        self._ids: dict[int, int] = {}  # id of a chosen candidate (this process's) -> its index
        self._summaries: dict[int, dict] = {}
        self._keep: list = []  # the chosen candidates: their ids stay theirs while this lives
        self._stream = None
        # work for this process while `take` would wait for the child: called once, where set
        # (`memo_sim.search.whatif.rank`'s ``while_waiting``); what it raises is dropped (the same
        # work done later raises it where it matters)
        self.idle: Callable[[], object] | None = None

        handoff = Handoff() if FORKS else None

        def run():
            handoff.child_side()
            out = search(ChildShare(handoff))
            cands = out[1]
            chosen = choose(cands)
            picked = [next(i for i, c in enumerate(cands) if c is x) for x in chosen]
            yield out, picked
            for i in picked:
                yield i, simulate(cands[i])

        if FORKS:
            try:
                self._stream = ForkedStream(run, shared)
            except BaseException:
                handoff.close()
                raise
            handoff.parent_side()
            try:
                help_child(search, handoff)
            except BaseException:  # interrupted here: the child goes too
                self.close()
                raise

    def result(self) -> tuple:
        """The search's ``(search, candidates, rejected layouts, why none)``, waiting for the child;
        run here where there is no child or it died."""
        if self._result is None:
            got = self._stream.next() if self._stream is not None else None
            if got is None:
                self.close()
                self._result = self._search(None)
            else:
                self._result, picked = got
                cands = self._result[1]
                self._keep = [cands[i] for i in picked]
                self._ids = {id(cands[i]): i for i in picked}
        return self._result

    def has(self, candidate) -> bool:
        return id(candidate) in self._ids

    def would_wait(self) -> bool:
        """Whether taking the child's next summary would wait for it now."""
        return self._stream is not None and self._stream.would_wait()

    def take(self, candidate) -> dict | None:
        """The summary of ``candidate`` (one that `has`), waiting for the child where it is not
        made yet; None where the child died first (the caller simulates it)."""
        i = self._ids[id(candidate)]
        while i not in self._summaries and self._stream is not None:
            if self.idle is not None and self._stream.would_wait():
                idle, self.idle = self.idle, None
                try:
                    idle()
                except Exception:  # noqa: BLE001  (module docs: done again later, where it raises)
                    pass
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
